#!/usr/bin/env bash
# Experiment: `kbit bench --suite linear --kernels MMA` ($BENCH_ARGS, default --m 8,16 --k 4)
# under every forced K-slice count in $SPLITS_NAME or $SPLITS (default "0 1 2 4 8"; 0 = the
# automatic plan)
# for each library NAME=LIB, $ROUNDS rounds (default 2), alternating; then one table per M
# (scripts/lib_ab_table.py, columns NAME/S). Logs in $OUT/sweep.tgz.
# Usage (device, repo root): bash scripts/split_sweep.sh name=lib.so ...
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
repo=$PWD
jsons=(); mine=()
cd /tmp
for round in $(seq ${ROUNDS:-2}); do
  for spec in "$@"; do
    name=${spec%%=*}; lib=$repo/${spec#*=}
    sv=SPLITS_$name
    for S in ${!sv:-${SPLITS:-0 1 2 4 8}}; do
      f=${name}_S${S}_$round
      # shellcheck disable=SC2086
      KBIT_MMA_KSPLIT=$S KBIT_LIBRARY=$lib timeout 200 python3 -m kbit.cli bench --suite linear \
        ${BENCH_ARGS:---m 8,16 --k 4} --kernels MMA --json "$OUT/$f.json" > "$OUT/$f.txt" 2>&1
      echo "bench $f: rc $? (at ${SECONDS} s)"
      jsons+=("$name/S$S=$OUT/$f.json"); mine+=("$f.json" "$f.txt")
    done
  done
done
python3 "$repo/scripts/lib_ab_table.py" "${jsons[@]}"
tar czf "$OUT/sweep.tgz" -C "$OUT" "${mine[@]}" && (cd "$OUT" && rm -f "${mine[@]}")
