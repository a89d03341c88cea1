// dequantize: bit-planes + absmax (flat or tiled64 layout) -> out [N, K] in fp32/fp16/bf16.
//
// Two kernels. dequantize_blocks_kernel (one block per lane, decoded through shared memory;
// described at the kernel) takes tiled64 -> fp16 / bf16 with K % 8 == 0 and an aligned output
// (every call of kbit.linear's dequant + cuBLAS path), except k = 2 on large weights.
// dequantize_kernel takes everything else (flat layout, fp32 output, odd K):
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


// Block-per-lane kernel (dequantize_blocks_kernel below) for tiled64 -> fp16 / bf16 with K % 8
// == 0 and a 16-byte aligned output: used for k where bit k of KBIT_DQ_BLOCKWISE is set,
// except k = 2 on weights of >= kLargeValues values (there dequantize_kernel's band order is
// faster). H100, us, cold (NOTES.md, dequantize v9), dequantize_kernel -> blocks kernel with
// 8-row units and 32 registers: 28672 x 8192 k = 2..5 200 / 222 / 225 / 258 -> 209 / 224 / 229 /
// 241 (with the carveout below); 5120 x 2048 12.0 / 12.8 / 13.2 / 14.8 -> 10.0 / 10.4 / 10.8 /
// 11.2.
#ifndef KBIT_DQ_BLOCKWISE
#define KBIT_DQ_BLOCKWISE 0x3c
#endif
// Rows of a warp's unit of 32 blocks (the unit spans 16 / rows k-tiles of each row). Measured
// (H100, 28672 x 8192, k = 5): 1 row 279-285 us, 2 rows 293-295, 4 rows 258-260, 8 rows
// 240-248, 16 rows 259.
#ifndef KBIT_DQ_ROWS
#define KBIT_DQ_ROWS 8
#endif
// Weights of at least this many values launch the blocks kernel's instantiation that asks for
// the largest shared-memory carveout (28672 x 8192 at k = 5: 248 -> 240 us), smaller ones the
// one without (5120 x 2048: the carveout cost 0.3-1.2 us). The crossover between 10.5M and
// 235M values was not measured.
constexpr int64_t kLargeValues = int64_t(1) << 25;
#ifndef KBIT_DQ_MINB
#define KBIT_DQ_MINB 8  // __launch_bounds__ min blocks of the blocks kernel: 32 registers (NOTES.md dequantize v9)
#endif
constexpr int kUnitRows = KBIT_DQ_ROWS;
constexpr int kUnitKt = 16 / kUnitRows;
static_assert(kUnitRows >= 1 && kUnitRows <= 16 && 16 % kUnitRows == 0, "rows per unit: 1, 2, 4, 8 or 16");
template <int K_BITS> constexpr bool blockwise() { return (KBIT_DQ_BLOCKWISE >> K_BITS) & 1; }

// The 8 values of group q of a block, rounded to T: value = codebook[index] * scale.
template <typename T, int K_BITS>
__device__ __forceinline__ void group_values(const uint32_t (&bytes)[K_BITS], float scale, const char* cb_bytes,
                                             const uint32_t* spread, T (&vals)[8]) {
  uint32_t offs_lo, offs_hi;
  codebook_offsets<K_BITS>(bytes, spread, offs_lo, offs_hi);
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const uint32_t lo = __byte_perm(offs_lo, 0, 0x4440 + j), hi = __byte_perm(offs_hi, 0, 0x4440 + j);
    vals[j] = from_float<T>(*reinterpret_cast<const float*>(cb_bytes + lo) * scale);
    vals[j + 4] = from_float<T>(*reinterpret_cast<const float*>(cb_bytes + hi) * scale);
  }
}

// The 8 values of one group (bytes: codebook_offsets): value = codebook[index] * scale,
// rounded once to T and stored at dst (a 16-byte store for fp16/bf16 when VEC; element-wise,
// stopping at column K, otherwise; col0 = dst's column).
template <typename T, int K_BITS, bool VEC>
__device__ __forceinline__ void decode8(const uint32_t (&bytes)[K_BITS], float scale, const char* cb_bytes,
                                        const uint32_t* spread, T* dst, int64_t col0, int64_t K) {
  T vals[8];
  group_values<T, K_BITS>(bytes, scale, cb_bytes, spread, vals);
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


// Block per lane (tiled64 only, T of 2 bytes, K % 8 == 0, 16-byte aligned out). A warp's unit
// is 32 blocks: kUnitRows rows x kUnitKt k-tiles; lane l loads block l % (32 / rows) of row
// l / (32 / rows) of the unit once (its k words and absmax: no lane repeats another's loads,
// unlike dequantize_kernel's 4 lanes per block), decodes its 32 values into the warp's 2 KB of
// shared memory (16-byte chunks, swizzled: chunk c at c ^ ((c >> 3) & 7), conflict-free for
// both passes) and the warp then stores the unit row by row in 16-byte pieces (kUnitRows = 8:
// each store instruction writes 256 contiguous bytes of 2 rows). Units run band-major
// (kUnitRows rows), k-tile groups fastest; a warp's reads are then kUnitRows * k * 8
// contiguous bytes per k-tile.
// LARGE only tells two instantiations apart (the one for large weights has the carveout set).
template <typename T, int K_BITS, bool LARGE>
__global__ void __launch_bounds__(kThreads, KBIT_DQ_MINB) dequantize_blocks_kernel(
    const int32_t* __restrict__ packed, const void* __restrict__ absmax, int absmax_format,
    const float* __restrict__ codebook, uint32_t N, int64_t K, uint32_t KT, float shift_up,
    FastDivmod group_div, uint32_t units, T* __restrict__ out) {
  static_assert(sizeof(T) == 2, "16-bit outputs");
  constexpr int kWarps = kThreads / 32, kChunksPerRow = 128 / kUnitRows;
  __shared__ float cb[1 << K_BITS];
  __shared__ uint32_t spread[16];
  __shared__ uint4 stage[kWarps][128];  // 32 blocks x 32 values of 2 bytes per warp
  fill_codebook_tables<K_BITS>(cb, spread, codebook);
  __syncthreads();
  const char* cb_bytes = reinterpret_cast<const char*>(cb);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint4* st = stage[warp];
  const uint32_t r = lane / (32 / kUnitRows), b = lane % (32 / kUnitRows);
  // one unit per pass (2 units with both loads first: slower on small weights, NOTES.md
  // dequantize v9)
  for (uint32_t u = blockIdx.x * kWarps + warp; u < units; u += gridDim.x * kWarps) {
    const uint32_t band = group_div.div(u), kg = u - band * group_div.d;
    const uint32_t n = band * kUnitRows + r, kt = kg * kUnitKt + (b >> 1);
    if (n < N && kt < KT) {
      const int64_t bi = block_index(KBIT_LAYOUT_TILED64, n, 2 * int64_t(kt) + (b & 1), N, 2 * int64_t(KT));
      uint32_t w[K_BITS];
      load_words<K_BITS>(w, packed + bi * K_BITS);
      const float scale = load_absmax(absmax, absmax_format, bi) * shift_up;
#pragma unroll
      for (int q = 0; q < 4; q++) {
        uint32_t bytes[K_BITS];
#pragma unroll
        for (int i = 0; i < K_BITS; i++) bytes[i] = w[i] >> (8 * q);
        T vals[8];
        group_values<T, K_BITS>(bytes, scale, cb_bytes, spread, vals);
        const int c = 4 * lane + q;
        st[c ^ ((c >> 3) & 7)] = *reinterpret_cast<const uint4*>(vals);
      }
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int c = lane + 32 * i;
      const uint32_t row = band * kUnitRows + c / kChunksPerRow;
      const int64_t col = int64_t(kg) * kUnitKt * 64 + (c % kChunksPerRow) * 8;
      // chunks of rows >= N or columns >= K (a missing k-tile, the tail of a partial block)
      // were not decoded, or decode padding: never stored
      if (row < N && col < K) *reinterpret_cast<uint4*>(out + int64_t(row) * K + col) = st[c ^ ((c >> 3) & 7)];
    }
    __syncwarp();
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
  if constexpr (sizeof(T) == 2 && blockwise<K_BITS>()) {
    const bool large = N * K >= kLargeValues;
    if (vec && !flat && !(K_BITS == 2 && large)) {
      const int64_t KT = ceil_div(KB, kTileBlocks), groups = ceil_div(KT, kUnitKt);
      const int64_t units = ceil_div(N, kUnitRows) * groups;
      // (< 2^31: the loop index v may pass `units` by a grid of warps without wrapping)
      if (units >= (int64_t(1) << 31) || N >= (int64_t(1) << 32)) return cudaErrorInvalidValue;
      const FastDivmod group_div{uint32_t(groups)};
      auto launch = [&](auto kernel, int occupancy) {
        kernel<<<persistent_grid(occupancy, ceil_div(units, kThreads / 32)), kThreads, 0, stream>>>(
            packed, absmax, fmt, codebook, uint32_t(N), K, uint32_t(KT), shift_up, group_div, uint32_t(units), o);
        return cudaGetLastError();
      };
      if (!large) {
        static const int occupancy = ctas_per_sm(dequantize_blocks_kernel<T, K_BITS, false>, kThreads);
        return launch(dequantize_blocks_kernel<T, K_BITS, false>, occupancy);
      }
      // the largest shared-memory carveout, asked for once per device (a preference: a
      // refusal only costs speed, so its error is cleared)
      auto kernel = dequantize_blocks_kernel<T, K_BITS, true>;
      static bool carveout_set[64] = {};
      int device = 0;
      if (cudaGetDevice(&device) == cudaSuccess && device >= 0 && device < 64 && !carveout_set[device]) {
        if (cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 cudaSharedmemCarveoutMaxShared) != cudaSuccess)
          (void)cudaGetLastError();
        carveout_set[device] = true;
      }
      static const int occupancy = ctas_per_sm(kernel, kThreads);
      return launch(kernel, occupancy);
    }
  }
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
