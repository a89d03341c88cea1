// dequantize: bit-planes + absmax (flat or tiled64 layout) -> out [N, K] in fp32/fp16/bf16.
//
// Thread mapping: a thread writes 8 consecutive output values of a row (a 16-byte store for
// fp16/bf16) for 4 groups 256 groups apart, loading all 4 groups' words before computing;
// each warp store instruction writes 512 contiguous bytes. grid.y walks the rows. The 4 threads of a
// block read the same k plane words (one sector, merged by L1) and the absmax byte; the
// codebook sits in shared memory (<= 32 floats in 32 banks: lookups never conflict).
// value = codebook[idx] * (absmax * 2^exponent), in float32, rounded once to the output type,
// which makes the result bit-identical to kbit/reference.py: dequantize.
#include "common.cuh"

namespace kbit {
namespace {

constexpr int kThreads = 256;
constexpr int kGroupsPerThread = 4;  // independent 8-value groups per thread: loads in flight

template <typename T, int K_BITS, bool VEC>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(
    const int32_t* __restrict__ packed, const void* __restrict__ absmax, int absmax_format,
    const float* __restrict__ codebook, int64_t N, int64_t K, int64_t KB, int layout,
    float shift_up, T* __restrict__ out) {
  __shared__ float cb[1 << K_BITS];
  if (threadIdx.x < (1 << K_BITS)) cb[threadIdx.x] = codebook[threadIdx.x];
  __syncthreads();

  // grid.x walks a row's 8-value groups, grid.y (strided) the rows: no 64-bit divisions.
  const int64_t g0 = int64_t(blockIdx.x) * kThreads * kGroupsPerThread + threadIdx.x;
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
    uint32_t bytes[kGroupsPerThread][K_BITS];
    float scale[kGroupsPerThread];
#pragma unroll
    for (int i = 0; i < kGroupsPerThread; i++) {
      const int64_t g = g0 + i * kThreads;
      const int64_t kb = g >> 2;
      const int q = int(g & 3);
      if (g * 8 < K) {
        const int64_t bi = block_index(layout, n, kb, N, KB);
        scale[i] = load_absmax(absmax, absmax_format, bi) * shift_up;
        const int32_t* src = packed + bi * K_BITS;
#pragma unroll
        for (int b = 0; b < K_BITS; b++) bytes[i][b] = (uint32_t(__ldg(src + b)) >> (8 * q)) & 0xffu;
      }
    }
#pragma unroll
    for (int i = 0; i < kGroupsPerThread; i++) {
      const int64_t col0 = (g0 + i * kThreads) * 8;
      if (col0 >= K) continue;  // beyond the row (or the padding of a partial last block)
      T vals[8];
#pragma unroll
      for (int j = 0; j < 8; j++) {
        uint32_t idx = 0;
#pragma unroll
        for (int b = 0; b < K_BITS; b++) idx |= ((bytes[i][b] >> j) & 1u) << b;
        vals[j] = from_float<T>(cb[idx] * scale[i]);
      }
      T* dst = out + n * K + col0;
      if (VEC) {
        if constexpr (sizeof(T) == 2) {
          *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(vals);
        } else {
          reinterpret_cast<float4*>(dst)[0] = *reinterpret_cast<const float4*>(vals);
          reinterpret_cast<float4*>(dst)[1] = *reinterpret_cast<const float4*>(vals + 4);
        }
      } else {
#pragma unroll
        for (int j = 0; j < 8; j++)
          if (col0 + j < K) dst[j] = vals[j];
      }
    }
  }
}

template <typename T, int K_BITS>
cudaError_t launch_typed(cudaStream_t stream, const int32_t* packed, const void* absmax, int fmt,
                         const float* codebook, int64_t N, int64_t K, int layout, int exponent,
                         void* out) {
  const int64_t KB = ceil_div(K, kBlock);
  const dim3 grid(unsigned(ceil_div(KB * 4, kThreads * kGroupsPerThread)),
                  unsigned(N < 65535 ? N : 65535));
  const float shift_up = ldexpf(1.f, exponent);
  T* o = static_cast<T*>(out);
  // Vector stores need every 8-value group inside the row and 16-byte aligned rows.
  const bool vec = K % 8 == 0 && (reinterpret_cast<uintptr_t>(out) % 16) == 0;
  if (vec)
    dequantize_kernel<T, K_BITS, true><<<grid, kThreads, 0, stream>>>(
        packed, absmax, fmt, codebook, N, K, KB, layout, shift_up, o);
  else
    dequantize_kernel<T, K_BITS, false><<<grid, kThreads, 0, stream>>>(
        packed, absmax, fmt, codebook, N, K, KB, layout, shift_up, o);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_k(int k, cudaStream_t s, const int32_t* p, const void* a, int fmt,
                     const float* cb, int64_t N, int64_t K, int layout, int e, void* out) {
  switch (k) {
    case 2: return launch_typed<T, 2>(s, p, a, fmt, cb, N, K, layout, e, out);
    case 3: return launch_typed<T, 3>(s, p, a, fmt, cb, N, K, layout, e, out);
    case 4: return launch_typed<T, 4>(s, p, a, fmt, cb, N, K, layout, e, out);
    case 5: return launch_typed<T, 5>(s, p, a, fmt, cb, N, K, layout, e, out);
  }
  return cudaErrorInvalidValue;
}

}  // namespace
}  // namespace kbit

extern "C" int kbit_dequantize(int device, void* stream, const int32_t* packed, const void* absmax,
                               int absmax_format, const float* codebook, int k, int64_t N,
                               int64_t K, int layout, int absmax_exponent, void* out,
                               int out_dtype) {
  using namespace kbit;
  DeviceGuard guard(device);
  if (guard.err != cudaSuccess) return guard.err;
  if (N == 0 || K == 0) return cudaSuccess;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (out_dtype) {
    case KBIT_F32: return launch_k<float>(k, s, packed, absmax, absmax_format, codebook, N, K, layout, absmax_exponent, out);
    case KBIT_F16: return launch_k<__half>(k, s, packed, absmax, absmax_format, codebook, N, K, layout, absmax_exponent, out);
    case KBIT_BF16: return launch_k<__nv_bfloat16>(k, s, packed, absmax, absmax_format, codebook, N, K, layout, absmax_exponent, out);
  }
  return cudaErrorInvalidValue;
}
