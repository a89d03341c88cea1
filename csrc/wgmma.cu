// wgmma: C[M, N] = x[M, K] @ W^T (+ bias[N]) on Hopper's warpgroup MMA (wgmma, sm_90a), W
// k-bit in the tiled64 layout; any M (kbit.linear sends it the M where it measured fastest).
//
// The weights are the wgmma's A operand, decoded straight into registers; x is the B operand,
// read from shared memory. D[64 weight rows, TN tokens] += A[64 rows, 16 k] * B[16 k, TN].
//
// CTA: WG consumer warpgroups (warpgroup w owns weight rows 64w .. 64w + 63 of the CTA's
// 64 * WG) and one producer warp (a producer warpgroup that hands its registers to the
// consumers at TN = 256, WG = 2: kRegSplit); a tile of TN tokens shared by the warpgroups; K split over
// the `splits` CTAs of a cluster (blockIdx.z; 1 = no split). Per 64-k step (one tiled64
// k-tile):
// - the producer warp fills one of S shared stages, completing on the stage's "full"
//   mbarrier: the x tile (TMA 2-D tensor copy, 64 k x TN tokens, 128-byte swizzle, zeros past
//   M and K) and the packed words and absmax of the CTA's rows (contiguous in tiled64; bulk
//   copies); it refills a stage once every consumer warp has arrived on its "empty" mbarrier;
// - each consumer lane (g = lane / 4, c = lane % 4 of warp q of warpgroup w) decodes the A
//   fragments of rows r = 64w + 16q + g and r + 8: the mma.m16n8k16 A layout, which is what
//   wgmma takes from registers (a0: row g, k 2c, 2c + 1; a1: row g + 8; a2, a3: k + 8). In a
//   32-value block, lane c needs positions 8y + 2c and 8y + 2c + 1 (y = 0..3): rotating each
//   bit-plane word right by 2c - 2b and masking bits 2b, 2b + 1 of every byte gathers, in byte
//   y, the k-bit indices of those two values interleaved (bit 2b: first value's bit b, bit
//   2b + 1: second's). One shared load of a private per-lane table (mma.cu's addressing: the
//   byte of indices is byte 1 of the address, PRMT) returns the two codebook values packed,
//   one packed multiply applies the block scale. k = 5: the fifth plane's two bits go to
//   bits 6-7 of byte 0 (mma.cu's entry_addr5 table, 16 columns shared by 2 lanes); a CTA
//   alone on its SM (TN = 128) uses a 128 KB table with a column per lane (entry_addr5w);
// - 4 wgmma.m64nTNk16 (A from registers, B = x: K-major, 128-byte swizzle) per warpgroup;
//   the decode of step s + 1 runs while those of step s are in flight (wait_group 1).
// x is read in its natural k order (no staging through registers), decoded weights never go
// through shared memory, and the decode costs ~1 shared load per 2 values.
// Epilogue: splits == 1: each warp puts its accumulators (with the per-tensor power of two and
// the bias, rounded to T) into shared memory transposed by stmatrix, and writes 8 rows of one
// token per 16-byte store. splits > 1: every CTA puts its
// tile into shared memory (fp16 with a power-of-two scale per CTA: half the bytes of fp32),
// the cluster synchronizes, and CTA z adds tokens t with t % splits == z over the cluster
// (distributed shared memory) in fp32 and writes them.
//
// The per-tensor power of two multiplies the fp32 accumulator at the end (the 16-bit weights
// cannot overflow: |codebook| <= 1 times a block scale that the format bounds; see
// wgmma_supports in kbit/ops.py for the absmax formats taken).
//
// Preconditions (the launcher returns cudaErrorInvalidValue otherwise; kbit/ops.py checks them
// before choosing this kernel): N % 8 == 0, K % 8 == 0, x and packed and absmax 16-byte
// aligned, ldx % 8 == 0.
#include <cstdio>
#include <cstdlib>
#include <cuda.h>  // CUtensorMap (types only: the encoder comes through cudaGetDriverEntryPointByVersion)
#include <cudaTypedefs.h>

#include "async.cuh"
#include "common.cuh"
#include "tc.cuh"

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
// bit 1 the wgmmas, bit 2 the weight copies, bit 3 the x copies, bit 4 the unsplit epilogue's
// global stores of C, bit 5 that whole epilogue (scripts/build_variant.sh -DKBIT_WG_PROBE=...).
#ifndef KBIT_WG_PROBE
#define KBIT_WG_PROBE 0
#endif
// The unsplit epilogue's C stores as whole 128-byte token rows: 1 (default) where WG = 1 and
// TN >= 128 (the M = 97..256 plans, stream-K owners included), 0 nowhere, 2 everywhere
// (experiments). H200 A/B (NOTES.md v57): dense TOTAL M = 128 and 256 -0.5..-1.5 us at every k
// with whole rows at WG = 1; M = 64 k = 2 +0.4 us and M = 1024 (WG = 2) k = 5 +1..+4 us with
// them everywhere (the H100 saw the same at M = 1024, v44).
#ifndef KBIT_WG_FULLLINE_C
#define KBIT_WG_FULLLINE_C 1
#endif
// Timeline hook for scripts/wgmma_timeline.cu (empty in the library): point p of step s.
#ifndef KBIT_WG_MARK
#define KBIT_WG_MARK(s, p)
#endif
// Timeline hook for the phases of a call (0 entry, 7 setup done, 1 tables built, 2 main loop
// done, 3 partials written, 4 reduced, 5 end; 6 first copies landed): empty in the library.
#ifndef KBIT_WG_PHASE
#define KBIT_WG_PHASE(p)
#endif
// Timeline hook: consumer thread 0 of every CTA at its entry (0), when it has written its
// share of C or published its partial (1), when its last segment's MMAs are done (2) and
// after the stream-K partial adds (3): empty in the library.
#ifndef KBIT_WG_CTA
#define KBIT_WG_CTA(p)
#endif

constexpr int kStepK = 64;      // k values per step: one tiled64 k-tile
constexpr int kWgRows = 64;     // weight rows per warpgroup (the wgmma M)
constexpr int kMaxStages = 6;   // shared stages (steps in flight) at most (16 measured no faster)
constexpr int kMaxSplits = 8;   // CTAs per cluster (portable limit)
// The codebook table sits at this constant offset in the CTA's shared window (at or past the
// start of dynamic shared memory: the end of the 1 KB the system reserves on sm_90;
// wgmma_capable checks the reservation). The window itself starts at a multiple of 2^24 in a
// cluster launch (CTA rank r: r << 24; H100, NOTES.md v17), so a lookup is one PRMT forming
// (window's high bytes | index byte << 8 | lane column) and one LDS with kTableAt as its
// immediate offset. (It used to sit at a 64 KB aligned address whose high
// bytes the PRMT merged in: every CTA then needed >= 128 KB at k = 4 and 5, one CTA per SM,
// while k = 2 and 3 ran 2-3 per SM and were up to 1.8x faster at M <= 64; NOTES.md v17.)
constexpr uint32_t kTableAt = 1024;
// Stages at least, when fewer stages let 2 CTAs share an SM (stages_for).
constexpr int kMinSharedStages = 3;

// Private per-lane codebook table: k = 2..4: 2^(2k) entries (a byte of two interleaved k-bit
// indices) of 256 bytes (lane L's pair at L * 4; the upper half unused); k = 5: 1024 entries
// (low byte as for k = 4, 2 high bits) at lo * 256 + hi * 64 + (L % 16) * 4: lanes L and L + 16
// share a column, so a lookup is 2 shared-memory wavefronts whenever their first values' high
// bits agree. W5 ("wide", k = 5 only): entry (lo, hi0, hi1) of lane L at hi1 << 16 | lo << 8 |
// hi0 << 7 | L << 2, 128 KB and free of bank conflicts (entry_addr5w), for CTAs that run one
// per SM anyway (M = 256, random weights: down, O, KV 0.3-0.8 us faster per call; NOTES.md
// v21).
template <int K_BITS, bool W5 = false>
constexpr uint32_t kTableBytes = W5 ? 128 * 1024 : K_BITS == 5 ? 64 * 1024 : 256u << (2 * K_BITS);
// Solo k = 5 CTAs take the wide table when it leaves them at least this many stages: TN = 128
// (4-5 stages) yes; TN = 256 has 2, and its steps then took 1.5x as long (gateup M = 256 20.3
// -> 36.1 us, NOTES.md v21).
#ifndef KBIT_WG_WIDE5_MIN_STAGES
#define KBIT_WG_WIDE5_MIN_STAGES 3
#endif

// Producer threads: one warp, or (kRegSplit) a whole warpgroup that gives its registers to the
// consumers. At TN = 256 with 2 consumer warpgroups, 9 warps split the register file as 3 per
// SM sub-partition, 168 registers each, and the 128 accumulators per thread no longer fit
// (ptxas serialized the wgmmas, C7512); with a producer warpgroup the consumers take 232
// registers and the producer 40 (setmaxnreg: 2 x 232 + 40 = 3 x 168).
template <int TN, int WG> constexpr bool kRegSplit = TN == 256 && WG == 2;
template <int TN, int WG> constexpr int kProducerThreads = kRegSplit<TN, WG> ? 128 : 32;
constexpr int kConsumerRegs = 232, kProducerRegs = 40;

// Bytes of one stage and of the split-K reduction tile.
template <int K_BITS, int TN, int WG>
struct Shape {
  static constexpr int rows = kWgRows * WG;
  static constexpr int x_bytes = TN * kStepK * 2;          // a multiple of 1024 (swizzle atoms)
  static constexpr int packed_bytes = rows * 2 * K_BITS * 4;
  static constexpr int absmax_bytes = rows * 2 * 4;         // room for fp32 scales
  static constexpr uint32_t stage_bytes = (x_bytes + packed_bytes + absmax_bytes + 1023) / 1024 * 1024;
  static constexpr int red_stride = rows + 4;               // floats per token row (bank spread)
  static constexpr uint32_t red_bytes = uint32_t(TN) * red_stride * 4;
};

// Shared-memory layout, shared addresses in the CTA's window starting at `win` (dynamic shared
// memory starts at win + (<= kTableAt)): the codebook table at win + kTableAt, the stages
// behind it (1024-aligned: the x tile's 128-byte swizzle), the E4M4 scale table and the
// mbarriers. The reduction tile (after the main loop: split-K partials, or the C passes of the
// epilogue) overlays the table and the stages (both dead after the main loop; the consumers
// synchronize before writing it).
struct RsLayout {
  uint32_t table, stages0, red, scales, bars, end;
  __host__ __device__ uint32_t stage(int i, uint32_t stage_bytes) const { return stages0 + i * stage_bytes; }
};
__host__ __device__ inline RsLayout rs_layout(uint32_t win, uint32_t stage_bytes, int stages, uint32_t table_bytes,
                                              uint32_t red_bytes) {
  RsLayout l;
  l.table = win + kTableAt;
  l.stages0 = (l.table + table_bytes + 1023) & ~1023u;
  l.red = l.table;
  const uint32_t e = max(l.stages0 + uint32_t(stages) * stage_bytes, l.red + red_bytes);
  l.scales = e;
  l.bars = e + kScalePairBytes;
  l.end = l.bars + 16 * stages + 16;  // + stream-K's "partial stored" and "partials loaded" mbarriers
  return l;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void fence_proxy_async() {
  KBIT_WGMMA_ASM("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void fence_proxy_async_global() {
  KBIT_WGMMA_ASM("fence.proxy.async.global;" ::: "memory");
}
__device__ __forceinline__ void wgmma_fence() { KBIT_WGMMA_ASM("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { KBIT_WGMMA_ASM("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  KBIT_WGMMA_ASM("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Per-thread register limit of the calling warpgroup (every warp of it runs the same one).
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() { KBIT_WGMMA_ASM("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() { KBIT_WGMMA_ASM("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N)); }
// 8 values (16 bytes in v) to dst: one 16-byte store where dst is 16-byte aligned (vec).
template <typename T>
__device__ __forceinline__ void store8(T* dst, const uint4& v, bool vec) {
  if (vec) {
    *reinterpret_cast<uint4*>(dst) = v;
  } else {
    const T* pv = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int j = 0; j < 8; j++) dst[j] = pv[j];
  }
}
// Four 8x8 16-bit matrices from mma-fragment registers into shared memory, transposed: lane
// L gives the address of stored row L % 8 of matrix L / 8, which receives column L % 8 of
// that matrix's fragment.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, const uint32_t (&r)[4]) {
  KBIT_WGMMA_ASM("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r[0]),
                 "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}
// Keeps the compiler from moving accesses of the accumulators across the asynchronous MMAs.
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i])::"memory");
}
// Consumer warps only (named barrier 1; the producer warp never waits on it).
template <int THREADS>
__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(THREADS) : "memory");
}

// Shared-memory descriptor of a K-major operand in the TMA's 128-byte swizzle (row r's 16-byte
// chunk c at r * 128 + (c ^ r % 8) * 16, tile 1024-aligned): SBO 1024 (8 rows), LBO unused,
// mode 1; a k16 slice starts 32 bytes further (the swizzle applies to the final address bits).
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t addr) {
  return uint64_t((addr & 0x3FFFFu) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}
// 2-D tensor copy (TMA) of the box at (c0 = k, c1 = token) into shared memory, completing on bar.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  KBIT_BULK_ASM(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar) : "memory");
}

// D[64 rows, TN] += A[64 rows, 16 k] (registers a[0..3]) * B[16 k, TN] (descriptor db), TY
// the PTX type of both operands ("f16" or "bf16"), B K-major (no transpose). The operand
// lists ("%0, ..., %R-1" accumulators, then the 4 A registers and the descriptor) are
// spelled out per tile width.
#define KBIT_A8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), \
                   "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define KBIT_A32(i) KBIT_A8(i), KBIT_A8(i + 8), KBIT_A8(i + 16), KBIT_A8(i + 24)
#define KBIT_WGMMA_RS(TN_, TY, LIST, ...)                                                  \
  KBIT_WGMMA_ASM("wgmma.mma_async.sync.aligned.m64n" #TN_ "k16.f32." TY "." TY " " LIST ", 1, 1, 1, 0;" \
                 : __VA_ARGS__                                                              \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db))
#define KBIT_RS_LIST32 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, " \
  "%19}, %20"
#define KBIT_RS_LIST64 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36"
#define KBIT_RS_LIST128 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, " \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, " \
  "%56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68"
#define KBIT_RS_LIST256 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, " \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, " \
  "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, " \
  "%74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, " \
  "%92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, " \
  "%108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, " \
  "%123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132"
template <typename T, int TN>
__device__ __forceinline__ void wgmma_rs(float (&d)[TN / 2], const uint32_t (&a)[4], uint64_t db) {
  constexpr bool kHalf = std::is_same<T, __half>::value;
  if constexpr (TN == 32) {
    if constexpr (kHalf) KBIT_WGMMA_RS(32, "f16", KBIT_RS_LIST32, KBIT_A8(0), KBIT_A8(8));
    else KBIT_WGMMA_RS(32, "bf16", KBIT_RS_LIST32, KBIT_A8(0), KBIT_A8(8));
  } else if constexpr (TN == 64) {
    if constexpr (kHalf) KBIT_WGMMA_RS(64, "f16", KBIT_RS_LIST64, KBIT_A32(0));
    else KBIT_WGMMA_RS(64, "bf16", KBIT_RS_LIST64, KBIT_A32(0));
  } else if constexpr (TN == 128) {
    if constexpr (kHalf) KBIT_WGMMA_RS(128, "f16", KBIT_RS_LIST128, KBIT_A32(0), KBIT_A32(32));
    else KBIT_WGMMA_RS(128, "bf16", KBIT_RS_LIST128, KBIT_A32(0), KBIT_A32(32));
  } else {
    static_assert(TN == 256, "TN is 32, 64, 128 or 256");
    if constexpr (kHalf) KBIT_WGMMA_RS(256, "f16", KBIT_RS_LIST256, KBIT_A32(0), KBIT_A32(32), KBIT_A32(64), KBIT_A32(96));
    else KBIT_WGMMA_RS(256, "bf16", KBIT_RS_LIST256, KBIT_A32(0), KBIT_A32(32), KBIT_A32(64), KBIT_A32(96));
  }
}
#undef KBIT_WGMMA_RS
#undef KBIT_A32
#undef KBIT_A8

// Value index (0 .. 2^k - 1) of the first (h = 0) or second (h = 1) value of table entry e:
// k = 2..4: bits h, h + 2, h + 4, ... of e; k = 5: the same of the low byte, bit 4 from bit
// 8 + h of e (e = lo | hi << 8, hi as the address's bits 6-7 >> 6).
template <int K_BITS>
__device__ __forceinline__ int value_index(uint32_t e, int h) {
  int v = 0;
#pragma unroll
  for (int b = 0; b < (K_BITS < 4 ? K_BITS : 4); b++) v |= int((e >> (2 * b + h)) & 1u) << b;
  if (K_BITS == 5) v |= int((e >> (8 + h)) & 1u) << 4;
  return v;
}

// Split partial tiles travel as fp16 scaled by 2^-e (stream-K and the cluster split-K):
// e maps the largest |partial| mx to [2^14, 2^15), so nothing overflows and small tiles keep
// fp16's precision (not its subnormals); e = 0 when mx is not finite, so that Inf and NaN
// pass on; clamped so that 2^-e and 2^e are normal floats.
__device__ __forceinline__ int partial_exponent(float mx) {
  return isfinite(mx) ? min(113, max(-100, int((__float_as_uint(mx) >> 23) & 0xffu) - 127 - 14)) : 0;
}
// max(0, |v[0]|, .., |v[R - 1]|) over 8 independent chains, combined as a tree: one chain of
// R dependent FMNMX (R = 128 at TN = 256) took ~600 cycles of a partial tile's store. fmaxf
// ignores a NaN operand in either order, so the result is the chain's.
template <int R>
__device__ __forceinline__ float abs_max(const float (&v)[R]) {
  constexpr int kL = R < 8 ? R : 8;
  static_assert((kL & (kL - 1)) == 0 && R % kL == 0, "chains");
  float m[kL];
#pragma unroll
  for (int i = 0; i < kL; i++) m[i] = 0.f;
#pragma unroll
  for (int i = 0; i < R; i++) m[i % kL] = fmaxf(m[i % kL], fabsf(v[i]));
#pragma unroll
  for (int h = kL / 2; h > 0; h >>= 1)
#pragma unroll
    for (int i = 0; i < h; i++) m[i] = fmaxf(m[i], m[i + h]);
  return m[0];
}
__device__ __forceinline__ float pow2f(int e) { return __uint_as_float(uint32_t(127 + e) << 23); }
// v[0..7] += the 8 halves packed in w * up
__device__ __forceinline__ void add_scaled_halves(float* v, const uint32_t (&w)[4], float up) {
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[j]));
    v[2 * j] = fmaf(f.x, up, v[2 * j]);
    v[2 * j + 1] = fmaf(f.y, up, v[2 * j + 1]);
  }
}

// FMT: the absmax format (kRuntimeFmt, common.cuh: the argument's). E4M4 has its own kernels,
// in which the decode's scale lookups are plain loads with no branch on the format between
// them and the table lookups, so ptxas can interleave the passes (1-5% per call on the H200,
// NOTES.md v54).
template <typename T, int K_BITS, int TN, int WG, bool W5 = false, int FMT = kRuntimeFmt>
__global__ void __launch_bounds__(WG * 128 + kProducerThreads<TN, WG>, 1) wgmma_kernel(
    const __grid_constant__ CUtensorMap x_map, int M, const int32_t* __restrict__ packed,
    const void* __restrict__ absmax, int fmt_arg, const float* __restrict__ codebook, int N, int K, int stages,
    int splits, float shift_up, const T* __restrict__ bias, T* __restrict__ out, int64_t ldo, int pdl,
    char* __restrict__ sk_ws, unsigned* __restrict__ sk_flags) {
  using S = Shape<K_BITS, TN, WG>;
  static_assert(!W5 || K_BITS == 5, "the wide table is k = 5's");
  const int fmt = FMT == kRuntimeFmt ? fmt_arg : FMT;  // see kRuntimeFmt
  constexpr int kThreads = WG * 128;  // consumers; the producer warp(group) is tid >= kThreads
  constexpr int kAll = kThreads + kProducerThreads<TN, WG>;
  extern __shared__ __align__(1024) char smem_raw[];
  KBIT_WG_PHASE(0);
  if (threadIdx.x == 0) KBIT_WG_CTA(0);
  const uint32_t base = smem_u32(smem_raw);
  const uint32_t win = base & 0xFFFF0000u;  // the window's start (cluster rank << 24)
  const RsLayout lay = rs_layout(win, S::stage_bytes, stages, kTableBytes<K_BITS, W5>, S::red_bytes);
  {
    uint32_t dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (base - win > kTableAt || lay.end > base + dyn) __trap();  // launcher bug
  }
  char* const gen = smem_raw - base;  // generic pointer of shared address 0 (+ address)
  const int tid = threadIdx.x;
  // pdl == 2 (the caller's KBIT_WEIGHTS_STABLE, kbit.h: no kernel that may still be running
  // wrote the weights or the codebook): lane i's codebook value is asked for first thing, so
  // that its round trip overlaps the setup. Otherwise it is read after the PDL wait. H200
  // (NOTES.md v58): neutral (dense TOTAL within 0.2 us with and without it, the same binary);
  // the first steps' weights requested before the wait as well, by bulk copies or into the
  // consumers' registers, measured 1-4 us of TOTAL slower.
  const bool early = pdl > 1;
  float cb_lane = 0.f;  // lane i's codebook value (i mod 2^k): see the table build
  if (early) cb_lane = __ldg(codebook + (tid & ((1 << K_BITS) - 1)));
  // PDL (launched with it when pdl > 0; common.cuh): the next kernel of the stream may start
  // once every CTA has begun (its CTAs then take SMs as these CTAs leave them). Up to
  // pdl_wait below nothing global is read or written (x, weights, codebook and bias may be
  // what the previous kernel writes): only shared-memory setup and the tensor map's prefetch
  // (a kernel parameter).
  if (pdl > 0) pdl_trigger();
  // This CTA's work: segments (a tile, tile = token tile * row tiles + row tile, and a range
  // of its k-steps). K split over a cluster: the one tile (blockIdx.x, blockIdx.y), steps of
  // split z. Stream-K (sk_flags != null, launch_cfg's conditions: N a multiple of the CTA's
  // rows, fewer tiles than CTAs): CTA b of G takes units [b U / G, (b + 1) U / G) of the U =
  // tiles x KT (tile, k-step) units: fewer than KT, so at most the tail of a tile t and the
  // head of tile t + 1. The CTA holding a tile's last k-step owns the tile: it adds the other
  // holders' partial tiles and writes C. The others contribute: they hand their partial tile
  // to the owner through the workspace. A CTA thus waits only for CTAs of lower index (which
  // the hardware starts no later than itself: no deadlock even when the grid does not fit the
  // GPU at once; CUDA does not document this dispatch order, every GPU so far follows it;
  // a ticket from an atomic counter would remove the assumption), and it runs its contributing segment (a head) first and its owned one (a
  // tail) last, so that its contributors published long before it needs their partials.
  const int KT = (K + kStepK - 1) / kStepK;
  const int rtiles = (N + S::rows - 1) / S::rows;
  const bool sk = sk_flags != nullptr;
  const int64_t sk_units = int64_t(rtiles) * ((M + TN - 1) / TN) * KT;
  int seg_tile[2], seg_k0[2], seg_steps[2] = {0, 0}, nseg = 1;
  if (sk) {
    const int64_t u0 = sk_units * blockIdx.x / gridDim.x, u1 = sk_units * (blockIdx.x + 1) / gridDim.x;
    const int t0 = int(u0 / KT);
    const int64_t end0 = int64_t(t0 + 1) * KT;
    if (u1 > end0) {  // the head of tile t0 + 1 (contributed), then the tail of t0 (owned)
      seg_tile[0] = t0 + 1;
      seg_k0[0] = 0;
      seg_steps[0] = int(u1 - end0);
      seg_tile[1] = t0;
      seg_k0[1] = int(u0 - int64_t(t0) * KT);
      seg_steps[1] = int(end0 - u0);
      nseg = 2;
    } else {
      seg_tile[0] = t0;
      seg_k0[0] = int(u0 - int64_t(t0) * KT);
      seg_steps[0] = int(u1 - u0);
    }
  } else {
    const int per = (KT + splits - 1) / splits;
    seg_tile[0] = blockIdx.y * rtiles + blockIdx.x;
    seg_k0[0] = int(blockIdx.z) * per;
    seg_steps[0] = max(0, min(per, KT - seg_k0[0]));
  }
  // Stream-K: whether segment q ends at its tile's last k-step (owned) or not (contributed).
  const auto owned = [&](int q) { return seg_k0[q] + seg_steps[q] == KT; };
  // The last segment's tile: the one whose C this CTA writes (when it owns it).
  const int n0 = (seg_tile[nseg - 1] % rtiles) * S::rows, m0 = (seg_tile[nseg - 1] / rtiles) * TN;
  const int esize = absmax_bytes(fmt);
  const uint32_t esize_mask = esize == 4 ? 0xFFFFFFFFu : (1u << (8 * esize)) - 1u;  // an absmax's bits
  const uint32_t full0 = lay.bars, empty0 = lay.bars + 8 * stages, stored = lay.bars + 16 * stages,
                 loaded = stored + 8;
  // Stream-K contributor (its first segment): the producer thread publishes the partial (fence
  // + flag) once every consumer warp has arrived on `stored`, after it has issued the next
  // segment's first `stages` steps (or at its end), so that the consumers never wait for the
  // stores to drain.
  const int publish_at = !sk || owned(0) ? -1 : nseg == 2 ? seg_steps[0] + min(stages, seg_steps[1]) : seg_steps[0];

  // Rows n0 + rows .. are past N: their words and absmax stay zero in every stage (decoded to
  // 0); the copies bring only the first `rows` (a multiple of 8: N % 8 == 0).
  const int rows = min(S::rows, N - n0);
  const uint32_t p_bytes = rows * 8 * K_BITS, a_bytes = rows * 2 * esize;  // multiples of 16
  const int64_t p_step = int64_t(N) * 2 * K_BITS * 4, a_step = int64_t(N) * 2 * esize;  // bytes per k-tile
  if (rows < S::rows) {
    constexpr int kTail = (S::packed_bytes + S::absmax_bytes) / 16;
    for (int i = tid; i < stages * kTail; i += kAll)
      *reinterpret_cast<uint4*>(gen + lay.stage(i / kTail, S::stage_bytes) + S::x_bytes + (i % kTail) * 16) =
          make_uint4(0u, 0u, 0u, 0u);
  }
  if (tid == 0) {
    for (int st = 0; st < stages; st++) {
      mbar_init(full0 + 8 * st, 1);
      mbar_init(empty0 + 8 * st, WG * 4);  // one arrival per consumer warp
    }
    mbar_init(stored, WG * 4);
    mbar_init(loaded, 1);  // stream-K owner: a batch of partials in shared memory
    mbar_fence_init();
    prefetch_tensormap(&x_map);
  }
  fill_scale_pairs<T>(reinterpret_cast<uint32_t*>(gen + lay.scales), tid, kAll);
  if (pdl > 0) pdl_wait();
  // Lane i's codebook value, in flight across the barrier below; the table build takes the
  // values by shuffles (one load round instead of two per entry: NOTES.md v21).
  if (!early) cb_lane = __ldg(codebook + (tid & ((1 << K_BITS) - 1)));
  // warp-uniform as far as the compiler can see (a shuffle from lane 0): wgmma in a branch on
  // threadIdx directly is serialized by ptxas ("divergent path", C7518)
  const bool producer = __shfl_sync(0xffffffffu, tid >> 5, 0) >= WG * 4;
  __syncthreads();  // initialised mbarriers, zeroed tails, the scale-pair table
  KBIT_WG_PHASE(7);

  float acc[TN / 2];
#pragma unroll
  for (int i = 0; i < TN / 2; i++) acc[i] = 0.f;
  const int lane = tid & 31, warp = (tid >> 5) & 3, wg = tid >> 7, g = lane >> 2, c = lane & 3;

  if (producer) {
    if constexpr (kRegSplit<TN, WG>) setmaxnreg_dec<kProducerRegs>();
    if (tid == kThreads) {
      // weights read by one token tile only stream through L2 evict-first
      const uint64_t w_policy = l2_policy(M <= TN);
      int slot = 0, s_all = 0;
      uint32_t phase = 0;
      const auto publish = [&]() {
        mbar_wait(stored, 0);
        __threadfence();
        asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(sk_flags + blockIdx.x), "r"(1u) : "memory");
      };
      for (int q = 0; q < nseg; q++)
      for (int s = 0; s < seg_steps[q]; s++, s_all++) {
        if (s_all == publish_at) publish();
        const int tn0 = (seg_tile[q] % rtiles) * S::rows, tm0 = (seg_tile[q] / rtiles) * TN, tk = seg_k0[q] + s;
        const char* const pseg = reinterpret_cast<const char*>(packed) + int64_t(tn0) * 2 * K_BITS * 4;
        const char* const aseg = static_cast<const char*>(absmax) + int64_t(tn0) * 2 * esize;
        const uint32_t st = lay.stage(slot, S::stage_bytes), full = full0 + 8 * slot;
        // consumers released it; the proxy fence orders their generic reads of the stage
        // before the async-proxy writes (racecheck reports the hazard without it)
        if (s_all >= stages) mbar_wait(empty0 + 8 * slot, phase ^ 1);
        fence_proxy_async();
        constexpr bool kX = !(KBIT_WG_PROBE & 8), kW = !(KBIT_WG_PROBE & 4);
        mbar_expect_tx(full, (kX ? S::x_bytes : 0) + (kW ? p_bytes + a_bytes : 0));
        if (kX) tma_load_2d(st, &x_map, tk * kStepK, tm0, full);
        if (kW) {
          bulk_copy_hint(st + S::x_bytes, pseg + tk * p_step, p_bytes, full, w_policy);
          bulk_copy_hint(st + S::x_bytes + S::packed_bytes, aseg + tk * a_step, a_bytes, full, w_policy);
        }
        if (++slot == stages) {
          slot = 0;
          phase ^= 1;
        }
      }
      if (s_all == publish_at) publish();
    }
#ifdef KBIT_WG_FIRST_COPY_PROBE  // scripts/wgmma_timeline.cu: when step 0's copies landed
    if (kRegSplit<TN, WG> && tid == kThreads + 32) {
      mbar_wait(full0, 0);
      KBIT_WG_PHASE(6);
    }
#endif
    if constexpr (kRegSplit<TN, WG>) {
      // With 40 registers the producer warpgroup runs no epilogue code: it only takes part in
      // the split-K reduction's two cluster barriers.
      if (splits > 1) {
        cluster_sync();
        cluster_sync();
      }
      return;
    }
  } else {
    if constexpr (kRegSplit<TN, WG>) setmaxnreg_inc<kConsumerRegs>();
    // The private codebook table (consumers fill it while the first copies fly). A table row
    // of 256 bytes holds entries in every lane's column: k <= 4: one entry, 32 columns of 4
    // bytes, the upper 128 bytes unused; k = 5: the 4 high-bit pairs x 16 columns; W5: hi0 =
    // 0 and 1 x 32 columns (rows 256 .. 511: hi1 = 1). Thread t fills rows t, t + kThreads,
    // ...: its entries' codebook values come by shuffle from the lanes that loaded them
    // (cb_lane), and it stores each entry into all of its columns, 16 bytes at a time, starting
    // at a chunk rotated by t so that a warp's stores spread over every bank. (Each entry's
    // values loaded from global memory took ~800 cycles longer at k = 5, NOTES.md v19; one
    // thread per 16-byte chunk took 2800 / 4000 cycles at k = 4 / 5, NOTES.md v13.)
    {
      constexpr int kRows = W5 ? 512 : K_BITS == 5 ? 256 : 1 << (2 * K_BITS);
      constexpr int kPerRow = W5 ? 2 : K_BITS == 5 ? 4 : 1;  // entries per row
      constexpr int kChunks = K_BITS == 5 && !W5 ? 4 : 8;    // 16-byte chunks per entry
      static_assert(kRows % 32 == 0 || kRows < 32, "rows per warp");
      const auto cb = [&](int i) { return __shfl_sync(0xffffffffu, cb_lane, i); };
      // whole rows per thread at k = 4, 5 (no store guard, so that every shuffle of a thread
      // can go ahead of its stores: with the guard they ran one round per entry, ~500 cycles)
      constexpr bool kWhole = kRows % kThreads == 0;
#pragma unroll
      for (int r0 = 0; r0 < kRows; r0 += kThreads) {  // warp-uniform trips: every lane shuffles
        const int r = r0 + tid;
        const uint32_t row_i = uint32_t(kWhole || r < kRows ? r : 0);
        uint32_t v[kPerRow];
#pragma unroll
        for (int j = 0; j < kPerRow; j++) {
          // entry index lo | hi << 8 (value_index); k = 5: hi rotated by t; W5: hi0 = j
          const uint32_t e = W5 ? (row_i & 255u) | (uint32_t(j) | (row_i >> 8) << 1) << 8
                                : row_i | (K_BITS == 5 ? (uint32_t(j + tid) & 3u) << 8 : 0u);
          v[j] = Pair<T>::pack(cb(value_index<K_BITS>(e, 0)), cb(value_index<K_BITS>(e, 1)));
        }
        if (kWhole || r < kRows) {
          char* const row = gen + lay.table + r * 256;
#pragma unroll
          for (int j = 0; j < kPerRow; j++) {
#pragma unroll
            for (int i = 0; i < kChunks; i++) {
              // k = 5: chunk i of entry hi rotated by t / 4; else chunk i rotated by t
              const int off = K_BITS == 5 && !W5 ? int((uint32_t(j + tid) & 3u) * 64 + ((i + (tid >> 2)) & 3) * 16)
                                                 : j * 128 + ((i + tid) & 7) * 16;
              *reinterpret_cast<uint4*>(row + off) = make_uint4(v[j], v[j], v[j], v[j]);
            }
          }
        }
      }
    }
    consumer_sync<kThreads>();
    KBIT_WG_PHASE(1);

    const int r0 = wg * kWgRows + warp * 16 + g;  // CTA-local rows r0, r0 + 8 of this lane
    const uint32_t lane_col = win | uint32_t(K_BITS == 5 && !W5 ? (lane & 15) * 4 : lane * 4);  // + kTableAt in the LDS
    uint32_t rot[K_BITS];  // rotate plane b right by 2c - 2b (k = 5, plane 4: 2c - 6; W5: 2c - 7)
#pragma unroll
    for (int b = 0; b < K_BITS; b++) rot[b] = uint32_t(2 * c - 2 * (b < 4 ? b : 3) - (b == 4 && W5)) & 31u;
    int slot = 0;
    uint32_t phase = 0, prev_empty = 0;
    uint32_t a_prev[4][4] = {};  // the A registers of the previous step
    // The unroll factor must be even. Then a_prev = a (below) is a copy that ptxas folds into
    // the other unrolled body's registers, and the empty asm that reads a_prev keeps the very
    // registers step s - 1's wgmma reads alive through step s's decode. Unrolled by 1 the copy
    // cannot share a's registers: step s's decode overwrote the A registers that step s - 1's
    // wgmma was still reading, and 24 of test_wgmma's 38 tests failed (NOTES.md v59; explicit
    // even / odd buffers in the source are the same SSA values, so no more robust, and slower).
    // 4 where two warpgroups share a CTA (the M = 1024 plans: dense TOTAL -1..-3 us there,
    // while WG = 1 at 4 was +0.2..+0.5 us at M = 128, 256; NOTES.md v59).
    constexpr int kUnroll = WG == 2 ? 4 : 2;
    for (int q = 0; q < nseg; q++) {
#pragma unroll kUnroll
    for (int s = 0; s < seg_steps[q]; s++) {
      const uint32_t st = lay.stage(slot, S::stage_bytes);
      KBIT_WG_MARK(s, 4);
      mbar_wait(full0 + 8 * slot, phase);
      KBIT_WG_MARK(s, 0);
      const char* pw = gen + st + S::x_bytes;
      const char* pa = pw + S::packed_bytes;
      uint32_t a[4][4];  // [k16 slice][A register]
      // The step's four blocks (rows r0, r0 + 8 x blocks b = 0, 1) in three passes: every
      // block's words and scale bits loaded, the scales formed, then the lookups. One pass per
      // block made a chain of dependent shared loads per block (words -> index -> table, scale
      // code -> scale table) that the runtime absmax format's branches kept ptxas from
      // interleaving: 615 -> 449 cycles of decode per step, steps 1039 -> 887 cycles (gateup,
      // M = 256, k = 4, H200; scripts/wgmma_timeline.cu, NOTES.md v41).
      uint32_t w[2][2][K_BITS], sbits[2][2];
#pragma unroll
      for (int rr = 0; rr < 2; rr++) {
#pragma unroll
        for (int b = 0; b < 2; b++) {
          const int blk = (r0 + 8 * rr) * 2 + b;
          if constexpr (K_BITS == 4) {
            const uint4 v = *reinterpret_cast<const uint4*>(pw + blk * 16);
            w[rr][b][0] = v.x; w[rr][b][1] = v.y; w[rr][b][2] = v.z; w[rr][b][3] = v.w;
          } else if constexpr (K_BITS == 2) {
            const uint2 v = *reinterpret_cast<const uint2*>(pw + blk * 8);
            w[rr][b][0] = v.x; w[rr][b][1] = v.y;
          } else {
#pragma unroll
            for (int p = 0; p < K_BITS; p++) w[rr][b][p] = reinterpret_cast<const uint32_t*>(pw)[blk * K_BITS + p];
          }
          // the block's absmax bits without a branch on the format: the aligned word holding
          // them (esize 1, 2 or 4 bytes at blk * esize never straddles one), shifted and masked
          const uint32_t at = uint32_t(blk * esize);
          const uint32_t word = *reinterpret_cast<const uint32_t*>(pa + (at & ~3u));
          sbits[rr][b] = (word >> ((at & 3u) * 8)) & esize_mask;
        }
      }
      uint32_t s2[2][2];
#pragma unroll
      for (int rr = 0; rr < 2; rr++)
#pragma unroll
        for (int b = 0; b < 2; b++)
          s2[rr][b] = scale_pair<T>(sbits[rr][b], fmt, reinterpret_cast<const uint32_t*>(gen + lay.scales));
#pragma unroll
      for (int rr = 0; rr < 2; rr++) {
#pragma unroll
        for (int b = 0; b < 2; b++) {
          const uint32_t(&wb)[K_BITS] = w[rr][b];
          const uint32_t sc = s2[rr][b];
          uint32_t n = 0;
#pragma unroll
          for (int p = 0; p < (K_BITS < 4 ? K_BITS : 4); p++)
            n |= __funnelshift_r(wb[p], wb[p], rot[p]) & (0x03030303u << (2 * p));
          // k = 5: the fifth plane's bits of the pair in byte y at bits 6, 7 (W5: at bit 7 of
          // byte y and bit 0 of byte y + 1)
          uint32_t hi = 0;
          if constexpr (K_BITS == 5) hi = __funnelshift_r(wb[4], wb[4], rot[4]) & (W5 ? 0x81818181u : 0xC0C0C0C0u);
          // byte y: positions 8y + 2c, +1 of the block = slice 2b + y / 2, register rr + 2 (y % 2)
          if (!(KBIT_WG_PROBE & 1)) {
            if constexpr (W5) {
              a[2 * b][rr] = mul2<T>(lds32_at<kTableAt>(entry_addr5w<0>(n, hi, lane_col)), sc);
              a[2 * b][rr + 2] = mul2<T>(lds32_at<kTableAt>(entry_addr5w<1>(n, hi, lane_col)), sc);
              a[2 * b + 1][rr] = mul2<T>(lds32_at<kTableAt>(entry_addr5w<2>(n, hi, lane_col)), sc);
              a[2 * b + 1][rr + 2] = mul2<T>(lds32_at<kTableAt>(entry_addr5w<3>(n, hi, lane_col)), sc);
            } else if constexpr (K_BITS == 5) {
              a[2 * b][rr] = mul2<T>(lds32_at<kTableAt>(entry_addr5<0>(n, hi, lane_col)), sc);
              a[2 * b][rr + 2] = mul2<T>(lds32_at<kTableAt>(entry_addr5<1>(n, hi, lane_col)), sc);
              a[2 * b + 1][rr] = mul2<T>(lds32_at<kTableAt>(entry_addr5<2>(n, hi, lane_col)), sc);
              a[2 * b + 1][rr + 2] = mul2<T>(lds32_at<kTableAt>(entry_addr5<3>(n, hi, lane_col)), sc);
            } else {
              a[2 * b][rr] = mul2<T>(lds32_at<kTableAt>(entry_addr<0>(n, lane_col)), sc);
              a[2 * b][rr + 2] = mul2<T>(lds32_at<kTableAt>(entry_addr<1>(n, lane_col)), sc);
              a[2 * b + 1][rr] = mul2<T>(lds32_at<kTableAt>(entry_addr<2>(n, lane_col)), sc);
              a[2 * b + 1][rr + 2] = mul2<T>(lds32_at<kTableAt>(entry_addr<3>(n, lane_col)), sc);
            }
          } else {
            a[2 * b][rr] = a[2 * b][rr + 2] = a[2 * b + 1][rr] = a[2 * b + 1][rr + 2] = n ^ hi ^ sc;
          }
        }
      }
      KBIT_WG_MARK(s, 1);
      fence_regs(acc);
      wgmma_fence();
      if (!(KBIT_WG_PROBE & 2)) {
#pragma unroll
        for (int j = 0; j < 4; j++) wgmma_rs<T, TN>(acc, a[j], smem_desc_sw128(st + j * 32));
      }
      wgmma_commit();
      fence_regs(acc);
      wgmma_wait<1>();  // this warpgroup's MMAs of step s - 1 are done: release its stage
      KBIT_WG_MARK(s, 2);
      // Step s - 1's A registers stay live up to here, so the decode of step s cannot have
      // reused them while its MMAs still read them (without this, results were wrong now and
      // then: ptxas does not see the asynchronous read).
#pragma unroll
      for (int j = 0; j < 4; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
          asm volatile("" ::"r"(a_prev[j][i]));
          a_prev[j][i] = a[j][i];
        }
      __syncwarp();  // every lane's reads of the stage before lane 0's release (racecheck)
      if (s > 0 && lane == 0) mbar_arrive(empty0 + 8 * prev_empty);
      prev_empty = uint32_t(slot);
      if (++slot == stages) {
        slot = 0;
        phase ^= 1;
      }
    }
    wgmma_wait<0>();
    fence_regs(acc);
    if (tid == 0 && q == nseg - 1) KBIT_WG_CTA(2);
    if (sk) {
      // the segment's last stage (the loop releases each step's stage one step later)
      __syncwarp();
      if (seg_steps[q] > 0 && lane == 0) mbar_arrive(empty0 + 8 * prev_empty);
      // Partial tiles as fp16 scaled by 2^-e, e per thread from its largest |partial| (which
      // becomes 2^14..2^15; e = 0 when that is not finite, so that Inf and NaN pass on), as
      // the cluster split-K below does per CTA: half the bytes of fp32 and no barrier. Slot b
      // of the workspace holds CTA b's: the exponents (int per thread), then thread-major
      // 16-byte items (thread t's i-th at i * kThreads + t), so the owner's thread t reads
      // what the contributor's thread t wrote.
      constexpr int kItems = TN / 16;  // of 8 halves: a thread's TN / 2 partials
      int* const sk_exps = reinterpret_cast<int*>(sk_ws);
      uint4* const sk_parts = reinterpret_cast<uint4*>(sk_ws + size_t(gridDim.x) * kThreads * 4);
      if (!owned(q)) {
        const int ex = partial_exponent(abs_max(acc));
        const float down = pow2f(-ex);
        uint4* const dst = sk_parts + size_t(blockIdx.x) * kItems * kThreads;
#pragma unroll
        for (int i = 0; i < kItems; i++)
          dst[i * kThreads + tid] = make_uint4(
              Pair<__half>::pack(acc[8 * i] * down, acc[8 * i + 1] * down),
              Pair<__half>::pack(acc[8 * i + 2] * down, acc[8 * i + 3] * down),
              Pair<__half>::pack(acc[8 * i + 4] * down, acc[8 * i + 5] * down),
              Pair<__half>::pack(acc[8 * i + 6] * down, acc[8 * i + 7] * down));
        sk_exps[size_t(blockIdx.x) * kThreads + tid] = ex;
        __syncwarp();
        if (lane == 0) mbar_arrive(stored);  // the producer thread publishes it
#pragma unroll
        for (int i = 0; i < TN / 2; i++) acc[i] = 0.f;  // for the owned segment
      } else {
        // the owner: add the partials of the lower CTAs whose ranges reach into this tile
        // (CTAs b_lo .. blockIdx.x - 1: those whose unit ranges end past the tile's start)
        const int64_t tile_start = int64_t(seg_tile[q]) * KT;
        int b_lo = int(blockIdx.x);
        while (b_lo > 0 && sk_units * b_lo / gridDim.x > tile_start) b_lo--;
        // Every contributor's flag first (consumer thread i waits for CTA b_lo + i), then one
        // barrier, then the partials: one flag round trip and barrier per contributor before
        // its loads made the owners' adds take 4.0-4.4 us at down, M = 256 (~4 contributors
        // per tile; NOTES.md v41).
        for (int b = b_lo + tid; b < int(blockIdx.x); b += kThreads) {
          unsigned f = 0;
          do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(f) : "l"(sk_flags + b) : "memory");
          } while (f == 0u);
          sk_flags[b] = 0u;  // ready for the next call (each slot has one reader)
        }
        // (the flags' acquire before the async-proxy reads of the partials below)
        fence_proxy_async_global();
        // The partials come into shared memory by bulk copies, as many contributors at once as
        // fit the dead table and stages (consecutive CTAs' partials and exponents are each one
        // contiguous range): one round trip per batch instead of one per contributor (16
        // 16-byte loads per thread each). The table's and stages' last generic reads are ordered
        // before the copies' writes by each thread's proxy fence and the barrier.
        fence_proxy_async();
        consumer_sync<kThreads>();
        constexpr uint32_t kPartBytes = uint32_t(kItems) * kThreads * 16, kExpBytes = kThreads * 4;
        // [lay.red, lay.scales) holds the reduction tile at least: one contributor per batch
        static_assert(S::red_bytes >= kPartBytes + kExpBytes, "a batch holds one contributor");
        const int per_batch = int((lay.scales - lay.red) / (kPartBytes + kExpBytes));
        uint32_t ld_phase = 0;
        for (int b_hi = int(blockIdx.x) - 1; b_hi >= b_lo; b_hi -= per_batch) {
          const int nb = min(per_batch, b_hi - b_lo + 1), b_first = b_hi - nb + 1;  // CTAs b_first .. b_hi
          if (tid == 0) {
            mbar_expect_tx(loaded, uint32_t(nb) * (kPartBytes + kExpBytes));
            bulk_copy(lay.red, sk_parts + size_t(b_first) * kItems * kThreads, uint32_t(nb) * kPartBytes, loaded);
            bulk_copy(lay.red + uint32_t(nb) * kPartBytes, sk_exps + size_t(b_first) * kThreads,
                      uint32_t(nb) * kExpBytes, loaded);
          }
          mbar_wait(loaded, ld_phase);
          ld_phase ^= 1u;
          for (int b = b_hi; b >= b_first; b--) {  // the order of the partials' adds: b descending
            const uint32_t j = uint32_t(b - b_first);
            const float up = pow2f(*reinterpret_cast<const int*>(gen + lay.red + uint32_t(nb) * kPartBytes +
                                                                 j * kExpBytes + uint32_t(tid) * 4));
            const uint32_t src = lay.red + j * kPartBytes + uint32_t(tid) * 16;
#pragma unroll
            for (int i = 0; i < kItems; i++) {
              const uint4 v = *reinterpret_cast<const uint4*>(gen + src + uint32_t(i) * kThreads * 16);
              const uint32_t w[4] = {v.x, v.y, v.z, v.w};
              add_scaled_halves(acc + 8 * i, w, up);
            }
          }
          if (b_first > b_lo) {  // another batch overwrites this one: every thread's reads first
            fence_proxy_async();
            consumer_sync<kThreads>();
          }
        }
      }
    }
    }  // segments
    KBIT_WG_PHASE(2);
    if (tid == 0) KBIT_WG_CTA(3);
  }
  // stream-K: a CTA that owns no tile writes no C
  if (sk && !owned(nseg - 1)) {
    if (tid == 0) KBIT_WG_CTA(1);
    return;
  }

  // Accumulator fragment: acc[4i + 2h + e] is weight row r0 + 8h, token 8i + 2c + e.
  const int r0 = wg * kWgRows + warp * 16 + g;
  const bool vec_out = (reinterpret_cast<uintptr_t>(out) % 16 == 0) && ldo % 8 == 0;  // 16-byte stores
  if (splits == 1) {
    if (producer || (KBIT_WG_PROBE & 32)) return;
    // C through shared memory, transposed by stmatrix: each warp writes its 16 rows x TN
    // tokens as token rows of 16 values (T) into its own part of the reduction tile's space,
    // then stores 8 rows of one token with one 16-byte store. Per-element 2-byte stores
    // straight from the fragments cost ~half of a TN = 256 call (ncu: instruction-cache misses
    // in the unrolled epilogue, NOTES.md v12). All TN tokens are staged before the stores
    // (was: passes of 64 tokens; same speed, NOTES.md v13).
    consumer_sync<kThreads>();  // the space overlays stages and the table other warps may still read
    constexpr int kRowBytes = 48;  // 32 bytes of values + 16: conflict-free stmatrix rows
    static_assert(kThreads / 32 * TN * kRowBytes <= S::red_bytes, "C rows must fit the reduction tile");
    // kFullLine: each warpgroup's 64 rows x TN tokens as token rows of 64 values (128 bytes;
    // 16-byte chunk c of token t at chunk c ^ t % 8, conflict-free for the stmatrix and the
    // reads), a warpgroup barrier, then whole 128-byte token rows to global memory (one warp
    // store: 4 tokens x 128 bytes, where the per-warp form stores 16 scattered 32-byte pieces)
    constexpr bool kFullLine = KBIT_WG_FULLLINE_C == 2 || (KBIT_WG_FULLLINE_C == 1 && WG == 1 && TN >= 128);
    static_assert(!kFullLine || WG * TN * 128 <= S::red_bytes, "C rows must fit the reduction tile");
    const uint32_t region = kFullLine ? lay.red + uint32_t(wg * TN * 128) : lay.red + uint32_t((tid >> 5) * TN * kRowBytes);
    const int nw = n0 + wg * kWgRows + warp * 16;  // first weight row of this warp
    float bv[2] = {0.f, 0.f};
#pragma unroll
    for (int h = 0; h < 2; h++)
      if (bias != nullptr && nw + g + 8 * h < N) bv[h] = to_float(bias[nw + g + 8 * h]);
    const int q = lane >> 3;  // stmatrix: lane gives row lane % 8 of matrix q = 2 * (chunk) + row half
#pragma unroll
    for (int i = 0; i < TN / 8; i += 2) {
      uint32_t r[4];
#pragma unroll
      for (int di = 0; di < 2; di++)
#pragma unroll
        for (int h = 0; h < 2; h++)
          r[2 * di + h] = Pair<T>::pack(acc[4 * (i + di) + 2 * h] * shift_up + bv[h],
                                        acc[4 * (i + di) + 2 * h + 1] * shift_up + bv[h]);
      if constexpr (kFullLine) {
        const int t = (i + (q >> 1)) * 8 + (lane & 7), chunk = 2 * warp + (q & 1);
        stmatrix_x4_trans(region + uint32_t(t * 128 + ((chunk ^ (t & 7)) << 4)), r);
      } else {
        stmatrix_x4_trans(region + uint32_t(((i + (q >> 1)) * 8 + (lane & 7)) * kRowBytes + (q & 1) * 16), r);
      }
    }
    if constexpr (kFullLine) {
      asm volatile("bar.sync %0, 128;" ::"r"(2 + wg) : "memory");  // this warpgroup's token rows are whole
#pragma unroll 4
      for (int u = tid & 127; u < ((KBIT_WG_PROBE & 16) ? 0 : TN * 8); u += 128) {
        const int t = u >> 3, chunk = u & 7;
        const int tok = m0 + t, n = n0 + wg * kWgRows + 8 * chunk;
        if (tok >= M || n >= N) continue;  // N % 8 == 0: a chunk is all in or all out
        store8(out + int64_t(tok) * ldo + n, *reinterpret_cast<const uint4*>(gen + region + t * 128 + ((chunk ^ (t & 7)) << 4)),
               vec_out);
      }
    } else {
      __syncwarp();
#pragma unroll 4
      for (int u = lane; u < ((KBIT_WG_PROBE & 16) ? 0 : TN * 2); u += 32) {
        const int t = u >> 1, half = u & 1;
        const int tok = m0 + t, n = nw + 8 * half;
        if (tok >= M || n >= N) continue;  // N % 8 == 0: a half is all in or all out
        store8(out + int64_t(tok) * ldo + n, *reinterpret_cast<const uint4*>(gen + region + t * kRowBytes + half * 16),
               vec_out);
      }
    }
    KBIT_WG_PHASE(5);
    if (tid == 0) KBIT_WG_CTA(1);
    return;
  }
  // Split K: this CTA's tile [TN tokens][rows] into shared memory, then CTA z of the cluster
  // adds tokens t with t % splits == z over the cluster's CTAs and writes them. The tile goes
  // as fp16 scaled by 2^-e, e per CTA from its largest |partial| (which becomes 2^14..2^15;
  // e = 0 when that is not finite): half the distributed-shared-memory bytes of fp32, which
  // bound this reduction (11-17 B/cycle/SM, NOTES.md v19; M = 64 dense TOTAL 0.88-0.99x ->
  // 0.96-1.19x, v22), for a rounding of 2^-11 relative per partial (bf16 partials, 2^-8, broke
  // the fp16 tolerance at 8 splits). Token rows of rows + 8 halves: 16-byte aligned items.
  constexpr int kRedStrideH = S::rows + 8;
  const uint32_t red_exp = lay.red + uint32_t(TN * kRedStrideH * 2);  // this CTA's e (int), then per-warp maxima
  static_assert(TN * kRedStrideH * 2 + 16 + 4 * 8 <= S::red_bytes, "the reduction space holds the half tile");
  if (!producer) {
    consumer_sync<kThreads>();  // the tile overlays stages and the table other warps may still read
    float mx = abs_max(acc);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float* const warp_max = reinterpret_cast<float*>(gen + red_exp + 16);
    if (lane == 0) warp_max[tid >> 5] = mx;
    consumer_sync<kThreads>();
#pragma unroll
    for (int w = 0; w < WG * 4; w++) mx = fmaxf(mx, warp_max[w]);
    const int ex = partial_exponent(mx);  // per CTA
    const float down = pow2f(-ex);
    if (tid == 0) *reinterpret_cast<int*>(gen + red_exp) = ex;
    __half* const red = reinterpret_cast<__half*>(gen + lay.red);
#pragma unroll
    for (int i = 0; i < TN / 8; i++)
#pragma unroll
      for (int h = 0; h < 2; h++)
#pragma unroll
        for (int e = 0; e < 2; e++)
          red[(8 * i + 2 * c + e) * kRedStrideH + r0 + 8 * h] = __float2half_rn(acc[4 * i + 2 * h + e] * down);
  }
  cluster_sync();
  KBIT_WG_PHASE(3);
  const int z = int(blockIdx.z);
  const int my_tokens = (TN - z + splits - 1) / splits;
  constexpr int kReducers = kRegSplit<TN, WG> ? kThreads : kAll;  // the producer warpgroup has left
  float up[kMaxSplits];  // 2^e of every CTA of the cluster
#pragma unroll
  for (int r = 0; r < kMaxSplits; r++)
    if (r < splits) up[r] = pow2f(int(ld_cluster_u32(red_exp, uint32_t(r))));
  for (int u = tid; u < my_tokens * (S::rows / 8); u += kReducers) {
    const int t = z + (u / (S::rows / 8)) * splits, q = u % (S::rows / 8);
    const int tok = m0 + t, n = n0 + 8 * q;
    if (tok >= M || n >= N) continue;
    // Every CTA's partials (and the bias) requested before the first is added: one
    // distributed-shared-memory round trip per item instead of one per split (a chain of
    // `splits` round trips per item took 4-7 us at TN = 256, NOTES.md v13).
    float bv[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (bias != nullptr) {
#pragma unroll
      for (int j = 0; j < 8; j++) bv[j] = to_float(bias[n + j]);
    }
    const uint32_t off = lay.red + uint32_t(t * kRedStrideH + 8 * q) * 2;
    float4 part[kMaxSplits];  // 8 halves
#pragma unroll
    for (int r = 0; r < kMaxSplits; r++)
      if (r < splits) part[r] = ld_cluster_f32x4(off, uint32_t(r));
    float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int r = 0; r < kMaxSplits; r++)
      if (r < splits) {
        const uint32_t w[4] = {__float_as_uint(part[r].x), __float_as_uint(part[r].y), __float_as_uint(part[r].z),
                               __float_as_uint(part[r].w)};
        add_scaled_halves(v, w, up[r]);
      }
    uint32_t o[4];
#pragma unroll
    for (int j = 0; j < 4; j++) o[j] = Pair<T>::pack(v[2 * j] * shift_up + bv[2 * j], v[2 * j + 1] * shift_up + bv[2 * j + 1]);
    T* dst = out + int64_t(tok) * ldo + n;
    if (vec_out) {
      *reinterpret_cast<uint4*>(dst) = make_uint4(o[0], o[1], o[2], o[3]);
    } else {
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const T* pr = reinterpret_cast<const T*>(&o[j]);
        dst[2 * j] = pr[0];
        dst[2 * j + 1] = pr[1];
      }
    }
  }
  KBIT_WG_PHASE(4);
  cluster_sync();  // no CTA leaves while the others read its tile
  KBIT_WG_PHASE(5);
}

// Configuration forced by kbit_wgmma_force_config (tests, sweeps): TN (32, 64, 128, 256), WG
// (1, 2), splits (1..8; -1: stream-K where it applies, else automatic), k = 5's table (1 the
// 64 KB one, 2 the wide one, solo); 0 = automatic.
int& forced_tn() { static int v = 0; return v; }
int& forced_wg() { static int v = 0; return v; }
int& forced_splits() { static int v = 0; return v; }
int& forced_table() { static int v = 0; return v; }
// Whether the last launch ran stream-K (tests).
int& last_streamk() { static int v = 0; return v; }

// Stream-K workspace (Workspace, common.cuh; from the caller, one per stream or captured
// graph): kFlagBytes of flags (uint32 per CTA, zero between calls: each owner clears the flags
// it consumed), then per CTA (G = the grid) G x threads exponents (int) and G partial tiles of
// 64 * WG rows x TN tokens in fp16.
constexpr int64_t kFlagBytes = 4 * 1024;  // flags of up to 1024 CTAs
inline int64_t streamk_bytes(int ctas, int rows, int tn) {
  return kFlagBytes + int64_t(ctas) * (2 * rows * 4 + int64_t(rows) * tn * 2);  // threads = 2 * rows
}
// Stream-K's cost in the split model of launch_cfg, in steps per CTA on top of its share of
// the units: the partial tile's store and publish (contributor) and load (owner).
inline int streamk_overhead() {
  static const int v = [] {
    const char* e = std::getenv("KBIT_WG_SK_OVERHEAD");  // experiments
    return e != nullptr ? std::atoi(e) : 6;
  }();
  return v;
}

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
                    device_info(device).smem_reserved <= int(kTableAt) &&
                    cudaFuncGetAttributes(&attr, wgmma_kernel<__half, 4, 64, 1>) == cudaSuccess &&
                    attr.binaryVersion == 90;
    known[device] = ok ? 1 : -1;
  }
  return known[device] == 1;
#endif
}

// (TN, WG) of a call. Up to M = 128 the token tile TN covers M (wgmma N: 32..128) with one
// warpgroup (two once the tiles fill the SMs twice; at TN = 32 launch_bits may also take two,
// by the split model's cost). At M = 193..256: TN = 256 with one
// warpgroup where its 64-row tiles make 0.45 .. 1 wave (NOTES.md v19). Else TN = 256 with 2
// warpgroups where that makes 0.3+ tiles per SM, else TN = 128 with 2 warpgroups from 0.44
// tiles per SM on, else 1. From H100 sweeps at k = 4 and 5 (NOTES.md v13), e.g. us at M = 256 /
// 512, k = 4: gateup 256.2 20.3 / 27.7 (128.2 19.6 / 42.3); down 128.1 20.7, 128.2 27.4 (256.2
// 25.0 / 30.0); KV 128.1 9.5 / 10.4 (256.1 11.4 / 12.4). The K split is chosen in launch_cfg, where the
// kernel's occupancy is known.
// With a stream-K workspace (sk), M = 193..256 also takes TN = 256 with one warpgroup where
// fewer 64-row tiles make less than 0.45 of a wave but enough units for stream-K (launch_cfg's
// condition). H100, M = 256, us (128.1 cluster split -> 256.1 stream-K): down k = 4 20.9 ->
// 20.1, k = 5 22.1 -> 20.4 (same run). At k = 2, 3 down and O were 2-3 us slower in session
// 20 (bench v23 against v22), so only k >= 4 took it until session 41, whose H200 A/B (today's
// stream-K, NOTES.md v51) measured k = 2, 3 down 18.7 -> 16.6 us and O 15.8 -> 14.7 at M = 256
// (dense TOTAL -3.0..-3.6 us). Session 42's H100 A/B of the same two libraries measured k = 2,
// 3 slower there still (dense TOTAL M = 224 +4.1..+4.2 us, M = 256 +1.2..+1.5; down / O at M =
// 224, k = 2: 18.3 -> 20.7 / 15.8 -> 18.1 us). So k = 2, 3 take it only on a device whose DRAM
// peak is at least KBIT_WG_SK_TILE_LOWBIT_GBPS (from the memory clock and bus width: H100 SXM
// ~3350 GB/s, H200 ~4800).
#ifndef KBIT_WG_SK_TILE_LOWBIT_GBPS
#define KBIT_WG_SK_TILE_LOWBIT_GBPS 4000
#endif
// Peak DRAM bandwidth of `device` in GB/s (2 transfers per memory clock); 0 where the driver
// does not report the clock or the bus width. Read once per device.
int dram_peak_gbps(int device) {
  static int known[64] = {};  // 0 unknown, -1 not reported, else GB/s
  if (device < 0 || device >= 64) return 0;
  if (known[device] == 0) {
    int khz = 0, bits = 0;
    const bool ok = cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, device) == cudaSuccess &&
                    cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, device) == cudaSuccess &&
                    khz > 0 && bits > 0;
    if (!ok) cudaGetLastError();  // a failed query leaves no error behind for the next launch
    known[device] = ok ? max(1, int(2.0 * khz * 1e3 * (bits / 8) / 1e9)) : -1;
  }
  return max(known[device], 0);
}
// Whether a K_BITS call may take choose()'s stream-K tile at M = 193..256 (see above).
bool sk_tile_allowed(int device, int k_bits) {
  return k_bits >= 4 || dram_peak_gbps(device) >= KBIT_WG_SK_TILE_LOWBIT_GBPS;
}
void choose(int64_t M, int64_t N, int64_t K, bool sk, int& tn, int& wg, int sms) {
  const int64_t rows1 = ceil_div(N, 64);  // row tiles of a 1-warpgroup CTA
  const int64_t rows2 = ceil_div(N, 128);  // row tiles of a 2-warpgroup CTA
  if (M <= 128) {
    tn = M <= 32 ? 32 : M <= 64 ? 64 : 128;
    wg = ceil_div(M, tn) * rows2 >= 2 * sms ? 2 : 1;
  } else if (M > 192 && M <= 256 && rows1 <= sms &&
             (20 * rows1 >= 9 * sms || (sk && N % 64 == 0 && rows1 * ceil_div(K, kStepK) >= 2 * sms))) {
    // one token tile of 64-row CTAs that make 0.45 .. 1 wave: no K split (or 2 where the
    // split model takes it) instead of 256.2's 128-row tiles and their split-K reduction over
    // distributed shared memory (~8700 cycles of ~38000 at gateup 256.2.2, NOTES.md v19). H100
    // sweep at M = 256, us (k = 4 / 5): gateup 256.1.1 17.0 / 18.8 vs 256.2.2 19.9 / 20.5; Q
    // 256.1.2 13.8 / 14.9 vs 128.2.2 14.1 / 15.6. Not below M = 193: at M = 160 it measured
    // slower (gateup k = 4 23.7 vs 18.0 us; not understood).
    tn = 256;
    wg = 1;
  } else if (10 * ceil_div(M, 256) * rows2 >= 3 * sms) {
    tn = 256;
    wg = 2;
  } else {
    tn = 128;
    wg = 9 * ceil_div(M, 128) * rows2 >= 4 * sms ? 2 : 1;
  }
  if (forced_tn() != 0) tn = forced_tn();
  if (forced_wg() != 0) wg = forced_wg();
}

// Stages for this configuration (0: none fits). shared: the most (up to kMaxStages, at least
// kMinSharedStages) with which 2 CTAs fit an SM's shared memory (0 if none); else (solo) the
// most that fit one CTA. `bytes`: the dynamic shared memory to ask for; solo asks for more than
// half an SM's, so that no second CTA joins it (a solo layout of ~107 KB let the scheduler
// pack a cluster's CTAs 2 per SM: KV 4.8 -> 5.3 us at M = 16, NOTES.md v17).
template <typename T, int K_BITS, int TN, int WG, bool W5 = false>
int stages_for(int device, bool shared, uint32_t& bytes) {
  using S = Shape<K_BITS, TN, WG>;
  const DeviceInfo& d = device_info(device);
  // counted from shared address 0: whether dynamic shared memory starts at 0 or after the
  // reservation (<= kTableAt), it then reaches the layout's end
  auto bytes_of = [&](int st) { return rs_layout(0, S::stage_bytes, st, kTableBytes<K_BITS, W5>, S::red_bytes).end; };
  for (int st = kMaxStages; st >= (shared ? kMinSharedStages : 2); st--) {
    bytes = bytes_of(st);
    const bool fits = shared ? 2 * (int64_t(bytes) + d.smem_reserved) <= d.smem_per_sm : true;
    if (fits && int64_t(bytes) <= d.smem_optin) {
      if (!shared) bytes = max(bytes, uint32_t(min(d.smem_optin, d.smem_per_sm / 2 - d.smem_reserved + 1024)));
      return st;
    }
  }
  return 0;
}

template <typename T, int K_BITS, int TN, int WG, int FMT, bool W5 = false>
cudaError_t launch_cfg(int device, cudaStream_t stream, const void* x, int64_t M, int64_t ldx,
                       const int32_t* packed, const void* absmax, int fmt, const float* codebook,
                       int64_t N, int64_t K, int splits, int exponent, const void* bias, void* out, int64_t ldo,
                       Workspace ws) {
  constexpr auto kernel = wgmma_kernel<T, K_BITS, TN, WG, W5, FMT>;
  const unsigned threads = WG * 128 + kProducerThreads<TN, WG>;
  const int64_t tiles = ceil_div(N, kWgRows * WG) * ceil_div(M, TN);
  const int sms = device_info(device).sms;
  // Two layouts: "shared" (fewer stages, 2 CTAs fit an SM) and "solo" (the most stages, one
  // CTA per SM). Two CTAs per SM hide each other's step chain (copy -> decode -> wgmma): with
  // the table at a 64 KB aligned address k = 4 / 5 could only run solo and were up to 1.8x
  // slower than k = 2 / 3 (which ran 2-3 per SM) at M <= 64 (NOTES.md v17). But a grid of at
  // most one CTA per SM runs faster solo: shared, the scheduler packed a cluster's CTAs 2 per
  // SM (KV at M = 16..256: 4.8 -> 5.4 .. 8.1 -> 11.8 us). So: plan shared, and take it when
  // its grid has more CTAs than SMs; else plan solo.
  //
  // K split over a cluster of `splits` CTAs: the count whose waves x steps per CTA is least
  // (+ kSplitOverhead steps per CTA for the table build and the reduction; ties: fewer
  // splits), with at least 2 steps per CTA. Waves come from the clusters that fit at once
  // (clusters_at_once, once per device, layout and count): solo, clusters of 4 fit on fewer
  // than 132 SMs, and 32 clusters of 4 ran as 2 waves (down, k = 4, NOTES v12).
  // The two layouts' stages and bytes, once per device (stages_for). The function's dynamic
  // shared memory limit covers the solo layout (the larger), set before the occupancy queries
  // (which count with it). The shared layout is dropped when its 2 CTAs do not fit an SM for
  // another reason (registers: TN = 128 with 2 warpgroups), so that such a grid keeps solo's
  // stages.
  static int plan_stages[2][64];
  static uint32_t plan_bytes[2][64];
  static bool planned[64] = {};
  if (!planned[device]) {
    plan_stages[0][device] = stages_for<T, K_BITS, TN, WG, W5>(device, false, plan_bytes[0][device]);
    if (plan_stages[0][device] == 0) return cudaErrorInvalidValue;
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(plan_bytes[0][device]));
    if (e != cudaSuccess) return e;
    plan_stages[1][device] = stages_for<T, K_BITS, TN, WG, W5>(device, true, plan_bytes[1][device]);
    int per_sm = 0;
    if (plan_stages[1][device] > 0 &&
        (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, int(threads), plan_bytes[1][device]) !=
             cudaSuccess ||
         per_sm < 2)) {
      (void)cudaGetLastError();
      plan_stages[1][device] = 0;
    }
    planned[device] = true;
  }
  static int fit[2][64][kMaxSplits + 1] = {};  // clusters (CTAs for 1) at once; 0 unknown, -1 none
  const bool sk_forced = splits == -1;  // stream-K asked for (used where it applies)
  const int forced_splits = sk_forced ? 0 : splits;
  const int64_t kt = ceil_div(K, kStepK);
  int64_t plan_cost = -1;  // of the chosen plan: waves x (steps per CTA + kSplitOverhead)
  // A layout's stages, its bytes, K splits and (unforced splits) cost.
  auto plan = [&](bool shared, uint32_t& smem, int& sp_out, int64_t& cost) -> int {
    const int stages = plan_stages[shared][device];
    if (stages == 0) return 0;
    smem = plan_bytes[shared][device];
    sp_out = forced_splits;
    if (sp_out == 0) {
      constexpr int64_t kSplitOverhead = 4;
      int64_t best = -1;
      sp_out = 1;
      for (int sp = 1; sp <= kMaxSplits && (sp == 1 || kt >= 2 * sp); sp++) {
        int& f = fit[shared][device][sp];
        if (f == 0) {
          const int n = clusters_at_once(kernel, threads, smem, sp, 2);
          f = n > 0 ? n : -1;
        }
        if (f < 0) continue;
        const int64_t c = ceil_div(tiles, f) * (ceil_div(kt, sp) + kSplitOverhead);
        if (best < 0 || c < best) {
          best = c;
          sp_out = sp;
        }
      }
      cost = best;
    }
    return stages;
  };
  uint32_t smem = 0;
  int stages = plan(true, smem, splits, plan_cost);
  bool solo = stages == 0 || tiles * splits <= sms;
  if (solo) stages = plan(false, smem, splits, plan_cost);
  // Stream-K: one CTA per SM deals the tiles' k-steps evenly (kernel comment), where the tiles
  // are fewer than the SMs (a CTA then holds at most the tail of one tile and the head of the
  // next), every tile has all its rows and the workspace holds the partials; forced (splits
  // -1) or where the split model costs it below the cluster split's plan. Its overhead grows
  // with the partial tile past 32 KB: 256.2's 64 KB tiles measured slower than the cluster
  // split (gateup M = 192 k = 4 20.3 vs 18.6 us, NOTES.md v23).
  // (tiles x kt >= 2 SMs: every CTA has at least 2 units, so none contributes an empty head
  // whose flag no owner would consume.)
  const bool sk_fits = N % (kWgRows * WG) == 0 && tiles < sms && tiles * kt >= 2 * sms && sms <= kFlagBytes / 4 &&
                       (ws.need != nullptr || (ws.ptr != nullptr && ws.bytes >= streamk_bytes(sms, kWgRows * WG, TN)));
  const int64_t sk_overhead = streamk_overhead() * (kWgRows * WG * TN > 16384 ? kWgRows * WG * TN / 16384 : 1);
  // k = 5: the wide table's solo layout, once per device (its stages; -1: none fit).
  [[maybe_unused]] int wide5_stages = -1;
  if constexpr (K_BITS == 5 && !W5) {
    static int wide_stages[64] = {};
    if (wide_stages[device] == 0) {
      uint32_t wide_bytes = 0;
      const int st = stages_for<T, K_BITS, TN, WG, true>(device, false, wide_bytes);
      wide_stages[device] = st > 0 ? st : -1;
    }
    wide5_stages = wide_stages[device];
    // Two CTAs per SM (shared) read the narrow table, whose columns lanes L and L + 16 share
    // (2-way bank conflicts); a solo CTA takes the wide one (none) where it leaves enough
    // stages. Measured (H100, NOTES.md v42, M = 17..64): where the tiles are fewer than the
    // SMs (the second CTA per SM comes from the K split) the shared plan was no faster per SM
    // than solo (Q M = 64: shared, 4 splits 10.6 us; solo, 2 splits 9.6; gateup M = 64: shared,
    // 3 splits 13.2; stream-K 11.6), so there at k = 5 its cost counts double against the
    // solo plan and stream-K (which then run with the wide table: below). With more tiles
    // than SMs two CTAs per SM pay (28672 x 8192 at M = 48: shared 128 us, solo 176).
    if (!solo && tiles < sms && forced_splits == 0 && !sk_forced && forced_table() == 0 && plan_cost >= 0 &&
        wide5_stages >= KBIT_WG_WIDE5_MIN_STAGES) {
      const int64_t shared_cost = 2 * plan_cost;
      uint32_t solo_smem = 0;
      int solo_splits = 1;
      int64_t solo_cost = -1;
      const int solo_stages = plan(false, solo_smem, solo_splits, solo_cost);
      int64_t alt = solo_stages > 0 ? solo_cost : -1;
      if (solo_stages > 0 && sk_fits && (alt < 0 || ceil_div(tiles * kt, sms) + sk_overhead < alt))
        alt = ceil_div(tiles * kt, sms) + sk_overhead;
      if (alt >= 0 && alt <= shared_cost) {
        solo = true;
        stages = solo_stages;
        smem = solo_smem;
        splits = solo_splits;
        plan_cost = solo_cost;
      }
    }
  }
  const bool want_sk = sk_fits && (sk_forced || (forced_splits == 0 && solo && plan_cost >= 0 &&
                                                 ceil_div(tiles * kt, sms) + sk_overhead < plan_cost));
  if (want_sk) {
    solo = true;
    stages = plan(false, smem, splits, plan_cost);
    splits = 1;
  }
  if constexpr (K_BITS == 5 && !W5) {
    // solo at k = 5: the wide table (no bank conflicts) where it leaves enough stages
    const int ft = forced_table();
    if (ft != 1 && (solo || ft == 2) && wide5_stages >= (ft == 2 ? 1 : KBIT_WG_WIDE5_MIN_STAGES))
      return launch_cfg<T, K_BITS, TN, WG, FMT, true>(device, stream, x, M, ldx, packed, absmax, fmt, codebook, N,
                                                      K, sk_forced ? -1 : forced_splits, exponent, bias, out, ldo,
                                                      ws);
  }
  if (stages == 0) return cudaErrorInvalidValue;
  if (splits < 1 || splits > kMaxSplits) return cudaErrorInvalidValue;
  if (ws.need != nullptr || ws.cost != nullptr) {  // a dry query: nothing launches
    if (ws.need != nullptr) *ws.need = want_sk ? streamk_bytes(sms, kWgRows * WG, TN) : 0;
    if (ws.cost != nullptr) *ws.cost = want_sk ? ceil_div(tiles * kt, sms) + sk_overhead : plan_cost;
    return cudaSuccess;
  }
  static const bool trace = std::getenv("KBIT_WG_TRACE") != nullptr;  // experiments: each launch's plan
  if (trace) {
    const int* f = fit[solo ? 0 : 1][device];
    std::fprintf(stderr,
                 "kbit wgmma: k=%d TN=%d WG=%d wide=%d M=%lld N=%lld K=%lld tiles=%lld %s stages=%d smem=%u "
                 "splits=%d streamk=%d split_cost=%lld clusters_at_once(S=1..8, 0 unknown)=%d %d %d %d %d %d %d %d\n",
                 K_BITS, TN, WG, int(W5), (long long)M, (long long)N, (long long)K, (long long)tiles,
                 solo ? "solo" : "shared", stages, smem, splits, int(want_sk), (long long)plan_cost, f[1], f[2], f[3],
                 f[4], f[5], f[6], f[7], f[8]);
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = want_sk ? dim3(unsigned(sms))
                        : dim3(unsigned(ceil_div(N, kWgRows * WG)), unsigned(ceil_div(M, TN)), unsigned(splits));
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  // wgmma_capable implies sm_90 code, so PDL follows KBIT_PDL alone (launch_kernel: clusters
  // along z for the K split, and PDL).
  const int pdl = pdl_mode();
  // x as a 2-D tensor [M, K] (row stride ldx) read in boxes of 64 k x TN tokens with 128-byte
  // swizzle; out-of-range elements (tokens >= M, k >= K) arrive as zeros.
  CUtensorMap x_map;
  const cuuint64_t dims[2] = {cuuint64_t(K), cuuint64_t(M)}, strides[1] = {cuuint64_t(ldx) * 2};
  const cuuint32_t box[2] = {kStepK, TN}, elem_strides[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(
      &x_map, std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
      const_cast<void*>(x), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return cudaErrorInvalidValue;
  last_streamk() = want_sk;
  char* const sk_ws = want_sk ? static_cast<char*>(ws.ptr) + kFlagBytes : nullptr;
  unsigned* const sk_flags = want_sk ? static_cast<unsigned*>(ws.ptr) : nullptr;
  return launch_kernel(cfg, splits, 2, pdl, kernel, x_map, int(M), packed, absmax, fmt, codebook, int(N), int(K),
                       stages, splits, ldexpf(1.f, exponent), static_cast<const T*>(bias), static_cast<T*>(out), ldo,
                       pdl > 0 && ws.weights_stable ? 2 : pdl, sk_ws, sk_flags);
}

template <typename T, int K_BITS, int FMT>
cudaError_t launch_bits(int device, cudaStream_t s, const void* x, int64_t M, int64_t ldx,
                        const int32_t* p, const void* a, int fmt, const float* cb, int64_t N,
                        int64_t K, int e, const void* bias, void* out, int64_t ldo, Workspace ws) {
  const int splits = forced_splits(), sms = device_info(device).sms;
  auto run = [&](int tn, int wg, Workspace w) -> cudaError_t {
#define KBIT_WG_CASE(TN_, WG_)                                                                    \
  if (tn == TN_ && wg == WG_)                                                                     \
    return launch_cfg<T, K_BITS, TN_, WG_, FMT>(device, s, x, M, ldx, p, a, fmt, cb, N, K, splits, e, bias, out, ldo, w);
    KBIT_WG_CASE(32, 1) KBIT_WG_CASE(64, 1) KBIT_WG_CASE(128, 1) KBIT_WG_CASE(256, 1)
    KBIT_WG_CASE(32, 2) KBIT_WG_CASE(64, 2) KBIT_WG_CASE(128, 2) KBIT_WG_CASE(256, 2)
    return cudaErrorInvalidValue;
  };
  const bool has_ws = ws.ptr != nullptr || ws.need != nullptr;
  const bool sk_tile = sk_tile_allowed(device, K_BITS), sk = sk_tile && has_ws;
  // The tile of a launch with or without a stream-K workspace: choose(), then at TN = 32 two
  // warpgroups (128-row tiles) where the split model costs them at most 2/3 of one
  // warpgroup's. Gateup (5120 x 2048) at k = 4: 2 CTAs of the 64 KB-table kernel per SM fit
  // 79 3-way clusters of its 80 64-row tiles, so WG = 1 splits 2 ways (cost 20, 10.7 us) while
  // 40 128-row tiles split 5 ways in one wave (cost 11, 9.1 us); Q (4096 x 2048) at k = 4, 5
  // costs 15 -> 9 (8.6 -> 8.1 us at k = 4, 10.0 -> 9.3 at k = 5, M = 16). At k = 2, 3 every
  // dense shape costs the same with WG = 2 (slower: Q 7.2 -> 7.6 us), down, O and KV cost
  // more (NOTES.md v23, v26, v27). The cost queries model stream-K exactly when the launch
  // has a workspace (launch_cfg considers it at every k).
  auto pick = [&](bool with_ws, int& tn, int& wg) {
    choose(M, N, K, with_ws && sk_tile, tn, wg, sms);
    if (tn == 32 && wg == 1 && forced_tn() == 0 && forced_wg() == 0 && splits == 0) {
      int64_t need = 0, c1 = -1, c2 = -1;
      int64_t* np = with_ws ? &need : nullptr;
      if (run(32, 1, Workspace{nullptr, 0, np, &c1}) == cudaSuccess &&
          run(32, 2, Workspace{nullptr, 0, np, &c2}) == cudaSuccess && c1 > 0 && c2 > 0 && 3 * c2 <= 2 * c1)
        wg = 2;
    }
  };
  int tn, wg;
  pick(has_ws, tn, wg);
  if (sk && ws.need == nullptr) {
    // the tile may have been taken only for stream-K's sake: where launch_cfg would then not
    // run stream-K (its cost model, a workspace too small), the tile picked without one
    int tn0, wg0;
    pick(false, tn0, wg0);
    if (tn0 != tn || wg0 != wg) {
      int64_t need = 0;
      if (run(tn, wg, Workspace{nullptr, 0, &need}) != cudaSuccess || need == 0 || need > ws.bytes) {
        tn = tn0;
        wg = wg0;
      }
    }
  }
  return run(tn, wg, ws);
#undef KBIT_WG_CASE
}

}  // namespace
}  // namespace kbit

extern "C" int kbit_wgmma_available(int device) { return kbit::wgmma_capable(device) ? 1 : 0; }

extern "C" void kbit_wgmma_force_config(int tn, int wg, int splits, int table) {
  kbit::forced_tn() = tn;
  kbit::forced_wg() = wg;
  kbit::forced_splits() = splits;
  kbit::forced_table() = table;
}

extern "C" int kbit_wgmma_last_streamk() { return kbit::last_streamk(); }

namespace kbit {
namespace {
int wgmma_entry(int device, void* stream, const void* x, int dtype, int64_t M, int64_t ldx, const int32_t* packed,
                const void* absmax, int absmax_format, const float* codebook, int k, int64_t N, int64_t K,
                int absmax_exponent, const void* bias, void* out, int64_t ldo, Workspace ws) {
  DeviceGuard guard(device);
  if (guard.err != cudaSuccess) return guard.err;
  if (M == 0 || N == 0) return cudaSuccess;
  if (!wgmma_capable(device)) return cudaErrorNotSupported;
  const auto misaligned = [](const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a != 0; };
  if (N % 8 || K % 8 || ldx % 8 || N >= (int64_t(1) << 31) || K >= (int64_t(1) << 31) ||
      M >= (int64_t(1) << 31) || misaligned(x, 16) || misaligned(packed, 16) || misaligned(absmax, 16) ||
      absmax_format < 0 || absmax_format > 2)
    return cudaErrorInvalidValue;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  auto by_fmt = [&](auto t, auto k_bits) -> cudaError_t {
    using T = decltype(t);
    constexpr int kBits = decltype(k_bits)::value;
    if (absmax_format == KBIT_ABSMAX_E4M4)
      return launch_bits<T, kBits, KBIT_ABSMAX_E4M4>(device, s, x, M, ldx, packed, absmax, absmax_format, codebook, N,
                                                     K, absmax_exponent, bias, out, ldo, ws);
    return launch_bits<T, kBits, kRuntimeFmt>(device, s, x, M, ldx, packed, absmax, absmax_format, codebook, N, K,
                                              absmax_exponent, bias, out, ldo, ws);
  };
  auto by_k = [&](auto t) -> cudaError_t {
    switch (k) {
      case 2: return by_fmt(t, std::integral_constant<int, 2>());
      case 3: return by_fmt(t, std::integral_constant<int, 3>());
      case 4: return by_fmt(t, std::integral_constant<int, 4>());
      case 5: return by_fmt(t, std::integral_constant<int, 5>());
    }
    return cudaErrorInvalidValue;
  };
  switch (dtype) {
    case KBIT_F16: return by_k(__half());
    case KBIT_BF16: return by_k(__nv_bfloat16());
  }
  return cudaErrorInvalidValue;
}
}  // namespace
}  // namespace kbit

extern "C" int kbit_wgmma(int device, void* stream, const void* x, int dtype, int64_t M, int64_t ldx,
                          const int32_t* packed, const void* absmax, int absmax_format,
                          const float* codebook, int k, int64_t N, int64_t K, int absmax_exponent,
                          const void* bias, void* out, int64_t ldo, void* workspace, int64_t workspace_bytes,
                          int flags) {
  kbit::Workspace ws{workspace, workspace_bytes, nullptr};
  ws.weights_stable = (flags & KBIT_WEIGHTS_STABLE) != 0;
  return kbit::wgmma_entry(device, stream, x, dtype, M, ldx, packed, absmax, absmax_format, codebook, k, N, K,
                           absmax_exponent, bias, out, ldo, ws);
}

extern "C" int64_t kbit_wgmma_workspace_bytes(int device, int dtype, int64_t M, int64_t K, int64_t N, int k,
                                              int absmax_format) {
  int64_t need = 0;
  const int err = kbit::wgmma_entry(device, nullptr, nullptr, dtype, M, K, nullptr, nullptr, absmax_format, nullptr,
                                    k, N, K, 0, nullptr, nullptr, N, kbit::Workspace{nullptr, 0, &need});
  return err == 0 ? need : 0;
}
