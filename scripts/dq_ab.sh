#!/usr/bin/env bash
# A/B of dequantize libraries in one device call: for each library given, the dequantize
# tests, then `kbit bench --suite ops`
# on $SHAPES (default big,gateup,down) for every library in turn, $ROUNDS rounds (default 2),
# alternating. Prints each run's dequantize lines and the fp16 GEMV reference; logs in
# $OUT/logs.tgz.
# Usage (device, repo root): [SHAPES=..] [ROUNDS=..] bash scripts/dq_ab.sh name=lib.so ...
# Whole libraries (~42 MB each) overflow the 64 MiB carry past one: carry the objects instead
# (here: the other csrc/*.cu compiled once with scripts/build_variant.sh's flags, plus one
# dequantize.o per variant, all in .carry/objs) and link each variant on the device first:
#   nvcc -shared -arch=sm_90a .carry/objs/[a-cg-z]*.o .carry/objs/dq_NAME.o -o .carry/dq_NAME.so -cudart static
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
repo=$PWD
summary=()
cd /tmp
for spec in "$@"; do
  name=${spec%%=*}; lib=$repo/${spec#*=}
  KBIT_LIBRARY=$lib timeout 200 python3 -m pytest -q -p no:cacheprovider "$repo/tests/test_quantize.py" \
    > "$OUT/tests_$name.log" 2>&1
  summary+=("tests/test_quantize.py $name: $(tail -1 "$OUT/tests_$name.log")")
done
for round in $(seq ${ROUNDS:-2}); do
  for spec in "$@"; do
    name=${spec%%=*}; lib=$repo/${spec#*=}
    KBIT_LIBRARY=$lib timeout 120 python3 -m kbit.cli bench --suite ops --shapes "${SHAPES:-big,gateup,down}" \
      > "$OUT/ops_${name}_$round.txt" 2>&1
    echo "== $name round $round (rc $?)"
    grep -E "GEMV|^\| (big|gateup|down|Q|O|KV) " "$OUT/ops_${name}_$round.txt" | cut -c1-75
  done
done
tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls) && find "$OUT" -type f ! -name logs.tgz -delete
printf '%s\n' "${summary[@]}"
