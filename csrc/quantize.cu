// quantize: weight [N, K] (fp32/fp16/bf16) -> bit-planes int32 [N, KB, k] + absmax [N, KB].
//
// Thread mapping: 4 threads per 32-value block, 8 consecutive values per thread (one 16-byte
// load for fp16/bf16), so a warp covers 8 blocks = 256 consecutive values of a row and its
// loads and packed-word stores are contiguous. The block absmax is a max over the 4 lanes
// (shfl_xor); each lane packs its 8 indices into bits [8q, 8q+8) of the k planes, and an OR
// over the 4 lanes completes the words. Lane q of a block writes planes q and q + 4.
//
// Index search: binary search over the codebook in shared memory (32 floats = 32 banks, so any
// warp-wide lookup is conflict-free), then the float32 distances |x - c| of the two
// neighbours decide; ties go to the lower index, walking down runs of equal rounded distances
// so the result equals argmin over all entries (kbit/reference.py: nearest_index) exactly.
#include "common.cuh"

namespace kbit {
namespace {

template <int K_BITS>
__device__ __forceinline__ uint32_t nearest_index(float x, const float* cb) {
  constexpr int n = 1 << K_BITS;
  int cnt = 0;  // number of entries <= x
#pragma unroll
  for (int s = n / 2; s >= 1; s /= 2)
    if (cb[cnt + s - 1] <= x) cnt += s;
  if (cnt < n && cb[cnt] <= x) cnt++;
  if (cnt == 0) return 0;
  int idx = cnt - 1;
  float d = fabsf(x - cb[idx]);
  if (cnt < n) {
    float d_hi = fabsf(x - cb[cnt]);
    if (d_hi < d) return cnt;
  }
  while (idx > 0 && fabsf(x - cb[idx - 1]) == d) idx--;
  return idx;
}

__device__ __forceinline__ bool absmax_in_range(float a, int format) {
  if (a == 0.f) return true;
  if (format == KBIT_ABSMAX_E4M4) return a >= 0x1p-14f && a <= 31.f;
  if (format == KBIT_ABSMAX_F16) return a >= 0x1p-24f && a <= 65504.f;
  return a <= 3.402823466e38f;
}

template <typename T, int K_BITS, bool VEC>
__global__ void __launch_bounds__(256) quantize_kernel(
    const T* __restrict__ weight, int64_t N, int64_t K, int64_t ld, int64_t KB,
    const float* __restrict__ codebook, int absmax_format, float shift_down, float shift_up,
    int32_t* __restrict__ packed, void* __restrict__ absmax, int32_t* __restrict__ status) {
  __shared__ float cb[1 << K_BITS];
  if (threadIdx.x < (1 << K_BITS)) cb[threadIdx.x] = codebook[threadIdx.x];
  __syncthreads();

  const int64_t gid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t blk = gid >> 2;
  const int q = threadIdx.x & 3;
  // Whole warps run (N * KB * 4 is padded to the grid); out-of-range threads hold zeros and
  // only take part in the shuffles.
  const bool active = blk < N * KB;
  const int64_t n = active ? blk / KB : 0, kb = active ? blk % KB : 0;
  const int64_t col0 = kb * kBlock + q * 8;

  float w[8];
  if (VEC && active) {
    // 8 values = 16 bytes (fp16/bf16) or 32 bytes (fp32); K % 32 == 0 and alignment checked
    // by the launcher.
    const T* src = weight + n * ld + col0;
    if constexpr (sizeof(T) == 2) {
      uint4 v = *reinterpret_cast<const uint4*>(src);
      const T* h = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int j = 0; j < 8; j++) w[j] = to_float(h[j]);
    } else {
      float4 a = reinterpret_cast<const float4*>(src)[0], b = reinterpret_cast<const float4*>(src)[1];
      w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w; w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; j++)
      w[j] = (active && col0 + j < K) ? to_float(weight[n * ld + col0 + j]) : 0.f;
  }

  float amax = 0.f;
  bool finite = true;
#pragma unroll
  for (int j = 0; j < 8; j++) {
    finite &= isfinite(w[j]);
    amax = fmaxf(amax, fabsf(w[j]));
  }
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));

  // Per-tensor power-of-two shift (exact), then round to the stored format.
  float shifted = amax * shift_down;
  bool in_range = absmax_in_range(shifted, absmax_format);
  if (!finite) atomicOr(&status[0], 1);
  if (active && q == 0 && !in_range && finite) atomicOr(&status[1], 1);
  if (!in_range || !finite) shifted = 0.f;

  float stored;
  if (absmax_format == KBIT_ABSMAX_E4M4) {
    uint32_t code = e4m4_encode(shifted);
    stored = e4m4_decode(code);
    if (active && q == 0) static_cast<uint8_t*>(absmax)[blk] = uint8_t(code);
  } else if (absmax_format == KBIT_ABSMAX_F16) {
    __half h = __float2half_rn(shifted);
    stored = __half2float(h);
    if (active && q == 0) static_cast<__half*>(absmax)[blk] = h;
  } else {
    stored = shifted;
    if (active && q == 0) static_cast<float*>(absmax)[blk] = shifted;
  }
  const float scale = stored * shift_up;

  uint32_t planes[K_BITS];
#pragma unroll
  for (int b = 0; b < K_BITS; b++) planes[b] = 0;
#pragma unroll
  for (int j = 0; j < 8; j++) {
    float x = scale > 0.f ? w[j] / scale : 0.f;  // IEEE division (no fast-math)
    if (!isfinite(x)) x = 0.f;
    uint32_t idx = nearest_index<K_BITS>(x, cb);
#pragma unroll
    for (int b = 0; b < K_BITS; b++) planes[b] |= ((idx >> b) & 1u) << (q * 8 + j);
  }
#pragma unroll
  for (int b = 0; b < K_BITS; b++) {
    planes[b] |= __shfl_xor_sync(0xffffffffu, planes[b], 1);
    planes[b] |= __shfl_xor_sync(0xffffffffu, planes[b], 2);
  }
  if (active) {
    int32_t* dst = packed + blk * K_BITS;
#pragma unroll
    for (int b = 0; b < K_BITS; b++)
      if ((b & 3) == q) dst[b] = int32_t(planes[b]);
  }
}

template <typename T, int K_BITS>
cudaError_t launch_typed(cudaStream_t stream, const void* weight, int64_t N, int64_t K, int64_t ld,
                         const float* codebook, int absmax_format, int absmax_exponent,
                         int32_t* packed, void* absmax, int32_t* status) {
  const int64_t KB = ceil_div(K, kBlock);
  const int threads = 256;
  const int64_t grid = ceil_div(N * KB * 4, threads);
  const float shift_down = ldexpf(1.f, -absmax_exponent), shift_up = ldexpf(1.f, absmax_exponent);
  const T* w = static_cast<const T*>(weight);
  const bool vec = K % kBlock == 0 && ld % 8 == 0 && (reinterpret_cast<uintptr_t>(weight) % 16) == 0;
  if (vec)
    quantize_kernel<T, K_BITS, true><<<grid, threads, 0, stream>>>(
        w, N, K, ld, KB, codebook, absmax_format, shift_down, shift_up, packed, absmax, status);
  else
    quantize_kernel<T, K_BITS, false><<<grid, threads, 0, stream>>>(
        w, N, K, ld, KB, codebook, absmax_format, shift_down, shift_up, packed, absmax, status);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_k(int k, cudaStream_t s, const void* w, int64_t N, int64_t K, int64_t ld,
                     const float* cb, int fmt, int e, int32_t* p, void* a, int32_t* st) {
  switch (k) {
    case 2: return launch_typed<T, 2>(s, w, N, K, ld, cb, fmt, e, p, a, st);
    case 3: return launch_typed<T, 3>(s, w, N, K, ld, cb, fmt, e, p, a, st);
    case 4: return launch_typed<T, 4>(s, w, N, K, ld, cb, fmt, e, p, a, st);
    case 5: return launch_typed<T, 5>(s, w, N, K, ld, cb, fmt, e, p, a, st);
  }
  return cudaErrorInvalidValue;
}

}  // namespace
}  // namespace kbit

extern "C" int kbit_quantize(int device, void* stream, const void* weight, int weight_dtype,
                             int64_t N, int64_t K, int64_t ld, const float* codebook, int k,
                             int absmax_format, int absmax_exponent, int32_t* packed,
                             void* absmax, int32_t* status) {
  using namespace kbit;
  DeviceGuard guard(device);
  if (guard.err != cudaSuccess) return guard.err;
  if (N == 0 || K == 0) return cudaSuccess;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (weight_dtype) {
    case KBIT_F32: return launch_k<float>(k, s, weight, N, K, ld, codebook, absmax_format, absmax_exponent, packed, absmax, status);
    case KBIT_F16: return launch_k<__half>(k, s, weight, N, K, ld, codebook, absmax_format, absmax_exponent, packed, absmax, status);
    case KBIT_BF16: return launch_k<__nv_bfloat16>(k, s, weight, N, K, ld, codebook, absmax_format, absmax_exponent, packed, absmax, status);
  }
  return cudaErrorInvalidValue;
}
