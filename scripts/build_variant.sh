#!/usr/bin/env bash
# Build csrc/ into a separate library for an experiment (device machine), e.g.
#   bash scripts/build_variant.sh /tmp/libw16.so -DKBIT_MMA_WARPS=16
# then run with KBIT_LIBRARY=/tmp/libw16.so. Only sm_90a; objects compiled in parallel.
set -euo pipefail
out=$1; shift
tmp=$(mktemp -d)
for f in csrc/*.cu; do
  nvcc -arch=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -lineinfo -Xcompiler -fPIC -DKBIT_HAS_SM90A "$@" \
    -c "$f" -o "$tmp/$(basename "$f").o" &
done
wait
nvcc -shared -arch=sm_90a "$tmp"/*.o -o "$out" -cudart static
echo "built $out"
