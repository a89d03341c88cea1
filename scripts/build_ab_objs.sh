#!/usr/bin/env bash
# Build the objects of an A/B of csrc/mma.cu variants on the CPU machine (no device time), for
# scripts/link_ab.sh to link on the device. Objects without -lineinfo (2.5x smaller: the carry
# holds 64 MiB) go to .carry/nl/:
#   - the other csrc objects (api, dequantize, gemv, quantize, repack, wgmma), once;
#   - full.o: the working tree's mma.cu with every kernel (for the tests);
#   - mma_NAME.o per variant NAME="nvcc flags", built with -DKBIT_MMA_AB_ONLY=1 (fp16 + E4M4
#     kernels only: what `kbit bench` times; ~6 MB instead of 15.7) from the working tree's
#     mma.cu, or, for NAME=base, from mma.cu of the revision in $BASE_REV (default main;
#     revisions before session 25 ignore the switch and build every kernel), with that
#     revision's gemv.cu as gemv_base.o (the Scalar column's A/B).
# Two compiles at a time (this machine has 2 cores; mma.cu alone takes ~6 min, an AB_ONLY
# variant ~1-2.5). full.o doubles as the working tree's default variant (link_ab.sh: `full`).
# Example (session 23's set, NOTES.md v28; ~61 MB of objects):
#   bash scripts/build_ab_objs.sh base= cols_d3="-DKBIT_MMA_DEPTH(k)=3" \
#        cols_d3_up3="-DKBIT_MMA_DEPTH(k)=3 -DKBIT_MMA_UPFRONT=3"
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=$repo/.carry/nl
mkdir -p "$out"
tmp=$(mktemp -d)
flags=(-arch=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -Xcompiler -fPIC -DKBIT_HAS_SM90A -I"$repo/csrc")
build() {  # build OUT SRC [flags...], at most 2 at a time
  local o=$1 src=$2; shift 2
  while [ "$(jobs -rp | wc -l)" -ge 2 ]; do sleep 2; done
  ( nvcc "${flags[@]}" "$@" -c "$src" -o "$o" > "$o.log" 2>&1 && echo "built $o" || { echo "FAILED $o"; tail -20 "$o.log"; } ) &
}
build "$out/full.o" "$repo/csrc/mma.cu"
for spec in "$@"; do
  name=${spec%%=*}; vflags=${spec#*=}
  if [ "$name" = base ]; then  # base's mma.cu and gemv.cu (scripts/link_ab.sh links both)
    # the revision's whole csrc/: quoted includes resolve next to the source first
    git -C "$repo" archive "${BASE_REV:-main}" csrc | tar -x -C "$tmp"
    build "$out/mma_base.o" "$tmp/csrc/mma.cu" -DKBIT_MMA_AB_ONLY=1
    build "$out/gemv_base.o" "$tmp/csrc/gemv.cu"
  else
    # shellcheck disable=SC2086
    build "$out/mma_$name.o" "$repo/csrc/mma.cu" -DKBIT_MMA_AB_ONLY=1 $vflags
  fi
done
for f in api dequantize gemv quantize repack wgmma; do build "$out/$f.o" "$repo/csrc/$f.cu"; done
wait
rm -f "$out"/*.log
du -sh "$out"
