// quantize: weight [N, K] (fp32/fp16/bf16) -> bit-planes int32 [N, KB, k] + absmax [N, KB].
//
// Thread mapping: 2 threads (lanes q = 0, 1) per 32-value block, 16 values per thread, so a
// warp covers 16 blocks = 512 consecutive values of a row. Lane q holds the block's elements
// [8q, 8q + 8) and [16 + 8q, 24 + 8q): for fp16/bf16 two 16-byte loads, each of which reads
// whole 32-byte sectors across the warp. The block absmax is a max over the 2 lanes (one
// shfl_xor); each lane builds its 16 bits of every plane, one exchange per pair of planes
// completes the words, and lane q writes planes q, q + 2, q + 4. (16 values per thread halve
// the per-block work per value: absmax reduction, E4M4 encode, reciprocal, exchange, stores.)
//
// Index search: the nearest-entry rule (float32 |x - c|, ties to the lower index; see
// kbit/reference.py: nearest_index) is a step function of x with 2**k - 1 steps, because the
// codebook is sorted and its entries are >= 2^-20 apart (so no two rounded distances on one
// side of x can tie). Each CTA computes the exact float32 step positions once (thresholds);
// the index of x is the number of thresholds <= x. A bucket table (kBuckets uniform buckets
// over [-2, 2]) holds, per bucket, the number of thresholds in lower buckets. The bucket
// function is monotone, so those thresholds are all < x and those in higher buckets all > x:
// when no bucket holds two thresholds (nf: >= 0.036 apart at k = 5, buckets are 1/64 wide)
// one comparison with the next threshold settles the index. Codebooks with closer thresholds
// (CTA-uniform flag `dense`) walk the thresholds of the bucket instead: exact, only slower.
// Shared loads per value: the bucket byte (~1.2 wavefronts per warp on Gaussian blocks), the
// threshold and the spread word (<= 32 distinct words: conflict-free).
//
// Planes: spread[i] holds bit b of i at bit 8b (b < 4). Summing spread[idx_j] << j over the 8
// values of one run of a lane gives, in byte b, plane b's 8 bits for those elements; byte
// permutes put the two runs and the two lanes' bytes in place. k = 5: bit 4 of the index is
// x >= thresholds[15], accumulated straight into a 16-bit half.
//
// Division: IEEE for fp16/fp32 absmax; for E4M4 a per-block reciprocal (divide_e4m4), exact
// for every input (scripts/check_reciprocal.py). scripts/emulate_quantize.py emulates all of
// this in NumPy against kbit.reference. About 20 instructions per value (SASS, fp16, k = 4,
// E4M4), down from 66 with the k-step binary search, IEEE division and 8 values per thread.
#include <type_traits>

#include "common.cuh"

namespace kbit {
namespace {

constexpr int kThreads = 256;
constexpr int kBuckets = 256;  // over x in [-2, 2]: 1/64 wide

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

// Bucket of x in [0, kBuckets]: round(kBuckets * sat(x / 4 + 1/2)). The .sat clamp also
// sends NaN to bucket 0, so every float gives an in-range bucket. The product u * 2^-141 is
// subnormal, and a subnormal's bits are its value in units of 2^-149: here round(256 u), so
// the bits are the bucket with no conversion instruction (inline PTX: mul.rn.f32 keeps
// subnormals whatever -ftz says). The table is built with this same function, so the search
// needs it to be monotone only (each step is one rounding of a monotone function).
__device__ __forceinline__ uint32_t bucket_of(float x) {
  static_assert(kBuckets == 256, "the scale 2^-141 is kBuckets * 2^-149");
  const float u = __saturatef(__fmaf_rn(x, 0.25f, 0.5f));
  float v;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(v) : "f"(u), "f"(0x1p-141f));
  return __float_as_uint(v);
}

// Element at byte offset `off` of a shared array: the bucket table stores byte offsets, which
// saves a scaling instruction per lookup.
template <typename E>
__device__ __forceinline__ E at_byte(const E* a, uint32_t off) {
  return *reinterpret_cast<const E*>(reinterpret_cast<const char*>(a) + off);
}

// max(a, b) that propagates NaN (fmaxf drops it): the block absmax then flags NaN and Inf
// without a test per value.
__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// x = RN(w / s) for an E4M4 scale s = d * 2^t without an IEEE division per value (~10
// instructions): the caller passes w' = w * 2^-t and y = RN(1 / d), then
//   q0 = RN(w' y),  r = fma(-q0, d, w') = RN(w' - q0 d),  x = fma(r, y, q0).
// Exactness (scripts/check_reciprocal.py): for |w'| >= 2^-66 every intermediate is normal or
// 0, so the outcome depends only on the significands of w' and d (16 for E4M4 values, the
// subnormal codes included) and all 16 * 2^23 pairs give x == RN(w' / d) == RN(w / s).
// (w * 2^-t is exact unless subnormal, which is below that bound.) For |w'| < 2^-66 both x and
// RN(w / s) are <= 2^-48 in magnitude, and all such x have the index of 0: entries with
// |c| >= 2^-22 have ulp >= 2^-45, so RN(|x - c|) = |c|; at most one entry has |c| < 2^-22 (the
// 2^-20 gap rule), and its distance (< 2^-21) beats every other (> 2^-21). So no distance
// depends on x. d = 0 comes with y = 0, which gives x = 0 for any finite w'.
__device__ __forceinline__ float divide_e4m4(float w, float d, float y) {
  const float q0 = __fmul_rn(w, y);
  return __fmaf_rn(__fmaf_rn(-q0, d, w), y, q0);
}

// The search tables of a CTA (shared memory).
template <int K_BITS>
struct SearchTables {
  const float* thresholds;      // [j - 1] separates entries j - 1 and j; [n - 1] is NaN
  const uint32_t* spread;       // bit b < 4 of i at bit 8b
  const uint8_t* bucket_start;  // 4 * number of thresholds in lower buckets

  // Index of x (number of thresholds <= x) as the byte offset 4 * index. The NaN last
  // threshold stops the comparison at the last entry.
  template <bool DENSE>
  __device__ __forceinline__ uint32_t index_offset(float x) const {
    uint32_t off = bucket_start[bucket_of(x)];
    if (DENSE) {
      while (at_byte(thresholds, off) <= x) off += 4;
    } else if (at_byte(thresholds, off) <= x) {
      off += 4;
    }
    return off;
  }

  // A lane's 16 indices as plane bits: runs[r] byte b = plane b's bits of run r (values
  // 8r .. 8r + 7), planes 0..3; bit4 = plane 4's bits of all 16 values (k = 5).
  template <bool DENSE>
  __device__ __forceinline__ void index_bits(const float (&x)[16], uint32_t (&runs)[2],
                                             uint32_t& bit4) const {
    const float top = thresholds[(1 << K_BITS) / 2 - 1];  // k = 5: index >= 16 iff x >= top
    runs[0] = runs[1] = bit4 = 0;
#pragma unroll
    for (int j = 0; j < 16; j++) {
      const uint32_t off = index_offset<DENSE>(x[j]);
      runs[j >> 3] += at_byte(spread, off) << (j & 7);  // disjoint bits: + is |
      if (K_BITS == 5) bit4 |= uint32_t(x[j] >= top) << j;
    }
  }
};

// e4m4_encode (common.cuh) for v in [0, 31] in ~7 integer/FMA instructions instead of
// frexpf and rintf: normal codes round the float32 to 4 fraction bits, ties to even (a carry
// moves into the exponent field, as a code's m == 16 carries into e); subnormal codes are
// rint(v * 2^14), read from the bits of 2^23 + v * 2^14. Checked against kbit.format for
// every float32 in [0, 31] (scripts/emulate_quantize.py).
__device__ __forceinline__ uint32_t e4m4_code(float v) {
  const uint32_t b = __float_as_uint(v);
  const uint32_t normal = ((b + 0x3FFFFu + ((b >> 19) & 1u)) >> 19) - (116u << 4);
  const uint32_t sub = __float_as_uint(__fmaf_rn(v, 0x1p14f, 0x1p23f)) - 0x4B000000u;
  return v < 0x1p-10f ? sub : normal;
}

// max |w| over a lane's 16 values, NaN if any is NaN. fp16/bf16: two values per instruction
// (exact: a max of values of the type).
template <typename T>
__device__ __forceinline__ float lane_absmax(const float (&w)[16], const T (&h)[16]) {
  if constexpr (sizeof(T) == 2) {
    using T2 = typename std::conditional<std::is_same<T, __half>::value, __half2, __nv_bfloat162>::type;
    T2 m = __habs2(T2{h[0], h[1]});
#pragma unroll
    for (int j = 2; j < 16; j += 2) m = __hmax2_nan(m, __habs2(T2{h[j], h[j + 1]}));
    return max_nan(to_float(m.x), to_float(m.y));
  } else {
    float m = 0.f;
#pragma unroll
    for (int j = 0; j < 16; j++) m = max_nan(m, fabsf(w[j]));
    return m;
  }
}

template <typename T, int K_BITS, bool VEC>
__global__ void __launch_bounds__(kThreads) quantize_kernel(
    const T* __restrict__ weight, int64_t N, int64_t K, int64_t ld, int64_t KB,
    const float* __restrict__ codebook, int absmax_format, float shift_down, float shift_up,
    int32_t* __restrict__ packed, void* __restrict__ absmax, int32_t* __restrict__ status,
    FastDivmod blocks_per_row, uint32_t total_blocks) {
  static_assert(kThreads >= 256, "one thread per E4M4 code");
  constexpr int n_entries = 1 << K_BITS;
  __shared__ float thresholds[n_entries];
  __shared__ uint32_t spread[n_entries];
  __shared__ uint8_t bucket_start[kBuckets + 1];
  __shared__ float2 e4m4_scale[256];  // code -> (decoded d, RN(1 / d) or 0)
  const SearchTables<K_BITS> tab{thresholds, spread, bucket_start};
  const int tid = threadIdx.x;
  if (tid < n_entries) {
    float t = __int_as_float(0x7fffffff);  // NaN: x >= NaN is false
    if (tid + 1 < n_entries) {
      const float lo = codebook[tid], hi = codebook[tid + 1];
      // The step-function search is exact only for valid codebooks (docs/format.md); the host
      // does not look at the codebook (no sync), so the kernel reports a bad one.
      const bool valid = hi - lo >= 0x1p-20f && lo >= -1.f && hi <= 1.f;  // false on NaN
      if (!valid && blockIdx.x == 0) atomicOr(&status[2], 1);
      t = valid ? decision_threshold(lo, hi) : 0.f;
    }
    thresholds[tid] = t;
    spread[tid] = (tid & 1) | (tid & 2) << 7 | (tid & 4) << 14 | (tid & 8) << 21;
  }
  if (tid < 256) {
    const float d = e4m4_decode(tid);
    e4m4_scale[tid] = make_float2(d, tid ? __frcp_rn(d) : 0.f);
  }
  __syncthreads();
  for (int b = tid; b <= kBuckets; b += kThreads) {
    uint32_t below = 0;
    for (int i = 0; i + 1 < n_entries; i++) below += bucket_of(thresholds[i]) < uint32_t(b);
    bucket_start[b] = uint8_t(4 * below);
  }
  // Two thresholds in one bucket: one comparison is not enough. (A bad codebook has all
  // thresholds 0, hence dense, and its indices stay in range.)
  const bool dense = __syncthreads_or(
      tid + 2 < n_entries && bucket_of(thresholds[tid]) == bucket_of(thresholds[tid + 1]));

  // Range of the stored format for a nonzero block absmax (after the per-tensor shift).
  const float range_lo = absmax_format == KBIT_ABSMAX_E4M4  ? 0x1p-14f
                         : absmax_format == KBIT_ABSMAX_F16 ? 0x1p-24f : 0.f;
  const float range_hi = absmax_format == KBIT_ABSMAX_E4M4  ? 31.f
                         : absmax_format == KBIT_ABSMAX_F16 ? 65504.f : 3.402823466e38f;
  const int q = tid & 1;
  // Plane word from this lane's pair word and the other lane's: lane 0 takes the low halves
  // (plane 2p), lane 1 the high halves (plane 2p + 1); bytes in element order.
  const uint32_t perm = q ? 0x3726u : 0x5140u;
  // Persistent: each CTA strides over chunks of 128 consecutive blocks of the flattened
  // [N, KB] block index (2 threads per block), so the table prologue runs once per CTA.
  constexpr uint32_t chunk = kThreads / 2;
  for (uint32_t base = blockIdx.x * chunk; base < total_blocks; base += gridDim.x * chunk) {
    const uint32_t blk32 = base + (tid >> 1);
    // Threads past the end redo the last block (no zero-filling branch) and store nothing.
    const bool in_row = blk32 < total_blocks;
    const uint32_t blk_in = in_row ? blk32 : total_blocks - 1;
    const uint32_t n = blocks_per_row.div(blk_in);
    const int64_t kb = blk_in - n * blocks_per_row.d;
    const int64_t col0 = kb * kBlock + 8 * q;  // value j is element 8q + j % 8 + 16 (j / 8)
    const T* src = weight + int64_t(n) * ld + col0;
    T h[16];
    if (VEC) {
      // K % 32 == 0 and 16-byte alignment are checked by the launcher.
      if constexpr (sizeof(T) == 2) {
        reinterpret_cast<uint4*>(h)[0] = *reinterpret_cast<const uint4*>(src);
        reinterpret_cast<uint4*>(h)[1] = *reinterpret_cast<const uint4*>(src + 16);
      } else {
        const float4* s = reinterpret_cast<const float4*>(src);
        reinterpret_cast<float4*>(h)[0] = s[0];
        reinterpret_cast<float4*>(h)[1] = s[1];
        reinterpret_cast<float4*>(h)[2] = s[4];
        reinterpret_cast<float4*>(h)[3] = s[5];
      }
    } else {
#pragma unroll
      for (int j = 0; j < 16; j++) {
        const int64_t e = (j & 7) + 16 * (j >> 3);
        h[j] = col0 + e < K ? src[e] : from_float<T>(0.f);
      }
    }
    float w[16];
#pragma unroll
    for (int j = 0; j < 16; j++) w[j] = to_float(h[j]);

    float amax = lane_absmax<T>(w, h);
    amax = max_nan(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    const bool finite = amax <= 3.402823466e38f;  // false on Inf and NaN

    // Per-tensor power-of-two shift (exact), then round to the stored format.
    float shifted = amax * shift_down;
    const bool in_range = shifted == 0.f || (shifted >= range_lo && shifted <= range_hi);
    if (!finite) atomicOr(&status[0], 1);
    if (in_row && q == 0 && !in_range && finite) atomicOr(&status[1], 1);
    if (!in_range) shifted = 0.f;

    // x = w / scale in place (reference: x = 0 for a zero scale).
    const int64_t blk = blk32;
    const bool writer = in_row && q == 0;
    if (absmax_format == KBIT_ABSMAX_E4M4) {
      const uint32_t code = e4m4_code(shifted);
      const float2 dy = e4m4_scale[code];
      if (writer) static_cast<uint8_t*>(absmax)[blk] = uint8_t(code);
      if (shift_down != 1.f) {
#pragma unroll
        for (int j = 0; j < 16; j++) w[j] *= shift_down;  // exact unless subnormal: see divide_e4m4
      }
#pragma unroll
      for (int j = 0; j < 16; j++) w[j] = divide_e4m4(w[j], dy.x, dy.y);
    } else {
      float stored;
      if (absmax_format == KBIT_ABSMAX_F16) {
        const __half a = __float2half_rn(shifted);
        stored = __half2float(a);
        if (writer) static_cast<__half*>(absmax)[blk] = a;
      } else {
        stored = shifted;
        if (writer) static_cast<float*>(absmax)[blk] = shifted;
      }
      const float scale = stored * shift_up;
      // IEEE division (no fast-math). |x| <= 1.5 for any in-range block (the stored scale
      // rounds absmax by at most that factor); NaN/Inf blocks only need in-range buckets.
#pragma unroll
      for (int j = 0; j < 16; j++) w[j] = scale > 0.f ? w[j] / scale : 0.f;
    }

    uint32_t runs[2], bit4;
    if (dense) tab.template index_bits<true>(w, runs, bit4);
    else tab.template index_bits<false>(w, runs, bit4);

    // This lane's 16-bit halves of planes (2p, 2p + 1) in one word per pair p: bytes
    // (run 0, run 1) of plane 2p, then of plane 2p + 1.
    constexpr int n_pairs = (K_BITS + 1) / 2;
    uint32_t pairs[n_pairs];
    pairs[0] = __byte_perm(runs[0], runs[1], 0x5140);
    if (n_pairs > 1) pairs[1] = __byte_perm(runs[0], runs[1], 0x7362);
    if (n_pairs > 2) pairs[2] = bit4;
    int32_t* dst = packed + blk * K_BITS;
#pragma unroll
    for (int p = 0; p < n_pairs; p++) {
      const uint32_t other = __shfl_xor_sync(0xffffffffu, pairs[p], 1);
      if (in_row && 2 * p + q < K_BITS) dst[2 * p + q] = int32_t(__byte_perm(pairs[p], other, perm));
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
  const int64_t ctas = ceil_div(total, kThreads / 2);
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
