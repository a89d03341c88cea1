#!/usr/bin/env bash
# Device side of scripts/sass_objs.sh (repo root, carry [".carry/objs"]): link the library from
# the carried objects, then, in order of value (each step appends to $OUT/summary.txt as it ends,
# so a machine taken back mid-call still returns what finished):
#   1. the GPU suite ($SUITE, default tests; none: skipped); compute-sanitizer memcheck of
#      `scripts/sanitize_ops.py $SAN` (default tc: the tensor-core M = 1 GEMV; racecheck at the end;
#      none: neither);
#   1b. where sass_objs.sh built gemv variants (gemv_NAME.o): an A/B of them against the library,
#      $AB_ROUNDS (default 2) rounds of M = $AB_M, k = $AB_K (default $M, $K), Scalar column, dense
#      shapes, with $AB_ARGS (more bench arguments) -> $OUT/ab.txt; then $AB_EXTRA (a command
#      line, e.g. an lib_ab.sh sweep of forms by environment) with its output appended to ab.txt;
#   2. $RUNS (default 2) dispatch runs of the cells a change moved, `kbit bench --suite linear
#      --m $M --k $K` (default M = 1, k = 2,3) -> $OUT/$TAG_<i>.json (TAG default
#      bench_<gpu>_$VER, VER default new: name them as they will sit in docs/);
#   3. the dispatch table again (scripts/make_dispatch.py --again: the results the current
#      kbit/dispatch_table.py names, from docs/) with the new runs as --newer ->
#      $OUT/dispatch_table.py, also put in place here for step 4;
#   4. `kbit bench --m $BM --k $BK` (BM default $M, all: the default M list; BK default every k; all
#      suites: the main job at those M) with that table -> $OUT/bench.txt / bench.json (plot it
#      here: kbit bench --from-json bench.json --plot speedup.png; at most 8 files come back).
# Copy the JSONs into docs/ and the table into kbit/ afterwards.
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
repo=$PWD; o=.carry/objs/o
M=${M:-1}; K=${K:-2,3}; RUNS=${RUNS:-2}; SAN=${SAN:-tc}; SUITE=${SUITE:-tests}; BK=${BK:-2,3,4,5}
AB_M=${AB_M:-$M}; AB_K=${AB_K:-$K}
BM=${BM:-$M}; mflag=(--m "$BM"); [ "$BM" = all ] && mflag=()
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$gpu" in *H200*) fam=h200 ;; *H100*) fam=h100 ;; *) fam=gpu ;; esac
TAG=${TAG:-bench_${fam}_${VER:-new}}
T0=$SECONDS
# At most 8 files come back from a device call: logs go to $L and, after every step, into
# $OUT/logs.tgz; $OUT keeps summary.txt, ab.txt, the dispatch runs' JSONs, dispatch_table.py,
# bench.txt / .json and logs.tgz.
L=$(mktemp -d)
say() {
  echo "[$((SECONDS - T0))s] $*" | tee -a "$OUT/summary.txt"
  tar -czf "$OUT/logs.tgz" -C "$L" . 2> /dev/null
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$OUT/summary.txt"
others=("$o"/{api,dequantize,mma,quantize,repack,wgmma}.o)
libs=(main=.carry/objs/kbit.so)
for g in "$o"/gemv_*.o; do
  [ -e "$g" ] || continue
  v=$(basename "$g" .o); v=${v#gemv_}
  nvcc -shared -arch=sm_90a "${others[@]}" "$g" -o ".carry/objs/$v.so" -cudart static &
  libs+=("$v=.carry/objs/$v.so")
done
nvcc -shared -arch=sm_90a "${others[@]}" "$o/gemv.o" -o .carry/objs/kbit.so -cudart static || { say "link failed"; exit 1; }
wait
export KBIT_LIBRARY=$repo/.carry/objs/kbit.so PYTHONPATH=$repo PYTHONUNBUFFERED=1
if [ "$SUITE" != none ]; then
  # the full suite took 266 s on the H100 in session 64 (a 300 s cap cut it)
  # shellcheck disable=SC2086
  timeout 420 python3 -m pytest -q -p no:cacheprovider $SUITE > "$L/t_suite.log" 2>&1
  say "GPU suite ($SUITE): $(tail -1 "$L/t_suite.log")"
  grep -E "^(FAILED|ERROR)" "$L/t_suite.log" | head -8 | tee -a "$OUT/summary.txt"
fi
sanitize() {
  [ "$SAN" = none ] && return
  timeout 150 compute-sanitizer --tool "$1" python3 scripts/sanitize_ops.py "$SAN" > "$L/$1_$SAN.log" 2>&1
  say "$1 $SAN: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|done' "$L/$1_$SAN.log" | tr '\n' ' ')"
}
sanitize memcheck
if [ ${#libs[@]} -gt 1 ]; then
  ROUNDS=${AB_ROUNDS:-2} BENCH_ARGS="--m $AB_M --k $AB_K --kernels Scalar --shapes gateup,down,Q,O,KV ${AB_ARGS:-}" OUT=$L/ab \
    timeout 420 bash scripts/lib_ab.sh "${libs[@]}" > "$OUT/ab.txt" 2>&1
  say "A/B ${libs[*]}: done"
  sed -n '/Best of the kernels/,$p' "$OUT/ab.txt" | grep '^|' | tee -a "$OUT/summary.txt"
fi
if [ -n "${AB_EXTRA:-}" ]; then
  echo "== $AB_EXTRA" >> "$OUT/ab.txt"
  OUT=$L/abx timeout 200 bash -c "$AB_EXTRA" >> "$OUT/ab.txt" 2>&1
  say "extra A/B: done"
  sed -n '/== /,$p' "$OUT/ab.txt" | sed -n '/Best of the kernels/,$p' | grep '^|' | tee -a "$OUT/summary.txt"
fi
# bench [args...] > file: kbit bench; its output check (new in session 62, first run here) failing
# is status 3 (the JSON is written, the failures printed, make_dispatch skips those cells); any
# other failure but a timeout (124) reruns it unchecked
bench() {
  timeout 200 python3 -m kbit.cli bench "$@"
  local rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 3 ] && [ $rc -ne 124 ]; then
    echo "kbit bench rc $rc: rerun with --no-check"
    timeout 200 python3 -m kbit.cli bench --no-check "$@"
    rc=$?
  fi
  return $rc
}
newer=()
for i in $(seq 1 "$RUNS"); do
  bench --suite linear --m "$M" --k "$K" --json "$OUT/${TAG}_$i.json" > "$L/${TAG}_$i.txt" 2>&1
  say "dispatch run $i: rc $? (3: output check failed); $(grep -E 'output check|OUTPUT CHECK|rerun' "$L/${TAG}_$i.txt" | head -3 | tr '\n' ' ')"
  newer+=("$OUT/${TAG}_$i.json")
done
if [ ${#newer[@]} -eq 0 ]; then
  say "no dispatch runs (RUNS=0): the table stays"
elif python3 scripts/make_dispatch.py --again kbit/dispatch_table.py --newer "${newer[@]}" > "$OUT/dispatch_table.py" \
     2> "$L/make_dispatch.log"; then
  diff kbit/dispatch_table.py "$OUT/dispatch_table.py" > "$L/dispatch_diff.txt"
  cp "$OUT/dispatch_table.py" kbit/dispatch_table.py
  say "dispatch table: $(grep -c '^[<>]   ' "$L/dispatch_diff.txt") changed rows (dispatch_diff.txt in logs.tgz)"
  grep '^[<>]   ' "$L/dispatch_diff.txt" | head -16 | tee -a "$OUT/summary.txt"
else
  say "make_dispatch failed: $(tail -3 "$L/make_dispatch.log")"
fi
bench "${mflag[@]}" --k "$BK" --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1
say "bench --m $BM: rc $?; $(grep -E 'output check|OUTPUT CHECK|rerun' "$OUT/bench.txt" | head -3 | tr '\n' ' ')"
grep -E "^\| TOTAL" "$OUT/bench.txt" | head -20 | tee -a "$OUT/summary.txt"
grep -A14 "^Summary: dense TOTAL fp16 / the kernels" "$OUT/bench.txt" | tee -a "$OUT/summary.txt"
sanitize racecheck
