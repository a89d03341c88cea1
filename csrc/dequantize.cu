// dequantize: bit-planes + absmax (flat or tiled64 layout) -> out [N, K] in fp32/fp16/bf16.
//
// Thread mapping: a thread writes 8 consecutive output values of a row (a 16-byte store for
// fp16/bf16) for 2 groups 256 items apart, loading both groups' words before computing.
// Items are numbered row-major for flat (a warp store writes 512 contiguous bytes) and in
// bands of rows for tiled64 (band_rows below). The grid is persistent (as many CTAs as fit
// at once, striding over the item index): with one short-lived CTA per row, the chained
// latencies of each CTA (codebook load, barrier, word loads) capped the big-matrix rate at
// ~50% of the streaming rate (NOTES.md). The 4 threads of a
// block read the same k plane words (one sector, merged by L1) and the absmax byte; the
// codebook sits in shared memory (<= 32 floats in 32 banks: lookups never conflict).
// value = codebook[idx] * (absmax * 2^exponent), in float32, rounded once to the output type,
// which makes the result bit-identical to kbit/reference.py: dequantize.
#include "common.cuh"

namespace kbit {
namespace {

#ifndef KBIT_DQ_THREADS
#define KBIT_DQ_THREADS 256
#endif
constexpr int kThreads = KBIT_DQ_THREADS;
// Independent 8-value groups per thread. Measured on H200 (8192x28672, k = 4, cold): 4 groups
// (48 registers, 5 CTAs/SM) 249 us; 2 groups (38 registers) 200 us; 4 groups with the next
// chunk prefetched (64 registers) 305 us: the kernel is latency-bound and more resident warps
// beat more loads per warp. NOTES.md has the series.
#ifndef KBIT_DQ_GROUPS
#define KBIT_DQ_GROUPS 2  // overridable for experiments (scripts/build_variant.sh)
#endif
constexpr int kGroupsPerThread = KBIT_DQ_GROUPS;
// tiled64 work order: bands of kBand<K> rows, split into segments of kSeg<K> groups (8 values
// each); items run through a segment's groups row by row, then the next segment, then the
// next band. A thread's 2 groups are kThreads items apart: with kSeg = 256 they are the same
// columns of 2 adjacent rows, whose words are adjacent in tiled64. Measured on H100 at
// 8192x28672 (NOTES.md, dequantize v8): row-major (1, 128) gives 82-85% of the GEMV rate at
// every k; (4, 256) 91-93% at k = 2 and 4 but 76-78% at k = 5; (2, 256) 87-88% at k = 3.
// KBIT_DQ_BAND / KBIT_DQ_SEG override every k (experiments).
template <int K_BITS> constexpr uint32_t band_rows() {
#ifdef KBIT_DQ_BAND
  return KBIT_DQ_BAND;
#else
  return K_BITS == 5 ? 1 : K_BITS == 3 ? 2 : 4;
#endif
}
template <int K_BITS> constexpr uint32_t segment_groups() {
#ifdef KBIT_DQ_SEG
  return KBIT_DQ_SEG;
#else
  return K_BITS == 5 ? 128 : 256;
#endif
}


// The 8 values of one group (bytes: codebook_offsets): value = codebook[index] * scale,
// rounded once to T and stored at dst (a 16-byte store for fp16/bf16 when VEC; element-wise,
// stopping at column K, otherwise; col0 = dst's column).
template <typename T, int K_BITS, bool VEC>
__device__ __forceinline__ void decode8(const uint32_t (&bytes)[K_BITS], float scale, const char* cb_bytes,
                                        const uint32_t* spread, T* dst, int64_t col0, int64_t K) {
  uint32_t offs_lo, offs_hi;
  codebook_offsets<K_BITS>(bytes, spread, offs_lo, offs_hi);
  T vals[8];
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const uint32_t lo = __byte_perm(offs_lo, 0, 0x4440 + j), hi = __byte_perm(offs_hi, 0, 0x4440 + j);
    vals[j] = from_float<T>(*reinterpret_cast<const float*>(cb_bytes + lo) * scale);
    vals[j + 4] = from_float<T>(*reinterpret_cast<const float*>(cb_bytes + hi) * scale);
  }
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

template <typename T, int K_BITS, bool VEC, int GROUPS>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(
    const int32_t* __restrict__ packed, const void* __restrict__ absmax, int absmax_format,
    const float* __restrict__ codebook, int64_t N, int64_t K, int64_t KB, int layout,
    float shift_up, FastDivmod item_div, uint32_t total_groups, T* __restrict__ out) {
  __shared__ float cb[1 << K_BITS];
  __shared__ uint32_t spread[16];
  fill_codebook_tables<K_BITS>(cb, spread, codebook);
  __syncthreads();
  const char* cb_bytes = reinterpret_cast<const char*>(cb);
  constexpr uint32_t kBand = band_rows<K_BITS>(), kSeg = segment_groups<K_BITS>();

  // Persistent: each CTA strides over chunks of kThreads * GROUPS consecutive
  // groups of the flattened [N, KB * 4] group index.
  constexpr uint32_t chunk = kThreads * GROUPS;
  for (uint32_t base = blockIdx.x * chunk; base < total_groups; base += gridDim.x * chunk) {
    uint32_t bytes[GROUPS][K_BITS];
    float scale[GROUPS];
    int64_t dst_offset[GROUPS];
#pragma unroll
    for (int i = 0; i < GROUPS; i++) {
      const uint32_t item = base + i * kThreads + threadIdx.x;
      dst_offset[i] = -1;
      uint32_t n, g;
      if (layout == KBIT_LAYOUT_FLAT) {  // item = n * (groups per row) + g
        n = item_div.div(item);
        g = item - n * item_div.d;
      } else {  // item = ((band * S + segment) * kBand + row in band) * kSeg + group in segment
        const uint32_t q = item / kSeg, q2 = q / kBand, band = item_div.div(q2);
        n = band * kBand + q % kBand;
        g = (q2 - band * item_div.d) * kSeg + item % kSeg;
        if (n >= N) continue;  // padding rows of the last band (dst_offset stays -1)
      }
      const int64_t col0 = int64_t(g) * 8;
      if (item < total_groups && col0 < K) {  // skip the padding of a partial last block
        const int64_t bi = block_index(layout, n, g >> 2, N, KB);
        scale[i] = load_absmax(absmax, absmax_format, bi) * shift_up;
        const int32_t* src = packed + bi * K_BITS;
        const int q = g & 3;
        load_words<K_BITS>(bytes[i], src);
#pragma unroll
        for (int b = 0; b < K_BITS; b++) bytes[i][b] >>= 8 * q;
        dst_offset[i] = int64_t(n) * K + col0;
      }
    }
#pragma unroll
    for (int i = 0; i < GROUPS; i++) {
      if (dst_offset[i] < 0) continue;
      decode8<T, K_BITS, VEC>(bytes[i], scale[i], cb_bytes, spread, out + dst_offset[i], dst_offset[i] % K, K);
    }
  }
}


template <typename T, int K_BITS>
cudaError_t launch_typed(cudaStream_t stream, const int32_t* packed, const void* absmax, int fmt,
                         const float* codebook, int64_t N, int64_t K, int layout, int exponent,
                         void* out) {
  constexpr int G = kGroupsPerThread;
  const int64_t KB = ceil_div(K, kBlock);
  const bool flat = layout == KBIT_LAYOUT_FLAT;
  // Items: flat row-major; tiled64 in bands and segments (band_rows / segment_groups), the
  // item count padded to whole bands and segments (padding items write nothing).
  constexpr int64_t kBand = band_rows<K_BITS>(), kSeg = segment_groups<K_BITS>();
  const int64_t segs = ceil_div(KB * 4, kSeg);
  const int64_t total = flat ? N * KB * 4 : ceil_div(N, kBand) * kBand * segs * kSeg;
  if (total >= (int64_t(1) << 32) - kThreads * G) return cudaErrorInvalidValue;
  const int64_t ctas = ceil_div(total, kThreads * G);
  const float shift_up = ldexpf(1.f, exponent);
  const FastDivmod item_div(uint32_t(flat ? KB * 4 : segs));
  T* o = static_cast<T*>(out);
  // Vector stores need every 8-value group inside the row and 16-byte aligned rows.
  const bool vec = K % 8 == 0 && (reinterpret_cast<uintptr_t>(out) % 16) == 0;
  // occupancy of each instantiation, computed once (a static per template instance)
  static const int occupancy_true = ctas_per_sm(dequantize_kernel<T, K_BITS, true, G>, kThreads);
  static const int occupancy_false = ctas_per_sm(dequantize_kernel<T, K_BITS, false, G>, kThreads);
  if (vec)
    dequantize_kernel<T, K_BITS, true, G><<<persistent_grid(occupancy_true, ctas), kThreads, 0, stream>>>(
        packed, absmax, fmt, codebook, N, K, KB, layout, shift_up, item_div, uint32_t(total), o);
  else
    dequantize_kernel<T, K_BITS, false, G><<<persistent_grid(occupancy_false, ctas), kThreads, 0, stream>>>(
        packed, absmax, fmt, codebook, N, K, KB, layout, shift_up, item_div, uint32_t(total), o);
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
