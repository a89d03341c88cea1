// quantize: weight [N, K] (fp32/fp16/bf16) -> bit-planes int32 [N, KB, k] + absmax [N, KB].
//
// Thread mapping: 4 threads per 32-value block, 8 consecutive values per thread (one 16-byte
// load for fp16/bf16), so a warp covers 8 blocks = 256 consecutive values of a row and its
// loads and packed-word stores are contiguous. The block absmax is a max over the 4 lanes
// (shfl_xor); each lane packs its 8 indices into bits [8q, 8q+8) of the k planes, and an OR
// over the 4 lanes completes the words. Lane q of a block writes planes q and q + 4.
//
// Index search: the nearest-entry rule (float32 |x - c|, ties to the lower index; see
// kbit/reference.py: nearest_index) is a step function of x with 2**k - 1 steps, because the
// codebook is sorted and its entries are >= 2^-20 apart (so no two rounded distances on one
// side of x can tie). Each CTA computes the exact float32 step positions once (thresholds in
// shared memory: 32 banks, conflict-free) and each value needs only a k-step binary search:
// about half the instructions of a search over the codebook followed by distance checks.
#include "common.cuh"

namespace kbit {
namespace {

constexpr int kThreads = 256;

// d(x, c) = |x - c| rounded to float32, as the reference computes it.
__device__ __forceinline__ float dist(float x, float c) { return fabsf(x - c); }

// float32 <-> an int32 key with the same order (-0 sorts just below +0).
__device__ __forceinline__ int32_t order_key(float f) {
  int32_t i = __float_as_int(f);
  return i ^ ((i >> 31) & 0x7fffffff);
}
__device__ __forceinline__ float from_order_key(int32_t k) {
  return __int_as_float(k ^ ((k >> 31) & 0x7fffffff));
}

// Decision threshold between entries lo < hi: the smallest float32 x with
// d(x, hi) < d(x, lo), i.e. from which the nearest-entry rule (ties to the lower index)
// picks hi over lo. The predicate is monotone in x (false at lo, true at hi), so a bisection
// over the float32 order (32 steps) finds it exactly. (Walking ulps from the midpoint does
// not work: a threshold next to 0 sits ~2^30 subnormal ulps away.)
__device__ float decision_threshold(float lo, float hi) {
  int64_t below = order_key(lo), above = order_key(hi);  // P(below) false, P(above) true
  while (above - below > 1) {
    const int32_t mid = int32_t(below + (above - below) / 2);
    const float x = from_order_key(mid);
    if (dist(x, hi) < dist(x, lo)) above = mid; else below = mid;
  }
  return from_order_key(int32_t(above));
}

__device__ __forceinline__ bool absmax_in_range(float a, int format) {
  if (a == 0.f) return true;
  if (format == KBIT_ABSMAX_E4M4) return a >= 0x1p-14f && a <= 31.f;
  if (format == KBIT_ABSMAX_F16) return a >= 0x1p-24f && a <= 65504.f;
  return a <= 3.402823466e38f;
}

template <typename T, int K_BITS, bool VEC>
__global__ void __launch_bounds__(kThreads) quantize_kernel(
    const T* __restrict__ weight, int64_t N, int64_t K, int64_t ld, int64_t KB,
    const float* __restrict__ codebook, int absmax_format, float shift_down, float shift_up,
    int32_t* __restrict__ packed, void* __restrict__ absmax, int32_t* __restrict__ status,
    FastDivmod blocks_per_row, uint32_t total_blocks) {
  constexpr int n_entries = 1 << K_BITS;
  __shared__ float thresholds[n_entries];  // thresholds[j - 1] separates entries j - 1 and j
  if (threadIdx.x + 1 < n_entries) {
    const float lo = codebook[threadIdx.x], hi = codebook[threadIdx.x + 1];
    // The step-function search is exact only for valid codebooks (docs/format.md); the host
    // does not look at the codebook (no sync), so the kernel reports a bad one.
    const bool valid = hi - lo >= 0x1p-20f && lo >= -1.f && hi <= 1.f;  // false on NaN
    if (!valid && blockIdx.x == 0 && blockIdx.y == 0) atomicOr(&status[2], 1);
    thresholds[threadIdx.x] = valid ? decision_threshold(lo, hi) : 0.f;
  }
  __syncthreads();

  // Persistent: each CTA strides over chunks of 64 consecutive blocks of the flattened
  // [N, KB] block index (4 threads per block), so the threshold prologue runs once per CTA.
  const int q = threadIdx.x & 3;
  constexpr uint32_t chunk = kThreads / 4;
  for (uint32_t base = blockIdx.x * chunk; base < total_blocks; base += gridDim.x * chunk) {
    const uint32_t blk32 = base + (threadIdx.x >> 2);
    // Threads past the end run along with zeros: they take part in the shuffles only.
    const bool in_row = blk32 < total_blocks;
    const uint32_t n = blocks_per_row.div(blk32);
    const int64_t kb = blk32 - n * blocks_per_row.d;
    const int64_t col0 = kb * kBlock + q * 8;
    float w[8];
    if (VEC && in_row) {
      // 8 values = 16 bytes (fp16/bf16) or 32 bytes (fp32); K % 32 == 0 and alignment are
      // checked by the launcher.
      const T* src = weight + int64_t(n) * ld + col0;
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
        w[j] = (in_row && col0 + j < K) ? to_float(weight[int64_t(n) * ld + col0 + j]) : 0.f;
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
    const bool in_range = absmax_in_range(shifted, absmax_format);
    if (!finite) atomicOr(&status[0], 1);
    if (in_row && q == 0 && !in_range && finite) atomicOr(&status[1], 1);
    if (!in_range) shifted = 0.f;

    const int64_t blk = blk32;
    float stored;
    if (absmax_format == KBIT_ABSMAX_E4M4) {
      uint32_t code = e4m4_encode(shifted);
      stored = e4m4_decode(code);
      if (in_row && q == 0) static_cast<uint8_t*>(absmax)[blk] = uint8_t(code);
    } else if (absmax_format == KBIT_ABSMAX_F16) {
      __half h = __float2half_rn(shifted);
      stored = __half2float(h);
      if (in_row && q == 0) static_cast<__half*>(absmax)[blk] = h;
    } else {
      stored = shifted;
      if (in_row && q == 0) static_cast<float*>(absmax)[blk] = shifted;
    }
    const float scale = stored * shift_up;

    uint32_t planes[K_BITS];
#pragma unroll
    for (int b = 0; b < K_BITS; b++) planes[b] = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      // IEEE division (no fast-math). |x| <= 1.5 for any in-range block (the scale rounds
      // absmax by at most that factor); the clamp only keeps NaN/Inf blocks well defined.
      float x = scale > 0.f ? w[j] / scale : 0.f;
      x = fminf(fmaxf(x, -2.f), 2.f);
      // idx = number of thresholds <= x: branchless binary search over n_entries - 1 values
      uint32_t idx = 0;
#pragma unroll
      for (int s = n_entries / 2; s >= 1; s /= 2)
        if (thresholds[idx + s - 1] <= x) idx += s;
#pragma unroll
      for (int b = 0; b < K_BITS; b++) planes[b] |= ((idx >> b) & 1u) << j;  // constant shifts
    }
#pragma unroll
    for (int b = 0; b < K_BITS; b++) planes[b] <<= 8 * q;  // this lane's byte of each plane
#pragma unroll
    for (int b = 0; b < K_BITS; b++) {
      planes[b] |= __shfl_xor_sync(0xffffffffu, planes[b], 1);
      planes[b] |= __shfl_xor_sync(0xffffffffu, planes[b], 2);
    }
    if (in_row) {
      int32_t* dst = packed + blk * K_BITS;
#pragma unroll
      for (int b = 0; b < K_BITS; b++)
        if ((b & 3) == q) dst[b] = int32_t(planes[b]);
    }
  }
}

template <typename T, int K_BITS>
cudaError_t launch_typed(cudaStream_t stream, const void* weight, int64_t N, int64_t K, int64_t ld,
                         const float* codebook, int absmax_format, int absmax_exponent,
                         int32_t* packed, void* absmax, int32_t* status) {
  const int64_t KB = ceil_div(K, kBlock);
  const int64_t total = N * KB;
  if (total >= (int64_t(1) << 32) - kThreads) return cudaErrorInvalidValue;
  const int64_t ctas = ceil_div(total, kThreads / 4);
  const FastDivmod blocks_per_row{uint32_t(KB)};
  const float shift_down = ldexpf(1.f, -absmax_exponent), shift_up = ldexpf(1.f, absmax_exponent);
  const T* w = static_cast<const T*>(weight);
  const bool vec = K % kBlock == 0 && ld % 8 == 0 && (reinterpret_cast<uintptr_t>(weight) % 16) == 0;
  // occupancy of each instantiation, computed once (a static per template instance)
  static const int occupancy_true = ctas_per_sm(quantize_kernel<T, K_BITS, true>, kThreads);
  static const int occupancy_false = ctas_per_sm(quantize_kernel<T, K_BITS, false>, kThreads);
  if (vec)
    quantize_kernel<T, K_BITS, true><<<persistent_grid(occupancy_true, ctas), kThreads, 0, stream>>>(
        w, N, K, ld, KB, codebook, absmax_format, shift_down, shift_up, packed, absmax, status,
        blocks_per_row, uint32_t(total));
  else
    quantize_kernel<T, K_BITS, false><<<persistent_grid(occupancy_false, ctas), kThreads, 0, stream>>>(
        w, N, K, ld, KB, codebook, absmax_format, shift_down, shift_up, packed, absmax, status,
        blocks_per_row, uint32_t(total));
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
