#!/usr/bin/env bash
# ncu on the dequantize/quantize kernels (big shape). Usage: bash scripts/ncu_ops.sh [ks]
set -uo pipefail
source "$(dirname "$0")/ncu_common.sh"
OUT=${OUT:-out}; mkdir -p "$OUT"
export CMAKE_BUILD_PARALLEL_LEVEL=16
python3 -m pip install --no-build-isolation --no-deps . > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
cd /tmp
timeout 400 ncu --clock-control none -k regex:'quantize_kernel' \
  "${NCU_SECTIONS[@]}" \
  python3 "$OLDPWD/scripts/profile_ops.py" "${1:-2,4}" > "$OUT/ncu.txt" 2>&1
echo "ncu rc=$?"
grep -E "quantize_kernel|Duration|DRAM Throughput|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Executed Ipc Active|No Eligible|Warp Cycles Per Issued|Executed Instructions  |L1/TEX Hit|Mem Busy|Max Bandwidth|One or More Eligible" "$OUT/ncu.txt" | sed 's/  */ /g' | cut -c1-150
