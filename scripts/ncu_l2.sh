#!/usr/bin/env bash
# Where a matmul call's bytes go: duration, DRAM bytes, L2 -> SM bytes, L2 and tensor-pipe
# utilization of each kernel profile_linear.py launches (fp16 cuBLAS, gemv, mma, wgmma) on
# one shape; ncu flushes the caches before each kernel (cold), clocks left alone.
# Usage (device, repo root, after an install): bash scripts/ncu_l2.sh K N k M
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
S="$PWD/scripts/profile_linear.py"
tag=$(echo "$@" | tr ' ' _)
m=gpu__time_duration.sum,dram__bytes_read.sum,lts__t_bytes.sum,l1tex__m_xbar2l1tex_read_bytes.sum
m=$m,lts__t_sectors_srcunit_tex_op_read.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed
m=$m,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed
m=$m,launch__grid_size,sm__warps_active.avg.pct_of_peak_sustained_active
cd /tmp
timeout 300 ncu --clock-control none -k regex:'mma_kernel|wgmma_kernel|gemv|gemm|sm90' \
  --metrics "$m" --csv python3 "$S" "$@" > "$OUT/ncu_l2_$tag.csv" 2> "$OUT/ncu_l2_$tag.err"
echo "ncu rc=$? ($tag)"
python3 - "$OUT/ncu_l2_$tag.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    sys.exit("no ncu rows")
h = rows[0]; rows = rows[1:]
ki, mi, vi, ii = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value"), h.index("ID")
per = collections.OrderedDict()
for r in rows:
    per.setdefault((r[ii], r[ki][:40]), {})[r[mi]] = r[vi].replace(",", "")
for (i, name), d in per.items():
    f = lambda k: float(d.get(k, "nan"))
    print(f"{i:>3} {name:40} {f('gpu__time_duration.sum')/1e3:7.2f} us grid {d.get('launch__grid_size')}"
          f" DRAM {f('dram__bytes_read.sum')/1e6:6.2f} MB L2->SM {f('l1tex__m_xbar2l1tex_read_bytes.sum')/1e6:6.2f} MB"
          f" tex-read {f('lts__t_sectors_srcunit_tex_op_read.sum')*32/1e6:6.2f} MB L2 all {f('lts__t_bytes.sum')/1e6:6.2f} MB"
          f" L2 {f('lts__throughput.avg.pct_of_peak_sustained_elapsed'):5.1f}% tensor {f('sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed'):5.1f}%"
          f" warps {f('sm__warps_active.avg.pct_of_peak_sustained_active'):5.1f}%")
PY
