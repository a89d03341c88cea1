// gemv: C[M, N] = A[M, K] @ W^T (+ bias) for M = 1..4, W k-bit in the tiled64 layout.
//
// Each weight is decoded once and used for all M rows, so the kernel streams the packed
// weight at close to DRAM rate when its per-weight instruction count stays small.
//
// Thread mapping: a warp covers 8 consecutive output columns n (lane >> 2) and 4 k-tile
// phases (lane & 3); in tiled64 the 2 * k words of (kt, n) are contiguous and consecutive n
// follow, so each warp load reads 4 runs of 8 * 2k words: whole sectors for every k. The 4
// warps of a CTA split K further (kt = warp * 4 + phase, stride 16), and a shared-memory
// reduction joins them. Per 32-value block the kernel sums x * codebook[idx] in float32 and
// multiplies by the block scale once. Indices come from the same 16-entry spread table as
// dequantize (common.cuh: codebook_offsets; two shared loads per plane per 8 values).
// Activations are staged once per CTA in shared memory as float32 (v1/v2 re-read and
// re-converted them from global memory for every 8 weights; NOTES.md), or read from global
// when M * K is too large for shared memory.
#include "common.cuh"

namespace kbit {
namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 8;      // output columns per warp (and per CTA)
constexpr int kPhases = 4;           // lanes along K per column
constexpr int kTileStride = kWarps * kPhases;

template <typename T>
__device__ __forceinline__ void load8(const T* p, bool vec, int64_t col, int64_t K, float (&v)[8]) {
  if (vec && col + 8 <= K) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
    const T* h = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int j = 0; j < 8; j++) v[j] = to_float(h[j]);
  } else {
#pragma unroll
    for (int j = 0; j < 8; j++) v[j] = col + j < K ? to_float(p[j]) : 0.f;
  }
}

// x staged in shared memory as float32: k-tile kt of row m at xs[m * x_row + kt * kXTile];
// 68 floats per 64-value tile so that the 4 k-tile phases of a warp hit different banks.
constexpr int kXTile = 68;
constexpr int kMaxXSmem = 200 * 1024;  // larger x (M * K beyond ~50k values) is read from global

template <typename T, int K_BITS, int M, bool X_SMEM>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(
    const T* __restrict__ x, int64_t ldx, const int32_t* __restrict__ packed,
    const void* __restrict__ absmax, int absmax_format, const float* __restrict__ codebook,
    int64_t N, int64_t K, int64_t KT, float shift_up, bool vec_x, const T* __restrict__ bias,
    T* __restrict__ out, int64_t ldo, int pdl) {
  __shared__ float cb[1 << K_BITS];
  __shared__ uint32_t spread[16];
  __shared__ float partial[kWarps][kRowsPerWarp][M];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r = lane >> 2, phase = lane & 3;
  const int64_t n = int64_t(blockIdx.x) * kRowsPerWarp + r;
  const bool row_ok = n < N;

  // The words and stored scales of the lane's next k-tile are loaded before the current one
  // is decoded (register double buffer): each lane walks K in few, dependent steps, so
  // without this every step waits a full DRAM latency (v1: ~9-16 us on model shapes,
  // NOTES.md). The weights stream through L2 evict-first (read once per call).
  uint32_t next_words[kTileBlocks * K_BITS];
  uint32_t next_sbits[kTileBlocks];
  auto load_tile = [&](int64_t kt) {
    const int64_t slot = (kt * N + n) * kTileBlocks;  // block index of (kt, n, j = 0)
    const int32_t* src = packed + slot * K_BITS;
#pragma unroll
    for (int i = 0; i < kTileBlocks * K_BITS; i++) next_words[i] = uint32_t(load_ro<true>(src + i));
#pragma unroll
    for (int j = 0; j < kTileBlocks; j++) next_sbits[j] = load_absmax_bits<true>(absmax, absmax_format, slot + j);
  };
  // The first tile goes in flight before the prologue (codebook, x staging, barrier), so
  // its DRAM latency overlaps the prologue's instead of following it.
  const int64_t kt0 = warp * kPhases + phase;
  // PDL (common.cuh): ask for the first tile in L2, then wait for the previous kernel before
  // the first real load. The next kernel may start once every CTA has finished its loads
  // (pdl_trigger below): triggered at entry, the next calls' grids (many small CTAs) became
  // resident while this one ran, and back-to-back calls were up to 2x slower (NOTES.md v16).
  if (pdl > 0) {
    if (pdl >= 2 && row_ok && kt0 < KT) {
      const int64_t slot = (kt0 * N + n) * kTileBlocks;
      prefetch_l2(packed + slot * K_BITS);
      prefetch_l2(packed + (slot + kTileBlocks) * K_BITS - 1);
      prefetch_l2(static_cast<const char*>(absmax) + slot * absmax_bytes(absmax_format));
    }
    pdl_wait();
  }
  if (row_ok && kt0 < KT) load_tile(kt0);

  fill_codebook_tables<K_BITS>(cb, spread, codebook);
  extern __shared__ float xs[];
  const int64_t x_row = KT * kXTile;
  if (X_SMEM) {
    for (int m = 0; m < M; m++)
      for (int64_t c = threadIdx.x; c < KT * 64; c += kWarps * 32)
        xs[m * x_row + (c >> 6) * kXTile + (c & 63)] = c < K ? to_float(x[m * ldx + c]) : 0.f;
  }
  __syncthreads();
  const char* cb_bytes = reinterpret_cast<const char*>(cb);

  float acc[M];
#pragma unroll
  for (int m = 0; m < M; m++) acc[m] = 0.f;

  for (int64_t kt = kt0; row_ok && kt < KT; kt += kTileStride) {
    uint32_t words[kTileBlocks * K_BITS];
    float scales[kTileBlocks];
#pragma unroll
    for (int i = 0; i < kTileBlocks * K_BITS; i++) words[i] = next_words[i];
#pragma unroll
    for (int j = 0; j < kTileBlocks; j++) scales[j] = absmax_of_bits(next_sbits[j], absmax_format) * shift_up;
    if (kt + kTileStride < KT) load_tile(kt + kTileStride);
#pragma unroll
    for (int j = 0; j < kTileBlocks; j++) {
      const float scale = scales[j];
      float block_sum[M];
#pragma unroll
      for (int m = 0; m < M; m++) block_sum[m] = 0.f;
#pragma unroll
      for (int q = 0; q < 4; q++) {  // 8 values at a time
        uint32_t bytes[K_BITS], offs_lo, offs_hi;
#pragma unroll
        for (int b = 0; b < K_BITS; b++) bytes[b] = words[j * K_BITS + b] >> (8 * q);
        codebook_offsets<K_BITS>(bytes, spread, offs_lo, offs_hi);
        float w[8];
#pragma unroll
        for (int e = 0; e < 4; e++) {
          w[e] = *reinterpret_cast<const float*>(cb_bytes + __byte_perm(offs_lo, 0, 0x4440 + e));
          w[e + 4] = *reinterpret_cast<const float*>(cb_bytes + __byte_perm(offs_hi, 0, 0x4440 + e));
        }
        const int64_t col = kt * 64 + j * 32 + q * 8;
#pragma unroll
        for (int m = 0; m < M; m++) {
          float xv[8];
          if (X_SMEM) {
            const float4* p = reinterpret_cast<const float4*>(xs + m * x_row + kt * kXTile + j * 32 + q * 8);
            const float4 a = p[0], b = p[1];
            xv[0] = a.x; xv[1] = a.y; xv[2] = a.z; xv[3] = a.w;
            xv[4] = b.x; xv[5] = b.y; xv[6] = b.z; xv[7] = b.w;
          } else {
            load8(x + m * ldx + col, vec_x, col, K, xv);
          }
#pragma unroll
          for (int e = 0; e < 8; e++) block_sum[m] = fmaf(xv[e], w[e], block_sum[m]);
        }
      }
#pragma unroll
      for (int m = 0; m < M; m++) acc[m] = fmaf(block_sum[m], scale, acc[m]);
    }
  }
  if (pdl > 0) pdl_trigger();
  // join the 4 phases of a column, then the 4 warps
#pragma unroll
  for (int m = 0; m < M; m++) {
    acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], 1);
    acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], 2);
  }
  if (phase == 0) {
#pragma unroll
    for (int m = 0; m < M; m++) partial[warp][r][m] = acc[m];
  }
  __syncthreads();
  if (threadIdx.x < kRowsPerWarp * M) {
    const int rr = threadIdx.x / M, m = threadIdx.x % M;
    const int64_t nn = int64_t(blockIdx.x) * kRowsPerWarp + rr;
    if (nn < N) {
      float v = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; w++) v += partial[w][rr][m];
      if (bias != nullptr) v += to_float(bias[nn]);
      out[m * ldo + nn] = from_float<T>(v);
    }
  }
}

template <typename T, int K_BITS, int M>
cudaError_t launch(int device, cudaStream_t s, const void* x, int64_t ldx, const int32_t* packed,
                   const void* absmax, int fmt, const float* cb, int64_t N, int64_t K,
                   int exponent, const void* bias, void* out, int64_t ldo) {
  const int64_t KT = ceil_div(ceil_div(K, kBlock), kTileBlocks);
  const bool vec_x = ldx % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const int64_t x_bytes = int64_t(M) * KT * kXTile * sizeof(float);
  const unsigned grid = unsigned(ceil_div(N, kRowsPerWarp));
  const T* xt = static_cast<const T*>(x);
  const T* bt = static_cast<const T*>(bias);
  const float shift_up = ldexpf(1.f, exponent);
  auto go = [&](auto x_smem, size_t smem) {
    constexpr auto kernel = gemv_kernel<T, K_BITS, M, decltype(x_smem)::value>;
    const int pdl = pdl_for<kernel>(device);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(kWarps * 32);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    return launch_kernel(cfg, 1, 0, pdl, kernel, xt, ldx, packed, absmax, fmt, cb, N, K, KT, shift_up, vec_x, bt,
                         static_cast<T*>(out), ldo, pdl);
  };
  if (x_bytes <= kMaxXSmem) {
    if (x_bytes > 48 * 1024) {
      cudaError_t err = cudaFuncSetAttribute(gemv_kernel<T, K_BITS, M, true>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxXSmem);
      if (err != cudaSuccess) return err;
    }
    return go(std::true_type{}, size_t(x_bytes));
  }
  return go(std::false_type{}, 0);
}

template <typename T, int K_BITS>
cudaError_t launch_m(int m, int device, cudaStream_t s, const void* x, int64_t ldx, const int32_t* p,
                     const void* a, int fmt, const float* cb, int64_t N, int64_t K, int e,
                     const void* bias, void* out, int64_t ldo) {
  switch (m) {
    case 1: return launch<T, K_BITS, 1>(device, s, x, ldx, p, a, fmt, cb, N, K, e, bias, out, ldo);
    case 2: return launch<T, K_BITS, 2>(device, s, x, ldx, p, a, fmt, cb, N, K, e, bias, out, ldo);
    case 3: return launch<T, K_BITS, 3>(device, s, x, ldx, p, a, fmt, cb, N, K, e, bias, out, ldo);
    case 4: return launch<T, K_BITS, 4>(device, s, x, ldx, p, a, fmt, cb, N, K, e, bias, out, ldo);
  }
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t launch_k(int k, int m, int device, cudaStream_t s, const void* x, int64_t ldx, const int32_t* p,
                     const void* a, int fmt, const float* cb, int64_t N, int64_t K, int e,
                     const void* bias, void* out, int64_t ldo) {
  switch (k) {
    case 2: return launch_m<T, 2>(m, device, s, x, ldx, p, a, fmt, cb, N, K, e, bias, out, ldo);
    case 3: return launch_m<T, 3>(m, device, s, x, ldx, p, a, fmt, cb, N, K, e, bias, out, ldo);
    case 4: return launch_m<T, 4>(m, device, s, x, ldx, p, a, fmt, cb, N, K, e, bias, out, ldo);
    case 5: return launch_m<T, 5>(m, device, s, x, ldx, p, a, fmt, cb, N, K, e, bias, out, ldo);
  }
  return cudaErrorInvalidValue;
}

}  // namespace
}  // namespace kbit

extern "C" int kbit_gemv(int device, void* stream, const void* x, int dtype, int64_t M,
                         int64_t ldx, const int32_t* packed, const void* absmax,
                         int absmax_format, const float* codebook, int k, int64_t N, int64_t K,
                         int absmax_exponent, const void* bias, void* out, int64_t ldo) {
  using namespace kbit;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  return small_m_entry(device, dtype, M, N, 4, [&](auto t) {
    return launch_k<decltype(t)>(k, int(M), device, s, x, ldx, packed, absmax, absmax_format, codebook, N, K,
                                 absmax_exponent, bias, out, ldo);
  });
}
