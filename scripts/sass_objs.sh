#!/usr/bin/env bash
# Build the library's objects on this (CPU) machine for a device call: SASS only
# (-gencode arch=compute_90a,code=sm_90a: a quarter of -arch=sm_90a's size, which also embeds
# PTX; the carry holds 64 MiB) into .carry/objs/o, every csrc/*.cu once, plus gemv.cu once per
# variant NAME="nvcc flags" given as arguments (gemv_NAME.o). ~8 min on 2 cores (mma.cu ~4.5,
# gemv.cu ~2), two compiles at a time. Objects already there and newer than every csrc file are
# kept. Then, on the device, with carry [".carry/objs"]: bash scripts/m1_refresh.sh
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
o=$repo/.carry/objs/o
mkdir -p "$o"
flags=(-O3 -std=c++17 --expt-relaxed-constexpr -Xcompiler -fPIC -DKBIT_HAS_SM90A -I"$repo/csrc"
       -gencode arch=compute_90a,code=sm_90a)
newest=$(ls -t "$repo"/csrc/* | head -1)
build() {  # build OUT SRC [flags...], at most 2 at a time
  local out=$1 src=$2; shift 2
  [ -f "$out" ] && [ "$out" -nt "$newest" ] && { echo "kept $out"; return; }
  while [ "$(jobs -rp | wc -l)" -ge 2 ]; do sleep 2; done
  ( nvcc "${flags[@]}" "$@" -c "$src" -o "$out" > "$out.log" 2>&1 && rm -f "$out.log" && echo "built $out" \
    || { echo "FAILED $out"; tail -20 "$out.log"; } ) &
}
build "$o/mma.o" "$repo/csrc/mma.cu"
for src in "$repo"/csrc/*.cu; do
  f=$(basename "$src" .cu)
  [ "$f" = mma ] || build "$o/$f.o" "$src"
done
for spec in "$@"; do
  name=${spec%%=*}
  # shellcheck disable=SC2086
  build "$o/gemv_$name.o" "$repo/csrc/gemv.cu" ${spec#*=}
done
wait
du -sh "$o"
