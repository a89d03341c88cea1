# ncu on mma at M = 16, S = 2 forced, k = 2, 3, 4, the 8192 x 28672 weight (scripts/profile_big.py;
# session 33: the grid sizes showed the 2-wave plans). Usage (device, kbit importable): bash scripts/ncu_big.sh
source scripts/ncu_common.sh
cd /tmp
timeout 300 ncu --clock-control none -k regex:'mma_kernel' "${NCU_SECTIONS[@]}" python3 "$OLDPWD/scripts/profile_big.py" 16 2 2,3,4 > "$OUT/ncu.txt" 2>&1
echo "ncu rc=$?"
grep -E "mma_kernel|Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Executed Ipc Active|Warp Cycles Per Issued|Executed Instructions  |Grid Size|Block Size|Dynamic Shared|L1/TEX Hit|Mem Busy|Max Bandwidth|L2 Hit" "$OUT/ncu.txt" | sed 's/  */ /g' | cut -c1-140
