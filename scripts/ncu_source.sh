#!/usr/bin/env bash
# Per-instruction warp-stall samples of one small-M kernel launch (ncu SourceCounters +
# WarpStateStats at the finest sampling interval), exported as SASS CSV for offline reading
# (scripts/ncu_source_top.py). Caches flushed (cold), clocks left alone.
# Usage (device, repo root, after an install): bash scripts/ncu_source.sh KERNEL_REGEX K N k M [tag]
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
re=$1; shift
tag=${5:-$1_$2_$3_$4}
S="$PWD/scripts/profile_linear.py"
cd /tmp
timeout 240 ncu --clock-control none -k "regex:$re" -c 1 --import-source yes \
  --section SourceCounters --section WarpStateStats --section SpeedOfLight \
  --warp-sampling-interval 0 -f -o "$OUT/src_$tag" python3 "$S" "$1" "$2" "$3" "$4" > "$OUT/ncu_src_$tag.log" 2>&1
echo "ncu rc=$?"
ncu -i "$OUT/src_$tag.ncu-rep" --page source --csv --print-source sass > "$OUT/src_$tag.csv" 2>> "$OUT/ncu_src_$tag.log"
ncu -i "$OUT/src_$tag.ncu-rep" --page details > "$OUT/details_$tag.txt" 2>> "$OUT/ncu_src_$tag.log"
grep -E "Duration|Warp Cycles Per Issued|Issued Ipc|DRAM Throughput" "$OUT/details_$tag.txt" | sed 's/  */ /g'
