#!/usr/bin/env bash
# One device call: library (carried or built: scripts/use_library.sh), full test suite,
# compute-sanitizer, benchmark, the dispatch table the benchmark measures.
# Usage (on the device machine, repo root): bash scripts/gpu_check.sh [bench args...]
# Logs go to $OUT (or ./out): tests.log, bench.log, bench.json, dispatch_table.py and the
# bench's extra outputs (e.g. --plot $OUT/speedup.png); the other logs packed in logs.tgz.
# Prints a short summary last.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export CMAKE_BUILD_PARALLEL_LEVEL=16 PYTHONUNBUFFERED=1
summary=()
. scripts/use_library.sh
summary+=("library: $kbit_build")
cd /tmp  # import the installed package, not the source tree
python3 -m kbit.cli info | tee "$OUT/info.log"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout ${TEST_TIMEOUT:-400} python3 -m pytest -q -x -p no:cacheprovider "$OLDPWD/tests" > "$OUT/tests.log" 2>&1
  summary+=("tests: $(tail -1 "$OUT/tests.log")")
  # the suite ran with PDL on (KBIT_PDL default 1); the PDL chains again with it off
  KBIT_PDL=0 timeout 90 python3 -m pytest -q -p no:cacheprovider "$OLDPWD/tests/test_pdl.py" > "$OUT/test_pdl_0.log" 2>&1
  summary+=("tests/test_pdl.py KBIT_PDL=0: $(tail -1 "$OUT/test_pdl_0.log")")
fi
if [ "${SANITIZE:-0}" = 1 ]; then
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
    timeout ${SANITIZE_TIMEOUT:-240} compute-sanitizer --tool $tool --error-exitcode 9 python3 "$OLDPWD/scripts/sanitize_ops.py" > "$OUT/sanitizer_$tool.log" 2>&1
    summary+=("compute-sanitizer $tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log" | tail -1)")
  done
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout ${BENCH_TIMEOUT:-240} python3 -m kbit.cli bench --json "$OUT/bench.json" "$@" > "$OUT/bench.log" 2> "$OUT/bench.err"
  summary+=("bench: rc=$?")
  cat "$OUT/bench.log"
  # the dispatch table this run measures (copy it to kbit/dispatch_table.py when it is a full run)
  python3 "$OLDPWD/scripts/make_dispatch.py" "$OUT/bench.json" > "$OUT/dispatch_table.py" 2> /dev/null ||
    rm -f "$OUT/dispatch_table.py"
fi
# the device call returns at most 8 files from $OUT: keep the results, pack the other logs
( cd "$OUT" && small=() && for f in info.log test_pdl_*.log sanitizer_*.log bench.err build.log; do
    [ -f "$f" ] && small+=("$f"); done
  [ ${#small[@]} -gt 0 ] && tar czf logs.tgz "${small[@]}" && rm -f "${small[@]}" )
grep -E "passed|failed|error" "$OUT/tests.log" 2>/dev/null | tail -3
printf '%s\n' "${summary[@]}"
