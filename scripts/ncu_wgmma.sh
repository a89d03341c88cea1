#!/usr/bin/env bash
# ncu on wgmma at one dense shape, forced plans side by side with fp16 cuBLAS: where a step's
# time goes (tensor pipe, shared-memory banks, LSU wavefronts, stalls).
# Usage (device, repo root, library available: scripts/use_library.sh):
#   bash scripts/ncu_wgmma.sh SHAPE k M CONFIGS      e.g. gateup 5 256 0.0.0,256.1.-1,256.2.-1,fp16
# CONFIGS as scripts/profile_wgmma.py takes them. Writes $OUT/ncu_wgmma_TAG.{txt,csv}: the
# details page (every section of --set full) and the raw metrics as CSV; prints a digest.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
S=$PWD/scripts/profile_wgmma.py
tag=${1}_k${2}_m${3}
cd /tmp
# extra metrics beyond --set full, each kept only where this ncu knows its base name
ncu --query-metrics --chip gh100 > "$OUT/metrics_gh100.txt" 2>&1
extra=()
for m in l1tex__data_bank_reads l1tex__data_bank_writes l1tex__data_pipe_lsu_wavefronts_mem_shared \
         l1tex__data_bank_conflicts_pipe_lsu_mem_shared sm__pipe_tensor_op_gmma_cycles_active \
         sm__inst_executed_pipe_tensor_op_gmma l1tex__m_xbar2l1tex_read_bytes smsp__inst_executed_op_shared_ld; do
  grep -q "^$m " "$OUT/metrics_gh100.txt" && extra+=("$m.sum" "$m.avg.pct_of_peak_sustained_elapsed")
done
metrics=$(IFS=,; echo "${extra[*]}")
timeout 400 ncu --clock-control none --set full ${metrics:+--metrics "$metrics"} -k regex:'wgmma_kernel|gemm|nvjet|xmma|cutlass' \
  -o "/tmp/ncu_$tag" -f python3 "$S" "$@" > "$OUT/ncu_wgmma_run_$tag.log" 2>&1
echo "ncu rc=$? (extra metrics: ${#extra[@]})"
ncu -i "/tmp/ncu_$tag.ncu-rep" --page details --print-details all > "$OUT/ncu_wgmma_$tag.txt" 2>&1
ncu -i "/tmp/ncu_$tag.ncu-rep" --page raw --csv > "$OUT/ncu_wgmma_$tag.csv" 2>&1
python3 - "$OUT/ncu_wgmma_$tag.csv" "$4" <<'PY'
import csv, re, sys
rows = list(csv.reader(open(sys.argv[1])))
head = rows[0]
keep = re.compile(r"gpu__time_duration.sum|sm__cycles_elapsed.avg$|l1tex__data_bank_(reads|writes)|"
                  r"lsu_wavefronts_mem_shared|bank_conflicts_pipe_lsu_mem_shared.sum|tensor_op_gmma|"
                  r"sm__pipe_shared_cycles|l1tex__throughput.avg.pct|sm__throughput.avg.pct|"
                  r"smsp__average_warp(s_issue_stalled|_latency_issue_stalled)_[a-z_]+_per_issue_active.ratio|"
                  r"dram__throughput.avg.pct|launch__(grid_size|block_size|registers)|smsp__issue_active.avg.pct")
cols = [i for i, h in enumerate(head) if keep.search(h)]
names = [r[head.index("Kernel Name")][:40] for r in rows[2:]]
print("configs:", sys.argv[2])
for i in cols:
    vals = [r[i] for r in rows[2:]]
    def num(v):
        try:
            return float(v.replace(",", ""))
        except ValueError:
            return 0.0
    if head[i].startswith("smsp__average_warp") and all(num(v) < 0.05 for v in vals):
        continue
    print(f"{head[i][:78]:78s} {rows[1][i][:6]:6s} " + " ".join(f"{v:>10s}" for v in vals))
print("kernels:", names)
PY
