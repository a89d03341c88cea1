#!/usr/bin/env bash
# ncu (--set full) on the M <= 4 GEMV kernels of one shape, library by library, with a digest of
# stall reasons and pipe use side by side: where an M = 1 decode's time goes.
# Usage (device, repo root): [ENV_NAME="VAR=v ..."] bash scripts/ncu_gemv.sh K N k M name=lib.so ...
# $ENV_NAME sets environment variables for library NAME's run (the same .so may appear under
# several names). Writes $OUT/ncu_gemv_K_N_k_M.csv (raw metrics, one row per library) and prints
# the digest.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
repo=$PWD
S=$repo/scripts/profile_linear.py
K=$1 N=$2 k=$3 M=$4; shift 4
tag=${K}_${N}_${k}_${M}
cd /tmp
csvs=()
for spec in "$@"; do
  name=${spec%%=*}; lib=$repo/${spec#*=}; ev=ENV_$name
  # shellcheck disable=SC2086
  env ${!ev:-} PYTHONPATH=$repo KBIT_LIBRARY=$lib timeout 300 ncu --clock-control none --set full \
    -k regex:'gemv' -c 1 -o "/tmp/ncu_gemv_$name" -f python3 "$S" "$K" "$N" "$k" "$M" > "/tmp/ncu_gemv_$name.log" 2>&1 \
    || { echo "ncu $name failed:"; tail -5 "/tmp/ncu_gemv_$name.log"; continue; }
  ncu -i "/tmp/ncu_gemv_$name.ncu-rep" --page raw --csv > "/tmp/ncu_gemv_$name.csv" 2>&1
  csvs+=("$name=/tmp/ncu_gemv_$name.csv")
done
[ ${#csvs[@]} -gt 0 ] || exit 1
python3 - "$OUT/ncu_gemv_$tag.csv" "${csvs[@]}" <<'PY'
import csv, re, sys
keep = re.compile(r"gpu__time_duration.sum|sm__cycles_elapsed.avg$|smsp__issue_active.avg.pct|"
                  r"sm__inst_executed_pipe_[a-z0-9_]+.avg.pct_of_peak_sustained_active|"
                  r"smsp__average_warp(s_issue_stalled|_latency_issue_stalled)_[a-z_]+_per_issue_active.ratio|"
                  r"l1tex__data_pipe_lsu_wavefronts_mem_shared.sum$|smsp__inst_executed.sum$|"
                  r"launch__(grid_size|block_size|registers_per_thread)|dram__throughput.avg.pct|"
                  r"smsp__warps_active.avg.per_cycle_active")
names, tables = [], []
for spec in sys.argv[2:]:
    name, path = spec.split("=", 1)
    rows = [r for r in csv.reader(open(path)) if r]
    hi = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    head, units, data = rows[hi], rows[hi + 1], rows[hi + 2]
    names.append(name)
    tables.append((head, units, data))
head0 = tables[0][0]
cols = [h for h in head0 if keep.search(h)]
with open(sys.argv[1], "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["metric"] + names)
    for h in cols:
        w.writerow([h] + [t[2][t[0].index(h)] if h in t[0] else "" for t in tables])
def num(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0
print("kernels:", [t[2][t[0].index("Kernel Name")][:60] for t in tables])
print(f"{'metric':70s} " + " ".join(f"{n:>9s}" for n in names))
for h in cols:
    vals = [t[2][t[0].index(h)] if h in t[0] else "" for t in tables]
    if (h.startswith("smsp__average_warp") or "pipe_" in h) and all(num(v) < 0.05 for v in vals):
        continue
    if h.startswith("smsp__average_warp_latency"):
        continue  # the per-issue warp counts carry the same ranking
    short = h.replace("smsp__average_warps_issue_stalled_", "stall ").replace("_per_issue_active.ratio", "")
    short = short.replace("sm__inst_executed_pipe_", "pipe ").replace(".avg.pct_of_peak_sustained_active", " %")
    print(f"{short[:70]:70s} " + " ".join(f"{v[:9]:>9s}" for v in vals))
PY
