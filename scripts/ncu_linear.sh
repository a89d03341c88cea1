#!/usr/bin/env bash
# ncu + hot/cold timing of the small-M matmul kernels on one shape.
# Usage (device, repo root, after an install): bash scripts/ncu_linear.sh K N k M
set -uo pipefail
source "$(dirname "$0")/ncu_common.sh"
OUT=${OUT:-out}; mkdir -p "$OUT"
S="$PWD/scripts/profile_linear.py"
cd /tmp
python3 "$S" "$@" --timing | tee -a "$OUT/hotcold.txt"
tag=$(echo "$@" | tr ' ' _)
timeout 300 ncu --clock-control none -k regex:'mma_kernel|wgmma_kernel|gemv_kernel|gemv|gemm' \
  "${NCU_SECTIONS[@]}" \
  python3 "$S" "$@" > "$OUT/ncu_$tag.txt" 2>&1
echo "ncu rc=$?"
grep -E "  [a-z_:<>,0-9 ]*(kernel|gemv|gemm)[^ ]*|Duration|DRAM Throughput|Memory Throughput|Registers Per|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Executed Instructions  |Achieved Occupancy|Grid Size|Block Size|Dynamic Shared" "$OUT/ncu_$tag.txt" | sed 's/  */ /g' | cut -c1-120
