#!/usr/bin/env bash
# The PDL A/B of NOTES.md v16 in one device call: the GPU test suite under the default KBIT_PDL,
# tests/test_pdl.py under KBIT_PDL=0, then `kbit bench --suite linear` for each
# KBIT_PDL in $MODES (default 0 1; mode 2 was removed in v47): back-to-back calls (M list $1,
# default 1,4,16) and
# after a plain kernel (--after-fill, M = 1). Logs in $OUT/logs.tgz. Library: see
# scripts/use_library.sh.
# Usage (device, repo root): [MODES="0 1"] bash scripts/pdl_ab.sh [M list]
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
MS=${1:-1,4,16}
. scripts/use_library.sh
cd /tmp
python3 -m kbit.cli info
timeout 240 python3 -m pytest -q -p no:cacheprovider "$repo/tests" > "$OUT/tests.log" 2>&1
summary=("tests (KBIT_PDL default): $(tail -1 "$OUT/tests.log")")
KBIT_PDL=0 timeout 90 python3 -m pytest -q -p no:cacheprovider "$repo/tests/test_pdl.py" > "$OUT/test_pdl_0.log" 2>&1
summary+=("tests/test_pdl.py KBIT_PDL=0: $(tail -1 "$OUT/test_pdl_0.log")")
run_bench() {  # name, KBIT_PDL, bench args...
  local name=$1 mode=$2; shift 2
  KBIT_PDL=$mode timeout 200 python3 -m kbit.cli bench --suite linear --json "$OUT/$name.json" "$@" \
    > "$OUT/$name.txt" 2> "$OUT/$name.err"
  summary+=("bench $name (KBIT_PDL=$mode $*): rc=$?")
}
for mode in ${MODES:-0 1}; do
  run_bench b2b_pdl$mode $mode --m "$MS"
  run_bench fill_pdl$mode $mode --m 1 --after-fill
done
grep -E "failed|error" "$OUT/tests.log" | tail -5
for f in $(cd "$OUT" && ls *.txt | sed 's/.txt$//'); do
  echo "== $f"; sed -n '/^| M /,/^wrote/p' "$OUT/$f.txt" | grep -v wrote
done
tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls *.txt *.log *.json) && rm -f "$OUT"/*.json "$OUT"/*.err
printf '%s\n' "${summary[@]}"
