#!/usr/bin/env bash
# Device side of scripts/build_ab_objs.sh (one call, repo root, `.carry` carried): link one
# library per object in .carry/nl (full.o -> .carry/full.so with every kernel; mma_NAME.o ->
# .carry/NAME.so, fp16 + E4M4 only; base with gemv_base.o when there is one), run the A/B of
# scripts/lib_ab.sh over the variants (ROUNDS, BENCH_ARGS as there; NAME@MODE runs library
# NAME under KBIT_PDL=MODE), then tests on full.so: $TESTS (default tests/test_linear.py)
# under the first KBIT_PDL mode of $PDL_MODES (default 1), $PDL_TESTS (default
# tests/test_pdl.py) under the others.
# Example:
#   PDL_MODES="1 3" BENCH_ARGS="--m 1,2,4,8 --k 2,4,5 --kernels Scalar,MMA" \
#     bash scripts/link_ab.sh base full full@3 cols_d3 cols_d3_up3
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
repo=$PWD
cd .carry/nl || exit 1
others="api.o dequantize.o gemv.o quantize.o repack.o wgmma.o"
# shellcheck disable=SC2086
nvcc -shared -arch=sm_90a $others full.o -o ../full.so -cudart static || exit 1
for spec in "$@"; do
  name=${spec%@*}
  [ -f "../$name.so" ] && continue
  objs=$others
  # base links its own gemv (the old Scalar kernel) where build_ab_objs.sh made one
  [ "$name" = base ] && [ -f gemv_base.o ] && objs=${others/gemv.o/gemv_base.o}
  # shellcheck disable=SC2086
  nvcc -shared -arch=sm_90a $objs "mma_$name.o" -o "../$name.so" -cudart static || exit 1
done
cd "$repo"
libs=()
for spec in "$@"; do libs+=("$spec=.carry/${spec%@*}.so"); done
TESTS= bash scripts/lib_ab.sh "${libs[@]}"  # lib_ab.sh would run $TESTS per library
# the tests after the A/B (a slow suite must not cut the timings short): $TESTS under the first
# mode of $PDL_MODES, $PDL_TESTS (default tests/test_pdl.py) under the others
first=1
for mode in ${PDL_MODES:-1}; do
  tests=${TESTS:-tests/test_linear.py}; [ $first = 1 ] || tests=${PDL_TESTS:-tests/test_pdl.py}; first=0
  # shellcheck disable=SC2086
  KBIT_PDL=$mode KBIT_LIBRARY=$repo/.carry/full.so PYTHONPATH=$repo timeout ${TEST_TIMEOUT:-300} \
    python3 -m pytest -q --maxfail=20 -p no:cacheprovider $tests > "$OUT/tests_pdl$mode.log" 2>&1
  echo "tests $tests (full.so, KBIT_PDL=$mode): $(tail -1 "$OUT/tests_pdl$mode.log")"
done
