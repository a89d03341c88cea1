#!/usr/bin/env bash
# CPU side of the tensor-core M = 1 GEMV A/B (NOTES.md v70, v71): SASS-only objects (a quarter
# of -arch=sm_90a's size: the carry holds 64 MiB) into .carry/tcab/o: every csrc object once, plus
# gemv.cu once per variant. ~10 min on this machine's 2 cores (mma.cu ~4.5 min, gemv.cu ~2 min
# per variant), two compiles at a time. Then, on the device, with carry [".carry/tcab"]:
#   bash scripts/gemv_tc_ab_run.sh
# Variants (gemv_NAME.o; main = the working tree as it is):
#   xp1  -DKBIT_GEMV_TC_XPRE=1 (unit 0's decode while x is read)
#   xp1a xp1 + -DKBIT_GEMV_TC_ACC_PER_UNIT=0 (one accumulator set)
#   lean -DKBIT_GEMV_TC_ACC_PER_UNIT=0 -DKBIT_GEMV_TC_MIN_CTAS=2
#   u5   -DKBIT_GEMV_U5_MIN_K=2 (the rows kernel's rounds of 5 for k = 2: down k = 2)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
o=$repo/.carry/tcab/o
mkdir -p "$o"
flags=(-O3 -std=c++17 --expt-relaxed-constexpr -Xcompiler -fPIC -DKBIT_HAS_SM90A -I"$repo/csrc"
       -gencode arch=compute_90a,code=sm_90a)
build() {  # build OUT SRC [flags...], at most 2 at a time
  local out=$1 src=$2; shift 2
  while [ "$(jobs -rp | wc -l)" -ge 2 ]; do sleep 2; done
  ( nvcc "${flags[@]}" "$@" -c "$src" -o "$out" > "$out.log" 2>&1 && rm -f "$out.log" && echo "built $out" \
    || { echo "FAILED $out"; tail -20 "$out.log"; } ) &
}
build "$o/mma.o" "$repo/csrc/mma.cu"
build "$o/gemv.o" "$repo/csrc/gemv.cu"
for f in api dequantize quantize repack wgmma; do build "$o/$f.o" "$repo/csrc/$f.cu"; done
build "$o/gemv_xp1.o" "$repo/csrc/gemv.cu" -DKBIT_GEMV_TC_XPRE=1
build "$o/gemv_xp1a.o" "$repo/csrc/gemv.cu" -DKBIT_GEMV_TC_XPRE=1 -DKBIT_GEMV_TC_ACC_PER_UNIT=0
build "$o/gemv_lean.o" "$repo/csrc/gemv.cu" -DKBIT_GEMV_TC_ACC_PER_UNIT=0 -DKBIT_GEMV_TC_MIN_CTAS=2
build "$o/gemv_u5.o" "$repo/csrc/gemv.cu" -DKBIT_GEMV_U5_MIN_K=2
wait
du -sh "$o"
