// wgmma: C[M, N] = x[M, K] @ W^T (+ bias[N]) on Hopper's warpgroup MMA (wgmma, sm_90a), W
// k-bit in the tiled64 layout. For the M where mma.cu (weights decoded into mma.sync
// registers, x staged whole, one token tile per 8 tokens per warp) runs out of warps.
//
// A tiled GEMM: a CTA owns BN weight rows (the wgmma N) and 64 * WG tokens (WG warpgroups of
// 128 threads; warpgroup w takes tokens 64w .. 64w + 63, the wgmma M) and walks K one k-tile
// (64 values) per step. Per step:
// - a producer warp (one more than the warpgroups) starts the step's copies into one of kStages shared stages, completing on the
//   stage's mbarrier: the x tile of each warpgroup by TMA (a 2-D tensor map of x built per call,
//   64 k x 64 tokens, 128-byte swizzle, zeros past M and K), the packed words and absmax of the
//   CTA's rows (contiguous in tiled64) by bulk copies;
// - the CTA's threads decode the BN x 64 weight tile once into shared memory, one thread per
//   8-value group (16 bytes = one row of a core matrix), as kbit.dequantize does: codebook
//   value * block scale in fp32, rounded once to the activation dtype;
// - every warpgroup multiplies its x tile by that tile with 4 wgmma.m64nBNk16, both operands
//   from shared memory, K-major: x in the TMA's 128-byte swizzle (smem_desc_sw128), the
//   weights without swizzle: a core matrix (8 rows x 16 bytes) is 128 contiguous bytes, core
//   matrices adjacent in K lie 128 bytes apart (the descriptor's leading byte offset), adjacent
//   in rows 1024 bytes apart (stride byte offset). Weight tile element (row r, k) sits at
//   ((r / 8) * 8 + k / 8) * 128 + (r % 8) * 16 + (k % 8) * 2.
// The decode of step s + 1 runs while the wgmmas of step s are in flight (two weight tiles).
// The per-tensor power of two multiplies the fp32 accumulator at the end (the 16-bit weights
// cannot overflow: |codebook| <= 1 times a block scale that the format bounds; see
// wgmma_supports in kbit/ops.py for the absmax formats taken).
//
// Status (session 10, H100): correct (tests/test_wgmma.py, compute-sanitizer); still slower
// than dequantize + cuBLAS on the dense model shapes (gateup M = 256: 32 vs 22 us; M = 1024: 96
// vs 43), faster on the 28672x8192 weight at M = 33..64 (225-290 vs 280-430 us), the only place
// the dispatch table (kbit/dispatch_table.py) sends kbit.linear to it. scripts/wgmma_timeline.cu: the decode is
// 30-40% of a step; the copies are issued by an extra producer warp; x through per-thread
// cp.async had been 30-62% of a step (NOTES.md "v10" has the figures and the plan).
//
// Preconditions (the launcher returns cudaErrorInvalidValue otherwise; kbit/ops.py checks them
// before choosing this kernel): N % 8 == 0, K % 8 == 0, x and packed and absmax 16-byte
// aligned, ldx % 8 == 0, out 4-byte aligned with ldo even.
#include <cuda.h>  // CUtensorMap (types only: the encoder comes through cudaGetDriverEntryPointByVersion)
#include <cudaTypedefs.h>

#include "async.cuh"
#include "common.cuh"

// The wgmma instructions exist only in sm_90a code; other targets trap (the launcher only runs
// the kernel on a compute capability 9.0 device whose kernel binary is sm_90: wgmma_capable).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KBIT_WGMMA_ASM(...) asm volatile(__VA_ARGS__)
#elif defined(__CUDA_ARCH__)
#define KBIT_WGMMA_ASM(...) __trap()
#else
#define KBIT_WGMMA_ASM(...)
#endif

namespace kbit {
namespace {

// Timing probes for experiments only (wrong results): KBIT_WG_PROBE bit 0 skips the decode,
// bit 1 the wgmmas, bit 2 the proxy fences (scripts/build_variant.sh -DKBIT_WG_PROBE=...).
#ifndef KBIT_WG_PROBE
#define KBIT_WG_PROBE 0
#endif
// Timeline hook for scripts/wgmma_timeline.cu (empty in the library): point p of step s.
#ifndef KBIT_WG_MARK
#define KBIT_WG_MARK(s, p)
#endif

constexpr int kStepK = 64;                         // k values per step: one tiled64 k-tile
// cp.async stages (steps in flight): 8, 4 with 4 warpgroups (shared memory)
#ifndef KBIT_WG_STAGES
#define KBIT_WG_STAGES 4  // 8 and 12 measured no faster (NOTES.md v10)
#endif
template <int WG> constexpr int kStagesOf = WG == 4 ? 4 : KBIT_WG_STAGES;
constexpr int kTokTile = 64;                       // tokens per warpgroup (the wgmma M)
constexpr int kXTileBytes = kTokTile * kStepK * 2; // one warpgroup's x tile

template <int BN> constexpr int kWTileBytes = BN * kStepK * 2;

// Dynamic shared memory: 2 decoded weight tiles, kStages stages (x tiles of the CTA's
// warpgroups, packed words, absmax with room for fp32), codebook + spread table.
template <int K_BITS, int BN, int WG>
struct Layout {
  static constexpr int x_bytes = WG * kXTileBytes;          // 1024-aligned (128B swizzle atoms)
  static constexpr int packed_bytes = BN * 2 * K_BITS * 4;  // a multiple of 128 (BN >= 32)
  static constexpr int absmax_bytes = BN * 2 * 4;
  static constexpr int stage_bytes = (x_bytes + packed_bytes + absmax_bytes + 1023) / 1024 * 1024;
  static constexpr int stage0 = 2 * kWTileBytes<BN>;         // a multiple of 1024
  static constexpr int tables = stage0 + kStagesOf<WG> * stage_bytes;
  static constexpr int bars = tables + 32 * 4 + 16 * 4;     // kStages mbarriers
  // + 1024: the kernel aligns the dynamic shared window to 1024 bytes itself
  static constexpr int total = bars + kStagesOf<WG> * 8 + 1024;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Orders this thread's generic-proxy shared accesses with later async-proxy ones (wgmma
// operand reads, TMA writes) once a barrier follows.
__device__ __forceinline__ void fence_proxy_async() {
  if (!(KBIT_WG_PROBE & 4)) KBIT_WGMMA_ASM("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void wgmma_fence() { KBIT_WGMMA_ASM("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { KBIT_WGMMA_ASM("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  KBIT_WGMMA_ASM("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of the accumulators across the asynchronous MMAs.
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i])::"memory");
}

// Shared-memory matrix descriptors, K-major. Decoded weights: no swizzle, LBO 128 bytes (K),
// SBO 1024 (rows). x tiles as the TMA writes them with 128-byte swizzle (row r's 16-byte chunk c
// at r * 128 + (c ^ r % 8) * 16, tile 1024-aligned): SBO 1024 (8 rows), LBO unused, mode 1; a
// k16 slice starts 32 bytes further (the swizzle applies to the final address bits).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
  return uint64_t((addr & 0x3FFFFu) >> 4) | (uint64_t(128 >> 4) << 16) | (uint64_t(1024 >> 4) << 32);
}
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t addr) {
  return uint64_t((addr & 0x3FFFFu) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}
// 2-D tensor copy (TMA) of the box at (c0 = k, c1 = token) into shared memory, completing on bar.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  KBIT_BULK_ASM(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar) : "memory");
}

#define KBIT_ACC8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), \
                     "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])

// D[64 tokens, BN] += A[64 tokens, 16 k] * B[BN rows, 16 k]^T (A = x, B = decoded W); TY is the
// PTX type of both operands ("f16" or "bf16").
#define KBIT_WGMMA_N64(TY)                                                                        \
  KBIT_WGMMA_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32." TY \
                 "." TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, " \
                 "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, " \
                 "0, 0;\n}"                                                                      \
                 : KBIT_ACC8(0), KBIT_ACC8(8), KBIT_ACC8(16), KBIT_ACC8(24)                       \
                 : "l"(da), "l"(db), "r"(1))
#define KBIT_WGMMA_N32(TY)                                                                        \
  KBIT_WGMMA_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\nwgmma.mma_async.sync.aligned.m64n32k16.f32." TY \
                 "." TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, " \
                 "p, 1, 1, 0, 0;\n}"                                                             \
                 : KBIT_ACC8(0), KBIT_ACC8(8)                                                     \
                 : "l"(da), "l"(db), "r"(1))
template <typename T, int BN>
__device__ __forceinline__ void wgmma_tile(float (&d)[BN / 2], uint64_t da, uint64_t db) {
  static_assert(BN == 32 || BN == 64, "BN is 32 or 64");
  constexpr bool kHalf = std::is_same<T, __half>::value;
  if constexpr (BN == 64) {
    if constexpr (kHalf) KBIT_WGMMA_N64("f16");
    else KBIT_WGMMA_N64("bf16");
  } else {
    if constexpr (kHalf) KBIT_WGMMA_N32("f16");
    else KBIT_WGMMA_N32("bf16");
  }
}
#undef KBIT_WGMMA_N64
#undef KBIT_WGMMA_N32
#undef KBIT_ACC8

template <typename T, int K_BITS, int BN, int WG>
__global__ void __launch_bounds__(WG * 128 + 32) wgmma_kernel(
    const __grid_constant__ CUtensorMap x_map, int M, const int32_t* __restrict__ packed,
    const void* __restrict__ absmax, int fmt, const float* __restrict__ codebook, int N, int K,
    float shift_up, const T* __restrict__ bias, T* __restrict__ out, int64_t ldo) {
  using L = Layout<K_BITS, BN, WG>;
  constexpr int kThreads = WG * 128;  // the consumer warpgroups; one more warp (the producer,
  // tid >= kThreads) only issues the copies, off the decode's critical path
  constexpr int kStages = kStagesOf<WG>;
  constexpr int kGroups = BN * 8 / kThreads;  // 8-value groups a thread decodes per step
  static_assert(kGroups >= 1 && BN * 8 % kThreads == 0, "BN x 64 tile must split evenly");
  extern __shared__ __align__(1024) char smem_raw[];
  // the x tiles need 1024-byte alignment (128B swizzle atoms); the launch adds 1024 bytes
  char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const int tid = threadIdx.x;
  const int n0 = blockIdx.x * BN, m0 = blockIdx.y * (kTokTile * WG);
  const int KT = (K + kStepK - 1) / kStepK;
  const int esize = fmt == KBIT_ABSMAX_E4M4 ? 1 : fmt == KBIT_ABSMAX_F16 ? 2 : 4;
  const uint32_t bar0 = smem_u32(smem + L::bars);

  // Codebook and spread table (spread[v]: bit j of the 4-bit v at bit 8j + 2, so OR-ing
  // spread[nibble of plane b] << b gives 4 * index of element j in byte j; kbit/dequantize).
  float* cb = reinterpret_cast<float*>(smem + L::tables);
  uint32_t* spread = reinterpret_cast<uint32_t*>(smem + L::tables + 128);
  if (tid < (1 << K_BITS)) cb[tid] = codebook[tid];
  if (tid < 16) {
    uint32_t s = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) s |= ((uint32_t(tid) >> j) & 1u) << (8 * j + 2);
    spread[tid] = s;
  }
  const char* cb_bytes = reinterpret_cast<const char*>(cb);

  // Rows n0 + rows .. n0 + BN - 1 are past N: their packed words and absmax stay zero in every
  // stage (decoded to 0), the copies bring only the first `rows`.
  const int rows = min(BN, N - n0);  // a multiple of 8 (N % 8 == 0)
  const uint32_t p_bytes = rows * 8 * K_BITS, a_bytes = rows * 2 * esize;  // multiples of 16
  if (rows < BN) {
    for (int i = tid; i < kStages * (L::packed_bytes + L::absmax_bytes) / 16; i += kThreads + 32) {
      const int st = i / ((L::packed_bytes + L::absmax_bytes) / 16), o = i % ((L::packed_bytes + L::absmax_bytes) / 16) * 16;
      *reinterpret_cast<uint4*>(smem + L::stage0 + st * L::stage_bytes + L::x_bytes + o) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
  if (tid == 0) {
    for (int st = 0; st < kStages; st++) mbar_init(bar0 + st * 8, 1);
    mbar_fence_init();
  }
  const char* psrc = reinterpret_cast<const char*>(packed + int64_t(n0) * 2 * K_BITS);
  const char* asrc = static_cast<const char*>(absmax) + int64_t(n0) * 2 * esize;
  const int64_t p_step = int64_t(N) * 2 * K_BITS * 4, a_step = int64_t(N) * 2 * esize;  // bytes per k-tile
  // Thread 0: all copies of step s into stage s % kStages, completing on its mbarrier: the x
  // tile of each warpgroup (TMA, zeros past M and K), the packed words and absmax (bulk).
  auto issue = [&](int s) {
    if (s >= KT) return;
    const uint32_t st = smem_u32(smem + L::stage0 + (s % kStages) * L::stage_bytes), bar = bar0 + (s % kStages) * 8;
    fence_proxy_async();  // the stage's earlier generic reads (decode) before the async writes
    mbar_expect_tx(bar, L::x_bytes + p_bytes + a_bytes);
#pragma unroll
    for (int w = 0; w < WG; w++) tma_load_2d(st + w * kXTileBytes, &x_map, s * kStepK, m0 + w * kTokTile, bar);
    bulk_copy(st + L::x_bytes, psrc + s * p_step, p_bytes, bar);
    bulk_copy(st + L::x_bytes + L::packed_bytes, asrc + s * a_step, a_bytes, bar);
  };

  auto decode = [&](int s) {  // weight tile of step s (stage s % kStages) -> tile s & 1
    if (KBIT_WG_PROBE & 1) return;
    const char* st = smem + L::stage0 + (s % kStages) * L::stage_bytes;
    const char* pw = st + L::x_bytes;
    const char* pa = pw + L::packed_bytes;
    char* wt = smem + (s & 1) * kWTileBytes<BN>;
#pragma unroll
    for (int j = 0; j < kGroups; j++) {
      // group i: row r = (i % 8) + 8 (i / 64), 8-value column kc = (i / 8) % 8; its core-matrix
      // row lies at byte 16 i, so a warp's 16-byte stores cover 512 contiguous bytes.
      const int i = tid + j * kThreads;
      const int r = (i & 7) | ((i >> 6) << 3), kc = (i >> 3) & 7;
      const int blk = r * 2 + (kc >> 2), q = kc & 3;
      uint32_t w[K_BITS];
      if constexpr (K_BITS == 4) {
        const uint4 v = *reinterpret_cast<const uint4*>(pw + blk * 16);
        w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
      } else if constexpr (K_BITS == 2) {
        const uint2 v = *reinterpret_cast<const uint2*>(pw + blk * 8);
        w[0] = v.x; w[1] = v.y;
      } else {
#pragma unroll
        for (int b = 0; b < K_BITS; b++) w[b] = reinterpret_cast<const uint32_t*>(pw)[blk * K_BITS + b];
      }
      float scale;
      if (fmt == KBIT_ABSMAX_E4M4) scale = e4m4_decode(reinterpret_cast<const uint8_t*>(pa)[blk]);
      else if (fmt == KBIT_ABSMAX_F16) scale = __half2float(reinterpret_cast<const __half*>(pa)[blk]);
      else scale = reinterpret_cast<const float*>(pa)[blk];
      uint32_t lo = 0, hi = 0;
#pragma unroll
      for (int b = 0; b < K_BITS; b++) {
        const uint32_t byte = w[b] >> (8 * q);
        lo |= spread[byte & 15u] << b;
        hi |= spread[(byte >> 4) & 15u] << b;
      }
      uint4 v;
      uint32_t* vv = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const uint32_t offs = e ? hi : lo;
        const float a = *reinterpret_cast<const float*>(cb_bytes + (offs & 0xffu));
        const float b = *reinterpret_cast<const float*>(cb_bytes + ((offs >> 8) & 0xffu));
        const float c = *reinterpret_cast<const float*>(cb_bytes + ((offs >> 16) & 0xffu));
        const float d = *reinterpret_cast<const float*>(cb_bytes + (offs >> 24));
        vv[2 * e] = Pair<T>::pack(a * scale, b * scale);
        vv[2 * e + 1] = Pair<T>::pack(c * scale, d * scale);
      }
      *reinterpret_cast<uint4*>(wt + i * 16) = v;
    }
  };

  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; i++) acc[i] = 0.f;
  const int wg = tid >> 7;

  // warp-uniform as far as the compiler can see (a shuffle from lane 0): wgmma in a branch on
  // threadIdx directly is serialized by ptxas ("divergent path", C7518)
  const bool producer = __shfl_sync(0xffffffffu, tid >> 7, 0) >= WG, issuer = tid == kThreads;
  __syncthreads();  // tables, zeroed tails, initialised mbarriers
  if (issuer)
    for (int s = 0; s < kStages - 1; s++) issue(s);
  if (!producer) {
    mbar_wait(bar0, 0);  // step 0
    decode(0);
    fence_proxy_async();
  }
  __syncthreads();

  for (int s = 0; s < KT; s++) {
    KBIT_WG_MARK(s, 0);
    const uint32_t xa = smem_u32(smem + L::stage0 + (s % kStages) * L::stage_bytes) + wg * kXTileBytes;
    const uint32_t wb = smem_u32(smem) + (s & 1) * kWTileBytes<BN>;
    if (!producer) {
      fence_regs(acc);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kStepK / 16; kk++)
        if (!(KBIT_WG_PROBE & 2))
          wgmma_tile<T, BN>(acc, smem_desc_sw128(xa + kk * 32), smem_desc(wb + kk * 256));
      wgmma_commit();
      fence_regs(acc);
    }
    if (s + 1 < KT) {
      if (!producer) {
        wgmma_wait<1>();  // this warpgroup's MMAs of step s - 1 are done
        KBIT_WG_MARK(s, 1);
        mbar_wait(bar0 + ((s + 1) % kStages) * 8, ((s + 1) / kStages) & 1);  // copies of step s + 1
        KBIT_WG_MARK(s, 2);
      }
      __syncthreads();  // all MMAs of s - 1 done: its stage and weight tile are free
      KBIT_WG_MARK(s, 3);
      if (producer) {
        if (issuer) issue(s + kStages - 1);  // into the stage of step s - 1
      } else {
        decode(s + 1);  // into the tile of step s - 1
        KBIT_WG_MARK(s, 5);
        fence_proxy_async();
      }
      __syncthreads();
      KBIT_WG_MARK(s, 6);
    }
  }
  if (producer) return;  // no barrier follows
  wgmma_wait<0>();
  fence_regs(acc);

  // Accumulator fragment (per warp of the warpgroup: 16 tokens): acc[4i + 2h + e] is token
  // 16 * warp + g + 8h, weight row 8i + 2c + e (g = lane / 4, c = lane % 4).
  const int warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int i = 0; i < BN / 8; i++) {
    const int n = n0 + 8 * i + 2 * c;
    if (n >= N) continue;
    float b0 = 0.f, b1 = 0.f;
    if (bias != nullptr) {
      b0 = to_float(bias[n]);
      b1 = to_float(bias[n + 1]);
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int tok = m0 + wg * kTokTile + warp * 16 + g + 8 * h;
      if (tok < M)
        *reinterpret_cast<uint32_t*>(out + int64_t(tok) * ldo + n) =
            Pair<T>::pack(acc[4 * i + 2 * h] * shift_up + b0, acc[4 * i + 2 * h + 1] * shift_up + b1);
    }
  }
}

// Configuration forced by kbit_wgmma_force_config (tests, sweeps): BN (32, 64) and WG (1, 2,
// 4); 0 = automatic.
int& forced_bn() { static int v = 0; return v; }
int& forced_wg() { static int v = 0; return v; }

// cuTensorMapEncodeTiled from the driver (no link against libcuda), or null.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// True when `device` is compute capability 9.0, the library has sm_90a code (KBIT_HAS_SM90A,
// set by CMakeLists.txt when the arch list holds 90a; a plain sm_90 binary would trap on the
// wgmma instructions) and runs it here (binary version 90), and the driver gives the
// tensor-map encoder. Manual builds of the library or the harnesses pass -DKBIT_HAS_SM90A.
bool wgmma_capable(int device) {
#ifndef KBIT_HAS_SM90A
  (void)device;
  return false;
#else
  static signed char known[64] = {};  // 0 unknown, 1 yes, -1 no
  if (device < 0 || device >= 64) return false;
  if (known[device] == 0) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    cudaFuncAttributes attr;
    const bool ok = major == 9 && minor == 0 && tensor_map_encoder() != nullptr &&
                    cudaFuncGetAttributes(&attr, wgmma_kernel<__half, 4, 64, 1>) == cudaSuccess &&
                    attr.binaryVersion == 90;
    known[device] = ok ? 1 : -1;
  }
  return known[device] == 1;
#endif
}

// (BN, WG) of a call: WG warpgroups cover up to 64 * WG tokens per CTA; BN = 32 when BN = 64
// leaves more than a third of the SMs idle.
void choose(int device, int64_t M, int64_t N, int& bn, int& wg) {
  wg = M <= 64 ? 1 : M <= 128 ? 2 : 4;
  if (forced_wg() != 0) wg = forced_wg();
  const int64_t mtiles = ceil_div(M, 64 * wg);
  bn = (wg < 4 && ceil_div(N, 64) * mtiles * 3 < int64_t(device_info(device).sms) * 2) ? 32 : 64;
  if (forced_bn() != 0) bn = forced_bn();
  if (bn == 32 && wg == 4) wg = 2;  // BN = 32 x 64 groups do not split over 512 threads
}

template <typename T, int K_BITS, int BN, int WG>
cudaError_t launch_cfg(int device, cudaStream_t stream, const void* x, int64_t M, int64_t ldx,
                       const int32_t* packed, const void* absmax, int fmt, const float* codebook,
                       int64_t N, int64_t K, int exponent, const void* bias, void* out, int64_t ldo) {
  constexpr auto kernel = wgmma_kernel<T, K_BITS, BN, WG>;
  constexpr int smem = Layout<K_BITS, BN, WG>::total;
  static cudaError_t attr_err[64];
  static bool attr_done[64] = {};
  if (!attr_done[device]) {
    attr_err[device] = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    attr_done[device] = true;
  }
  if (attr_err[device] != cudaSuccess) return attr_err[device];
  // x as a 2-D tensor [M, K] (row stride ldx) read in boxes of 64 k x 64 tokens with 128-byte
  // swizzle; out-of-range elements (tokens >= M, k >= K) arrive as zeros.
  CUtensorMap x_map;
  const cuuint64_t dims[2] = {cuuint64_t(K), cuuint64_t(M)}, strides[1] = {cuuint64_t(ldx) * 2};
  const cuuint32_t box[2] = {kStepK, kTokTile}, elem_strides[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(
      &x_map, std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
      const_cast<void*>(x), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return cudaErrorInvalidValue;
  const dim3 grid(unsigned(ceil_div(N, BN)), unsigned(ceil_div(M, kTokTile * WG)));
  kernel<<<grid, WG * 128 + 32, smem, stream>>>(
      x_map, int(M), packed, absmax, fmt, codebook, int(N), int(K), ldexpf(1.f, exponent),
      static_cast<const T*>(bias), static_cast<T*>(out), ldo);
  return cudaGetLastError();
}

template <typename T, int K_BITS>
cudaError_t launch_bits(int device, cudaStream_t s, const void* x, int64_t M, int64_t ldx,
                        const int32_t* p, const void* a, int fmt, const float* cb, int64_t N,
                        int64_t K, int e, const void* bias, void* out, int64_t ldo) {
  int bn, wg;
  choose(device, M, N, bn, wg);
#define KBIT_WG_CASE(BN_, WG_)                                                                    \
  if (bn == BN_ && wg == WG_)                                                                     \
    return launch_cfg<T, K_BITS, BN_, WG_>(device, s, x, M, ldx, p, a, fmt, cb, N, K, e, bias, out, ldo);
  KBIT_WG_CASE(32, 1) KBIT_WG_CASE(32, 2) KBIT_WG_CASE(64, 1) KBIT_WG_CASE(64, 2) KBIT_WG_CASE(64, 4)
#undef KBIT_WG_CASE
  return cudaErrorInvalidValue;
}

}  // namespace
}  // namespace kbit

extern "C" int kbit_wgmma_available(int device) { return kbit::wgmma_capable(device) ? 1 : 0; }

extern "C" void kbit_wgmma_force_config(int bn, int wg) {
  kbit::forced_bn() = bn;
  kbit::forced_wg() = wg;
}

extern "C" int kbit_wgmma(int device, void* stream, const void* x, int dtype, int64_t M, int64_t ldx,
                          const int32_t* packed, const void* absmax, int absmax_format,
                          const float* codebook, int k, int64_t N, int64_t K, int absmax_exponent,
                          const void* bias, void* out, int64_t ldo) {
  using namespace kbit;
  DeviceGuard guard(device);
  if (guard.err != cudaSuccess) return guard.err;
  if (M == 0 || N == 0) return cudaSuccess;
  if (!wgmma_capable(device)) return cudaErrorNotSupported;
  const auto misaligned = [](const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a != 0; };
  if (N % 8 || K % 8 || ldx % 8 || ldo % 2 || N >= (int64_t(1) << 31) || K >= (int64_t(1) << 31) ||
      M >= (int64_t(1) << 31) || misaligned(x, 16) || misaligned(packed, 16) || misaligned(absmax, 16) ||
      misaligned(out, 4) || absmax_format < 0 || absmax_format > 2)
    return cudaErrorInvalidValue;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  auto by_k = [&](auto t) -> cudaError_t {
    using T = decltype(t);
    switch (k) {
      case 2: return launch_bits<T, 2>(device, s, x, M, ldx, packed, absmax, absmax_format, codebook, N, K, absmax_exponent, bias, out, ldo);
      case 3: return launch_bits<T, 3>(device, s, x, M, ldx, packed, absmax, absmax_format, codebook, N, K, absmax_exponent, bias, out, ldo);
      case 4: return launch_bits<T, 4>(device, s, x, M, ldx, packed, absmax, absmax_format, codebook, N, K, absmax_exponent, bias, out, ldo);
      case 5: return launch_bits<T, 5>(device, s, x, M, ldx, packed, absmax, absmax_format, codebook, N, K, absmax_exponent, bias, out, ldo);
    }
    return cudaErrorInvalidValue;
  };
  switch (dtype) {
    case KBIT_F16: return by_k(__half());
    case KBIT_BF16: return by_k(__nv_bfloat16());
  }
  return cudaErrorInvalidValue;
}
