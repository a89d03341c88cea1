#!/usr/bin/env bash
# A/B of kbit libraries on the linear suite in one device call: `kbit bench --suite linear`
# with $BENCH_ARGS (default --m 1,4,8,16 --k 4,5) for every library in turn, $ROUNDS rounds
# (default 2), alternating; then one table per M of each kernel column, library by library
# (scripts/lib_ab_table.py). Optionally $TESTS (pytest args, e.g. tests/test_linear.py) run
# first for each library. Logs in $OUT/logs.tgz.
# Carry objects, not whole libraries (~42 MB each; the carry holds 64 MiB): the unchanged
# csrc objects once plus one object per variant in .carry/objs, linked here first, e.g.
#   nvcc -shared -arch=sm_90a .carry/objs/{api,gemv,quantize,repack,wgmma,dequantize}.o \
#        .carry/objs/mma_NAME.o -o .carry/NAME.so -cudart static
# A name of the form NAME@MODE runs its library under KBIT_PDL=MODE. $PYROOT_NAME (a directory
# holding a `kbit` package, e.g. an older revision's: git archive REV kbit | tar -x -C DIR) runs
# library NAME's bench with that Python package instead of the working tree's; $ENV_NAME
# (e.g. "KBIT_MMA_KSPLIT=2") sets environment variables for library NAME's bench only, so the
# same .so may appear under several names (a forced-split sweep: g2s1=x.so g2s2=x.so with
# ENV_g2s2=KBIT_MMA_KSPLIT=2 ...).
# Usage (device, repo root): [ROUNDS=..] [BENCH_ARGS=..] [TESTS=..] bash scripts/lib_ab.sh name=lib.so ...
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)  # absolute: the script changes directory
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
repo=$PWD
summary=()
mine=()  # the files this script writes in $OUT
cd /tmp
if [ -n "${TESTS:-}" ]; then
  for spec in "$@"; do
    name=${spec%%=*}; lib=$repo/${spec#*=}
    # shellcheck disable=SC2086
    (cd "$repo" && KBIT_LIBRARY=$lib timeout 300 python3 -m pytest -q -p no:cacheprovider $TESTS) > "$OUT/tests_$name.log" 2>&1
    summary+=("tests $name: $(tail -1 "$OUT/tests_$name.log")")
    mine+=("tests_$name.log")
  done
fi
jsons=()
for round in $(seq ${ROUNDS:-2}); do
  for spec in "$@"; do
    name=${spec%%=*}; lib=$repo/${spec#*=}; file=${name//@/_pdl}
    mode=${KBIT_PDL:-1}; [ "$name" != "${name%@*}" ] && mode=${name#*@}
    # shellcheck disable=SC2086
    pv=PYROOT_${name%@*}; pyroot=${!pv:-$repo}; ev=ENV_${name%@*}
    # shellcheck disable=SC2086
    env ${!ev:-} PYTHONPATH=$pyroot KBIT_PDL=$mode KBIT_LIBRARY=$lib timeout 200 python3 -m kbit.cli bench --suite linear ${BENCH_ARGS:---m 1,4,8,16 --k 4,5} \
      --json "$OUT/${file}_$round.json" > "$OUT/${file}_$round.txt" 2>&1
    summary+=("bench $name round $round: rc $? (at ${SECONDS} s)")
    jsons+=("$name=$OUT/${file}_$round.json")
    mine+=("${file}_$round.json" "${file}_$round.txt")
  done
done
python3 "$repo/scripts/lib_ab_table.py" "${jsons[@]}"
# pack this script's own files (bench runs, test logs) into logs.tgz; files others left in $OUT stay
[ ${#mine[@]} -gt 0 ] && tar czf "$OUT/logs.tgz" -C "$OUT" "${mine[@]}" && (cd "$OUT" && rm -f "${mine[@]}")
printf '%s\n' "${summary[@]}"
