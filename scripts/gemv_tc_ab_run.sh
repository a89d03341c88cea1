#!/usr/bin/env bash
# Device side of scripts/gemv_tc_ab_build.sh (repo root, carry [".carry/tcab"]). Links one library
# per gemv object, then in order of value (each step prints to $OUT/summary.txt as it ends, so a
# machine taken back mid-call still returns what finished):
#   1. A/B at M = 1, k = 2..4, Scalar column, dense shapes (scripts/lib_ab.sh, one round):
#      main (rows kernel, KBIT_GEMV_TC=0), tc (the same library, KBIT_GEMV_TC=1) and the variants
#      ($LIBS overrides the list);
#   2. test_gemv_m1_tc_forms on main's library;
#   3. with FULL=1: the GPU suite on main's library (its defaults), ncu of Q k = 2 (main vs tc:
#      stall reasons, pipe use), memcheck of scripts/sanitize_ops.py tc, a second A/B round.
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
repo=$PWD; export PYTHONPATH=$repo PYTHONUNBUFFERED=1
d=.carry/tcab; o=$d/o
T0=$SECONDS
say() { echo "[$((SECONDS - T0))s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$OUT/summary.txt"
for g in "$o"/gemv*.o; do
  v=$(basename "$g" .o); v=${v#gemv}; v=${v#_}; v=${v:-main}
  nvcc -shared -arch=sm_90a "$o"/{api,dequantize,quantize,repack,wgmma,mma}.o "$g" -o "$d/$v.so" -cudart static &
done
wait
say "linked: $(cd $d && ls ./*.so | tr '\n' ' ')"
export ENV_main=KBIT_GEMV_TC=0 ENV_tc=KBIT_GEMV_TC=1 ENV_xp1=KBIT_GEMV_TC=1 ENV_xp1a=KBIT_GEMV_TC=1 \
  ENV_lean=KBIT_GEMV_TC=1 ENV_u5=KBIT_GEMV_TC=0
libs=${LIBS:-main=$d/main.so tc=$d/main.so xp1=$d/xp1.so u5=$d/u5.so xp1a=$d/xp1a.so lean=$d/lean.so}
ab() {  # ab N: one round of the A/B into $OUT/abN.txt
  # shellcheck disable=SC2086
  ROUNDS=1 BENCH_ARGS="--m 1 --k 2,3,4 --kernels Scalar --shapes gateup,down,Q,O,KV" OUT=$OUT/ab$1 \
    timeout 240 bash scripts/lib_ab.sh $libs > "$OUT/ab$1.txt" 2>&1
  say "A/B round $1 done"
  sed -n '/Best of the kernels/,$p' "$OUT/ab$1.txt" | tee -a "$OUT/summary.txt"
}
ab 1
KBIT_LIBRARY=$repo/$d/main.so timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_linear.py \
  -k m1_tc_forms > "$OUT/t_tcforms.log" 2>&1
say "test_gemv_m1_tc_forms: $(tail -1 "$OUT/t_tcforms.log")"
grep -E "^(FAILED|E )" "$OUT/t_tcforms.log" | head -8 | tee -a "$OUT/summary.txt"
[ -n "${FULL:-}" ] || exit 0
KBIT_LIBRARY=$repo/$d/main.so timeout 240 python3 -m pytest -q -p no:cacheprovider tests > "$OUT/t_suite.log" 2>&1
say "GPU suite (main's defaults): $(tail -1 "$OUT/t_suite.log")"
grep -E "^(FAILED|ERROR)" "$OUT/t_suite.log" | head -8 | tee -a "$OUT/summary.txt"
ENV_main=KBIT_GEMV_TC=0 ENV_tc=KBIT_GEMV_TC=1 timeout 120 bash scripts/ncu_gemv.sh 2048 4096 2 1 \
  main=$d/main.so tc=$d/main.so > "$OUT/ncu.txt" 2>&1
say "ncu Q k = 2 done (ncu.txt)"
KBIT_LIBRARY=$repo/$d/main.so timeout 100 compute-sanitizer --tool memcheck python3 scripts/sanitize_ops.py tc \
  > "$OUT/memcheck_tc.log" 2>&1
say "memcheck tc: $(grep -E 'ERROR SUMMARY|done' "$OUT/memcheck_tc.log" | tr '\n' ' ')"
ab 2
