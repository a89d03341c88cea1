# Sourced by the device scripts (gpu_check.sh, pdl_ab.sh) from the repo root, with $OUT set:
# use the library carried in .carry/libkbit_cuda.so when it loads on this machine, else build
# and install the package (~5.5 min of device time on the H100 machine's 16 cores, mostly
# csrc/mma.cu). Build the carried library on the CPU machine first (no device time; ~10 min on
# 2 cores) and name .carry in the device call's `carry`:
#   bash scripts/build_variant.sh .carry/libkbit_cuda.so     # sm_90a, static cudart
# Afterwards kbit runs as `python3 -m kbit.cli` from any directory; $kbit_build says which.
repo=$PWD
if [ -f .carry/libkbit_cuda.so ] &&
   KBIT_LIBRARY=$repo/.carry/libkbit_cuda.so PYTHONPATH=$repo \
     python3 -c "import kbit, sys; sys.exit(0 if kbit.native_available() else 1)"; then
  export KBIT_LIBRARY=$repo/.carry/libkbit_cuda.so PYTHONPATH=$repo
  kbit_build="carried library .carry/libkbit_cuda.so ($(date -r .carry/libkbit_cuda.so '+%F %T'))"
else
  [ -f .carry/libkbit_cuda.so ] && echo "the carried .carry/libkbit_cuda.so does not load here: building"
  t0=$(date +%s)
  if ! CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -v . > "$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"; echo "BUILD FAILED"; exit 1
  fi
  kbit_build="built and installed ($(( $(date +%s) - t0 ))s) $(grep -m1 'kbit: building' "$OUT/build.log")"
fi
