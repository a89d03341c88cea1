// repack: flat [N, KB, k] bit-planes + [N, KB] absmax <-> a runtime layout (tiled64).
// One thread per block slot of the destination (padded KB for tiled64); pure data movement,
// bit-exact with kbit/reference.py: repack / unrepack. Load-time only, not tuned.
#include "common.cuh"

namespace kbit {
namespace {

template <typename A>
__global__ void repack_kernel(const int32_t* __restrict__ packed_in, const A* __restrict__ absmax_in,
                              int k, int64_t N, int64_t KB, int64_t KB_padded, int layout,
                              int to_layout, int32_t* __restrict__ packed_out,
                              A* __restrict__ absmax_out) {
  const int64_t slot = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (to_layout) {
    // slot enumerates the layout's blocks in memory order: (kt, n, j)
    if (slot >= N * KB_padded) return;
    const int64_t j = slot % kTileBlocks, rest = slot / kTileBlocks;
    const int64_t n = rest % N, kb = (rest / N) * kTileBlocks + j;
    const bool real = kb < KB;
    for (int b = 0; b < k; b++) packed_out[slot * k + b] = real ? packed_in[(n * KB + kb) * k + b] : 0;
    absmax_out[slot] = real ? absmax_in[n * KB + kb] : A(0);
  } else {
    // slot enumerates flat blocks (n, kb)
    if (slot >= N * KB) return;
    const int64_t n = slot / KB, kb = slot % KB;
    const int64_t src = block_index(layout, n, kb, N, KB);
    for (int b = 0; b < k; b++) packed_out[slot * k + b] = packed_in[src * k + b];
    absmax_out[slot] = absmax_in[src];
  }
}

template <typename A>
cudaError_t launch(cudaStream_t s, const int32_t* pin, const void* ain, int k, int64_t N,
                   int64_t K, int layout, int to_layout, int32_t* pout, void* aout) {
  const int64_t KB = ceil_div(K, kBlock);
  const int64_t KB_padded = ceil_div(KB, kTileBlocks) * kTileBlocks;
  const int64_t slots = to_layout ? N * KB_padded : N * KB;
  const int threads = 256;
  repack_kernel<A><<<ceil_div(slots, threads), threads, 0, s>>>(
      pin, static_cast<const A*>(ain), k, N, KB, KB_padded, layout, to_layout, pout,
      static_cast<A*>(aout));
  return cudaGetLastError();
}

}  // namespace
}  // namespace kbit

extern "C" int kbit_repack(int device, void* stream, const int32_t* packed_in,
                           const void* absmax_in, int absmax_bytes, int k, int64_t N, int64_t K,
                           int layout, int to_layout, int32_t* packed_out, void* absmax_out) {
  using namespace kbit;
  if (layout != KBIT_LAYOUT_TILED64) return cudaErrorInvalidValue;
  DeviceGuard guard(device);
  if (guard.err != cudaSuccess) return guard.err;
  if (N == 0 || K == 0) return cudaSuccess;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (absmax_bytes) {
    case 1: return launch<uint8_t>(s, packed_in, absmax_in, k, N, K, layout, to_layout, packed_out, absmax_out);
    case 2: return launch<uint16_t>(s, packed_in, absmax_in, k, N, K, layout, to_layout, packed_out, absmax_out);
    case 4: return launch<uint32_t>(s, packed_in, absmax_in, k, N, K, layout, to_layout, packed_out, absmax_out);
  }
  return cudaErrorInvalidValue;
}
