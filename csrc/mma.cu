// mma: C[M, N] = x[M, K] @ W^T (+ bias) for M = 1..16 on tensor cores, W k-bit in the tiled64
// layout. The weights are decoded straight into mma.sync A fragments in registers; no
// dequantized tile ever goes through shared memory.
//
// One mma.sync.m16n8k16 multiplies A = W (16 weight rows x 16 k) by B = x^T (16 k x 8 tokens;
// tokens >= M are zero), so every MMA is fully used on the weight side and M = 9..16 reuses
// each decoded A fragment for a second token tile. A lane (g = lane / 4, c = lane % 4) holds
// A values of rows g and g + 8. A "step" of a warp is 16 weight rows x 128 k = 64
// quantization blocks: lane (g, c) loads block c of rows g and g + 8 (k-tile 2 * step + c / 2,
// block c % 2), decodes their 32 + 32 values and feeds them to 8 MMAs. The k order inside an
// MMA is free as long as x uses the same one, so each lane keeps the values of its own blocks
// and x is staged in shared memory in that permuted "fragment order" (one 8-byte load per
// lane per MMA and token tile, conflict-free).
//
// Decode (k = 2..4): the k bit-planes of a block are transposed in registers (delta swaps)
// into words whose nibbles (k = 3, 4) or 2-bit fields (k = 2) hold the indices of values
// r, r + 4, r + 8, ... (r = word); one shared-memory load then returns two (k = 3, 4) or four
// (k = 2) codebook values, packed, from a byte of indices, multiplied by the block scale with
// one packed multiply per pair. The table is private per lane (entry e of lane L at byte
// e * 256 + L * entry bytes, the table 64 KB aligned in the shared window), so the lookups of
// a warp never conflict and one PRMT forms the whole shared address (the byte of indices as
// byte 1, the lane's offset as byte 0, the table's address as bytes 2-3; k = 3, 4 leave half
// of each 256-byte row unused). k = 5 decodes the low 4 bits like k = 4 and adds the 2 high
// bits of the pair to the address (entry_addr5: PRMT + LOP3; 16 columns shared by 2 lanes
// each), except at M <= 8 with the register ring, where a 128 KB table gives every lane its own
// column (kWide5: entry_addr5w). The
// block scale (E4M4: exact in fp16 and bf16) multiplies the codebook value in the activation
// dtype; the per-tensor power of two multiplies the fp32 accumulator at the end, so it cannot
// overflow or underflow the 16-bit weights.
//
// Work split: one CTA of 16 warps (8 where a CTA has few items: kFewWarps) per SM (the codebook
// table and staged x are built once per SM); a CTA owns RG groups of 16 rows over all of K (RG
// = the fewest row groups per CTA that cover the rows in one wave, or spread evenly over two or
// more waves where the accumulator does not fit). Two ways to feed it (see
// mma_kernel): a register ring per warp (the warps share the CTA's RG * steps items, "item" =
// one warp step, in contiguous runs), or for RG >= 6 a ring of shared-memory stages filled by
// bulk asynchronous copies. Warps hand their fp32 results to shared memory when their row
// group changes and at the end (each into its own tile where they fit, else added into one
// accumulator with atomics: mma_body's flush); the CTA then writes C. Where staged x would be large, K
// is split over S = 2, 4 or 8 CTAs that add their partial sums through a global workspace
// (plan_of, mma_body's step 4). NOTES.md has the measured timeline of a call
// (scripts/mma_timeline.cu).
#include <cstdlib>

#include "async.cuh"
#include "common.cuh"
#include "tc.cuh"

namespace kbit {
namespace {

// Timeline hooks for scripts/mma_timeline.cu (empty in the library): KBIT_MMA_MARK(i, dep)
// records when a warp reaches point i, after the register `dep` is available.
#ifndef KBIT_MMA_MARK
#define KBIT_MMA_MARK(i, dep)
#endif

#ifndef KBIT_MMA_WARPS
#define KBIT_MMA_WARPS 16  // overridable for experiments (scripts/build_variant.sh)
#endif
// Warps per CTA: 16 of <= 128 registers (32 warps were 10-15% slower on the small shapes
// once the ring's first loads stopped blocking the table build, NOTES.md).
// NT = 8 (M = 33..64): 8 warps of <= 255 registers (its 32 accumulators spilled at 128).
#ifndef KBIT_MMA_WARPS_NT8
#define KBIT_MMA_WARPS_NT8 8
#endif
template <int NT> constexpr int kWarpsPerCta = NT == 1 ? KBIT_MMA_WARPS : NT == 8 ? KBIT_MMA_WARPS_NT8 : 16;
template <int NT> constexpr int kThreadsPerCta = kWarpsPerCta<NT> * 32;
// NT = 1 register-ring CTAs with few items also come with 8 warps (a template variant; the rule
// is in launch(): k = 2 with 9..16 items, k = 5 with 9..40, from a same-run sweep with the slot
// flush, NOTES.md v38; v33 had measured it with the atomic flush, and 24 warps slower
// everywhere).
constexpr int kFewWarps = 8;
constexpr int kFewWarpsDepth2 = 4;  // ring items per warp of the 8-warp variant at k = 2
#ifndef KBIT_MMA_DEPTH
#define KBIT_MMA_DEPTH(k) ((k) >= 4 ? 2 : 3)
#endif
template <int K_BITS> constexpr int kDepth = KBIT_MMA_DEPTH(K_BITS);  // items in flight per warp (registers)
// Items a warp loads before the table build: each load waits in the SM's load/store queue
// ahead of the build's shared stores, so a full ring there delays the whole CTA.
#ifndef KBIT_MMA_UPFRONT
#define KBIT_MMA_UPFRONT 1
#endif
// Except at NT = 2 (M = 9..16) with k = 2 (3 ring items): there the whole ring goes out before
// the table build (NOTES.md v48: dense TOTAL M = 12 / 16 -0.5..-1.0 us on the H200, equal on
// the H100; k = 3, also 3 items, was 0.2-0.5 us slower on the H100 at M = 16; at k = 4, 5, 2
// items, it gained nothing and cost the single accumulator set its gain).
#ifndef KBIT_MMA_UPFRONT_NT2_K2
#define KBIT_MMA_UPFRONT_NT2_K2 1
#endif
template <int D, int NT, int K_BITS>
constexpr int kUpfront = (KBIT_MMA_UPFRONT_NT2_K2 && NT == 2 && K_BITS == 2) ? D
                         : D < KBIT_MMA_UPFRONT                               ? D
                                                                              : KBIT_MMA_UPFRONT;
// The register ring's weight loads stream through L2 evict-first (ld.global.cs), so that the
// weights do not push x, the codebook and the kernel's code out of L2: 2-4% faster at M =
// 1..16 on the H100 (NOTES.md v15). The bulk copies keep the normal policy: with an
// evict-first cache hint, 28672 x 8192 at M = 1, k = 4 was 4-6% slower.
#ifndef KBIT_MMA_EVICT_FIRST
#define KBIT_MMA_EVICT_FIRST 1
#endif
// KBIT_MMA_AB_ONLY=1 (experiment builds, scripts/build_ab_objs.sh): only fp16 activations with
// E4M4 scales, what `kbit bench` times; other calls fail with cudaErrorNotSupported (an object
// of ~6 MB instead of ~15, so that several variants of this file fit one device call's carry).
#ifndef KBIT_MMA_AB_ONLY
#define KBIT_MMA_AB_ONLY 0
#endif
// The register ring's main loop (NOTES.md v31): KBIT_MMA_PEEL = 1 (default) runs the first
// round of ring items before the loop, as straight-line code after the prologue's barrier, at
// NT = 1 (M <= 8: 0.1-0.4 us faster per M = 1 call on the H100; at NT = 2 it was 0-0.3 us
// slower). (Refilling every slot without a branch was slower: NOTES.md v31.)
#ifndef KBIT_MMA_PEEL
#define KBIT_MMA_PEEL 1
#endif
// KBIT_MMA_SPEC_TABLE (NOTES.md v32): when launched with PDL, read the codebook and build the
// table BEFORE the PDL wait (overlapping the previous kernel's end), then re-read the codebook
// after the wait (through L2) and rebuild the table at the prologue's barrier if any entry
// changed (a copy or repack by the previous kernel): the same results, without the
// codebook's latency and the table build in front of the first decode. 1 (default): k = 5 at
// NT = 1 only (its table is the costliest to build; measured on the H100 back-to-back 0.1-0.4
// us faster per k = 5 call at M = 1..4 and even after a non-PDL kernel, while k = 2, 4 calls
// were 0.1-0.3 us slower after a non-PDL kernel, where the build is no longer hidden, and M =
// 16 calls up to 1 us slower); 2: every k and NT; 0: never.
// Timing probe (wrong results, experiments only): KBIT_MMA_PROBE_NOTR = 1 skips the in-register
// transposes of the bit-plane words in item_mma (what a layout stored pre-transposed would save).
#ifndef KBIT_MMA_PROBE_NOTR
#define KBIT_MMA_PROBE_NOTR 0
#endif
// NT = 1: the B fragments of two MMAs per 16-byte x load (frag_at; 0: one 8-byte load per MMA)
#ifndef KBIT_MMA_XPAIR
#define KBIT_MMA_XPAIR 1
#endif
// Only k = 2, 3, 4: k = 5 measured slower with it twice (O, Q, down at M = 1..8 +0.2-0.4 us
// each, not understood; its NT = 1 kernels take the 128 KB wide table; NOTES.md v56, v57).
// KBIT_MMA_XPAIR_KMASK: bit k set = k uses it (default 28: k = 2, 3, 4)
#ifndef KBIT_MMA_XPAIR_KMASK
#define KBIT_MMA_XPAIR_KMASK 28
#endif
template <int K_BITS, int NT>
constexpr bool kXPair = KBIT_MMA_XPAIR && NT == 1 && ((KBIT_MMA_XPAIR_KMASK >> K_BITS) & 1);
// k = 5 at NT = 1 (M <= 8, register ring): the 128 KB "wide" codebook table, a column per lane
// (no bank conflicts; entry_addr5w, as wgmma.cu's), at the start of the shared window; 0 keeps
// the 64 KB table whose columns lanes L and L + 16 share (2-way conflicts). H100 probe with the
// conflicts removed (NOTES.md v40): dense TOTAL k = 5 -1.2 us at M = 1, -0.7 at M = 4.
#ifndef KBIT_MMA_WIDE5
#define KBIT_MMA_WIDE5 1
#endif
#ifndef KBIT_MMA_SPEC_TABLE
#define KBIT_MMA_SPEC_TABLE 1
#endif
// KBIT_MMA_EARLY_CB (default; the environment variable of the same name overrides it, for
// experiments): in the kernels that request their first ring items before the PDL wait (NT =
// 1, register ring, the caller's KBIT_MMA_WEIGHTS_STABLE), 1 also reads the codebook before
// the wait (the table build's first shuffle waited for that load: ~11% of an M = 1 call's
// stall samples, NOTES.md v38) and 2 builds the table there too; 0: both after the wait.
// The speculative table (KBIT_MMA_SPEC_TABLE, k = 5 at NT = 1) keeps its own path; in mode 2
// it trusts its pre-wait codebook read (no re-read, no compare: H200 -0.4..-0.5 us of M = 1..8's
// k = 5 dense TOTAL, NOTES.md v61). Passed as the
// kernel's pdl: 2 + mode. H200, 3 rounds back-to-back, dense TOTAL (NOTES.md v60): mode 2
// -0.3..-0.6 us at M = 1, -0.6..-1.0 at M = 4, -1.0..-1.4 at M = 8 (k = 2, 3, 4); mode 1
// -0.0..-0.4; after a non-PDL kernel mode 2 is within -0.5..+0.5 us.
#ifndef KBIT_MMA_EARLY_CB
#define KBIT_MMA_EARLY_CB 2
#endif
// KBIT_MMA_EARLY_NT2_KMASK (bit k set = k): the same codebook / table before the wait in the
// NT >= 2 kernels (M = 9..64, register ring; they request no ring items early: v52). The
// environment variable KBIT_MMA_EARLY_NT2=0 switches it off at run time (experiments). H200,
// every k compiled in, 2 rounds, MMA dense TOTAL (NOTES.md v60): k = 5 M = 12, 16 -0.8..-1.1 us,
// M = 32 -0.5; k = 2 -0.2..-0.4 at M = 12, 16 but +0.2..+0.4 at M = 32; k = 4 +-0.1 at M = 12,
// 16, +0.4..+0.5 at M = 32 (compiled in and off: +0.3 at M = 12, 16). So k = 5 only (k = 3,
// v61: -0.2 at M = 12, 16 and +0.3 at M = 32, mixed like k = 2). With both, H200 3 rounds (v61):
// k = 5 dense TOTAL M = 12, 16 -1.1..-1.9 us against the table after the wait.
#ifndef KBIT_MMA_EARLY_NT2_KMASK
#define KBIT_MMA_EARLY_NT2_KMASK 32
#endif
#ifndef KBIT_MMA_BULK_MIN_RG
#define KBIT_MMA_BULK_MIN_RG 6  // bulk copies (TMA) only for >= 6 row groups per CTA (see launch)
#endif
constexpr int kStepK = 128;                 // k values per step
constexpr int kRows = 16;                   // weight rows per step (the MMA's M)
constexpr int kXPad = 16;                   // halves of padding per staged x row (bank spread)
// Floats per (row group, token) row of the shared accumulator: 16 rows + 4 of padding, so the
// flush's atomics (lane (g, c): token 2c (+1), rows g, g + 8) hit 32 distinct banks (a
// stride of 16 made them 4-way conflicts: ncu counted ~400 extra wavefronts per CTA at M = 8).
constexpr int kAccStride = 20;
constexpr int kMaxXSmem = 136 * 1024;       // staged x larger than this: not handled here
constexpr int kMaxKSlices = 8;              // split-K: 2, 4 or 8 CTAs per row-group set

// A 16-byte load that sees other CTAs' stores made during this kernel (no L1 copy; split-K's
// partial sums).
__device__ __forceinline__ uint4 ld_relaxed_u32x4(const uint4* p) {
  uint4 v;
  asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}

// Position (0..31) inside the lane's block of the value that MMA s, slot u (0..3) uses:
// slots 0, 1 form A register 0 (row g) / 1 (row g + 8) and slots 2, 3 registers 2 / 3 (k = 2c,
// 2c + 1 and 2c + 8, 2c + 9 of the MMA). It follows from the decode below; the x staging
// uses the same map.
template <int K_BITS>
__host__ __device__ constexpr int slot_position(int s, int u) {
  return K_BITS == 2 ? 8 * (s & 3) + (s >> 2) + 2 * u   // word r = s / 4, byte j = s % 4
                     : 16 * (s & 1) + (s >> 1) + 4 * u;  // word r = s / 2, byte pair h = s % 2
}

// Codebook table, private per lane (entry e of lane L at e * 256 + L * entry bytes; k = 2: of
// lanes L and L + 16 at e * 256 + (L % 16) * 8, below): k = 2:
// 256 entries of 4 values (a byte of 2-bit indices); k = 3, 4: 128 / 256 entries of 2 values
// (a byte of two nibbles), at a 64 KB aligned shared address (entry_addr). k = 5: 1024
// entries of 2 values (two nibbles + their 2 high bits), entry (lo, hi) of lane L at
// lo * 256 + hi * 64 + (L % 16) * 4 (entry_addr5): lanes L and L + 16 share a column, so
// the lookups are 2-way bank conflicts; private columns need 128 KB (kWide5 below, M <= 8).
// k = 2 gives each entry 16 columns of 8 bytes (lanes L and L + 16 share one, the first 128
// bytes of each 256-byte row): its lookups are 8-byte loads, which shared memory serves a
// half-warp at a time, so lanes L and L + 16 do not conflict, and the build writes 32 KB
// instead of 64 (H100, NOTES.md v50: k = 2 calls at M = 1..16 0.1-0.35 us faster, dense
// TOTAL -0.7..-1.6 us in two same-run A/Bs; KBIT_MMA_K2_COLS = 32: a column per lane, the
// earlier table).
#ifndef KBIT_MMA_K2_COLS
#define KBIT_MMA_K2_COLS 16
#endif
static_assert(KBIT_MMA_K2_COLS == 16 || KBIT_MMA_K2_COLS == 32, "k = 2 table columns: 16 or 32");
template <int K_BITS>
__host__ __device__ constexpr int table_bytes() {
  return K_BITS == 2 ? 256 * 256 : K_BITS == 3 ? 128 * 256 : 256 * 256;
}
constexpr uint32_t kTableAlign = 64 * 1024;
// The wide k = 5 table (KBIT_MMA_WIDE5): entry (lo, hi0, hi1) of lane L at shared address
// window | hi1 << 16 | lo << 8 | hi0 << 7 | L << 2, + kWideAt (the LDS's immediate offset: the
// table starts at the window's 1 KB, where dynamic shared memory starts on sm_90), 128 KB.
constexpr uint32_t kWideAt = 1024, kWideBytes = 128 * 1024;
// The wide table up to this NT (experiments). NT = 2 too (M = 9..16) measured mixed on the H100
// (NOTES.md v40: dense TOTAL k = 5 M = 9 -0.3..-0.9 us, M = 16 +0.1..+0.6; the 28672-row
// weight at M = 12 79 -> 131 us: the larger layout changed its plan), so NT = 1 only.
#ifndef KBIT_MMA_WIDE5_MAX_NT
#define KBIT_MMA_WIDE5_MAX_NT 1
#endif
// Whether the register ring's kernel for M tokens takes the wide table (the bulk variant never
// does); kWide5 is the same for the kernel, from its token tiles (M <= 8 NT).
template <int K_BITS>
constexpr bool wide5_at(int M) { return KBIT_MMA_WIDE5 != 0 && K_BITS == 5 && M <= 8 * KBIT_MMA_WIDE5_MAX_NT; }
template <int K_BITS, int NT, bool BULK>
constexpr bool kWide5 = !BULK && wide5_at<K_BITS>(8 * NT);

// The words + stored absmax of the two blocks (rows g and g + 8) of one item.
template <int K_BITS>
struct Item {
  uint32_t w[2][K_BITS];
  uint32_t scale_bits[2];
};

// One block's words and stored absmax. An invalid block (row >= N or k-tile >= KT) reads the
// words of block 0, which always exists, and gets scale 0 without a load (so its values decode
// to 0 in every format).
template <int K_BITS, int FMT>
__device__ __forceinline__ void load_block(uint32_t (&w)[K_BITS], uint32_t& scale_bits,
                                           const int32_t* __restrict__ packed,
                                           const void* __restrict__ absmax, uint32_t block,
                                           bool valid) {
  const uint32_t blk = valid ? block : 0u;
  constexpr bool kStream = KBIT_MMA_EVICT_FIRST != 0;
  load_words<K_BITS, kStream>(w, packed + blk * K_BITS);
  scale_bits = load_absmax_bits_if<kStream>(absmax, FMT, blk, valid);
}

// One block's words and stored absmax from a bulk-copied stage in shared memory.
template <int K_BITS, int FMT>
__device__ __forceinline__ void read_block(uint32_t (&w)[K_BITS], uint32_t& scale_bits, const char* wp,
                                           const char* sp) {
  if constexpr (K_BITS == 4) {
    const uint4 v = *reinterpret_cast<const uint4*>(wp);
    w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
  } else if constexpr (K_BITS == 2) {
    const uint2 v = *reinterpret_cast<const uint2*>(wp);
    w[0] = v.x; w[1] = v.y;
  } else {
#pragma unroll
    for (int b = 0; b < K_BITS; b++) w[b] = reinterpret_cast<const uint32_t*>(wp)[b];
  }
  if constexpr (FMT == KBIT_ABSMAX_E4M4) scale_bits = *reinterpret_cast<const uint8_t*>(sp);
  else if constexpr (FMT == KBIT_ABSMAX_F16) scale_bits = *reinterpret_cast<const unsigned short*>(sp);
  else scale_bits = *reinterpret_cast<const uint32_t*>(sp);
}

// One item: decode both blocks (rows g, g + 8) into the A registers of MMA s (0: row g
// slots 0-1, 1: row g + 8 slots 0-1, 2: row g slots 2-3, 3: row g + 8 slots 2-3) and run
// the MMAs as soon as their A registers exist (a whole item at once would spill).
// lane_base: the table's shared address | this lane's offset in a row.
// xb[tt]: this lane's staged-x fragments of the step for token tile tt (a zero row for tokens
// >= M).
// Accumulator sets per token tile: two halve the chain of dependent MMAs for NT = 1; from NT =
// 2 on the tiles are independent chains enough, and one set per tile saves registers (NT = 2,
// register ring: 100-114 at k = 2..5, no spills) and the flush's adds (H200, NOTES.md v48: dense
// TOTAL M = 12 / 16 k = 4 -0.3..-0.9 us, k = 5 -0.3..-1.2; k = 2 equal).
#ifndef KBIT_MMA_ACC_SETS_NT2
#define KBIT_MMA_ACC_SETS_NT2 1
#endif
template <int NT> constexpr int kAccSets = NT >= 4 ? 1 : NT == 2 ? KBIT_MMA_ACC_SETS_NT2 : 2;

// k = 5: the table entry for byte I of n (low nibbles) and of hi (high bits: wide, as
// entry_addr5w wants them; else at bits 6, 7 as entry_addr5 does).
template <int I, bool W5>
__device__ __forceinline__ uint32_t lookup5(uint32_t n, uint32_t hi, uint32_t lane_base) {
  if constexpr (W5) return lds32_at<kWideAt>(entry_addr5w<I>(n, hi, lane_base));
  else return lds32(entry_addr5<I>(n, hi, lane_base));
}

template <typename T, int K_BITS, int NT, bool W5 = false>
__device__ __forceinline__ void item_mma(const Item<K_BITS>& it, const uint32_t (&s2)[2], uint32_t lane_base,
                                         const T* const (&xb)[NT], const bool (&xok)[NT],
                                         float (&acc)[NT][kAccSets<NT>][4]) {
  uint32_t xq[4];  // XPAIR: the B registers of MMAs s & ~1 and s | 1 (NT = 1)
  auto run = [&](int s, const uint32_t (&a)[4]) {
#pragma unroll
    for (int tt = 0; tt < NT; tt++) {
      if constexpr (kXPair<K_BITS, NT>) {
        // one 16-byte load at every even s (run goes s = 0, 1, ..., 7 at every k); lanes of
        // tokens >= M skip it as below
        if ((s & 1) == 0)
          asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %4, 0;\n @p ld.shared.v4.b32 {%0, %1, %2, %3}, [%5];\n}"
                       : "=r"(xq[0]), "=r"(xq[1]), "=r"(xq[2]), "=r"(xq[3])
                       : "r"(uint32_t(xok[tt])), "r"(uint32_t(__cvta_generic_to_shared(xb[tt] + (s >> 1) * 32))));
        mma16816<T>(acc[tt][(s & 1) % kAccSets<NT>], a[0], a[1], a[2], a[3], xq[(s & 1) * 2], xq[(s & 1) * 2 + 1]);
      } else if constexpr (NT == 1) {
        // lanes of tokens >= M skip the load (b0, b1 keep whatever the registers held: they
        // only feed the MMA's columns >= M, which never leave the accumulators)
        uint32_t b0, b1;
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p ld.shared.v2.b32 {%0, %1}, [%3];\n}"
                     : "=r"(b0), "=r"(b1)
                     : "r"(uint32_t(xok[tt])), "r"(uint32_t(__cvta_generic_to_shared(xb[tt] + s * 16))));
        mma16816<T>(acc[tt][(s & 1) % kAccSets<NT>], a[0], a[1], a[2], a[3], b0, b1);
      } else {
        (void)xok;
        const uint2 b = *reinterpret_cast<const uint2*>(xb[tt] + s * 16);
        mma16816<T>(acc[tt][(s & 1) % kAccSets<NT>], a[0], a[1], a[2], a[3], b.x, b.y);
      }
    }
  };
  if constexpr (K_BITS == 5) {
    // low nibbles as for k = 4; hi[h][r] byte i holds the high bits of values 8i + r (bit 6)
    // and 8i + 4 + r (bit 7) of block h (bit 8i + r / 8i + 4 + r of plane 4)
    uint32_t n[2][4], hi[2][4];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      n[h][0] = it.w[h][0]; n[h][1] = it.w[h][1]; n[h][2] = it.w[h][2]; n[h][3] = it.w[h][3];
      if (!KBIT_MMA_PROBE_NOTR) nibble_transpose(n[h][0], n[h][1], n[h][2], n[h][3]);
#pragma unroll
      for (int r = 0; r < 4; r++) {
        if constexpr (W5) {
          // bit 7 of byte i: value 8i + r's fifth bit; bit 0 of byte i + 1 (mod 4): value 8i + 4 + r's
          const uint32_t w4 = it.w[h][4];
          hi[h][r] = (__funnelshift_l(w4, w4, 7 - r) & 0x80808080u) | (__funnelshift_l(w4, w4, 4 - r) & 0x01010101u);
        } else {
          const uint32_t q = (it.w[h][4] >> r) & 0x11111111u;
          hi[h][r] = ((q | (q >> 3)) & 0x03030303u) << 6;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 4; r++) {
      uint32_t a[4];
#pragma unroll
      for (int h = 0; h < 2; h++) {
        a[h] = mul2<T>(lookup5<0, W5>(n[h][r], hi[h][r], lane_base), s2[h]);
        a[h + 2] = mul2<T>(lookup5<1, W5>(n[h][r], hi[h][r], lane_base), s2[h]);
      }
      run(2 * r, a);
#pragma unroll
      for (int h = 0; h < 2; h++) {
        a[h] = mul2<T>(lookup5<2, W5>(n[h][r], hi[h][r], lane_base), s2[h]);
        a[h + 2] = mul2<T>(lookup5<3, W5>(n[h][r], hi[h][r], lane_base), s2[h]);
      }
      run(2 * r + 1, a);
    }
  } else if constexpr (K_BITS == 2) {
    uint32_t n[2][2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      n[h][0] = it.w[h][0]; n[h][1] = it.w[h][1];
      if (!KBIT_MMA_PROBE_NOTR) delta_swap(n[h][0], n[h][1], 1, 0x55555555u);
    }
    // byte j of word r: the 2-bit indices of values 8j + r + {0, 2, 4, 6}, one 8-byte entry;
    // MMA s = 4r + j
    auto mma_j = [&](int r, int j, const uint32_t (&off)[2]) {
      uint32_t a[4];
#pragma unroll
      for (int h = 0; h < 2; h++) {
        uint32_t q0, q1;
        asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];" : "=r"(q0), "=r"(q1) : "r"(off[h]));
        a[h] = mul2<T>(q0, s2[h]);
        a[h + 2] = mul2<T>(q1, s2[h]);
      }
      run(4 * r + j, a);
    };
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const uint32_t o0[2] = {entry_addr<0>(n[0][r], lane_base), entry_addr<0>(n[1][r], lane_base)};
      mma_j(r, 0, o0);
      const uint32_t o1[2] = {entry_addr<1>(n[0][r], lane_base), entry_addr<1>(n[1][r], lane_base)};
      mma_j(r, 1, o1);
      const uint32_t o2[2] = {entry_addr<2>(n[0][r], lane_base), entry_addr<2>(n[1][r], lane_base)};
      mma_j(r, 2, o2);
      const uint32_t o3[2] = {entry_addr<3>(n[0][r], lane_base), entry_addr<3>(n[1][r], lane_base)};
      mma_j(r, 3, o3);
    }
  } else {
    uint32_t n[2][4];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      n[h][0] = it.w[h][0]; n[h][1] = it.w[h][1]; n[h][2] = it.w[h][2];
      n[h][3] = K_BITS == 4 ? it.w[h][3] : 0u;
      if (!KBIT_MMA_PROBE_NOTR) nibble_transpose(n[h][0], n[h][1], n[h][2], n[h][3]);
    }
    // byte i of word r: the indices of values 8i + r (low nibble) and 8i + 4 + r; MMA
    // s = 2r + i / 2 takes bytes i (even: slots 0-1) and i + 1 (slots 2-3)
#pragma unroll
    for (int r = 0; r < 4; r++) {
      uint32_t a[4];
#pragma unroll
      for (int h = 0; h < 2; h++) {
        a[h] = mul2<T>(lds32(entry_addr<0>(n[h][r], lane_base)), s2[h]);
        a[h + 2] = mul2<T>(lds32(entry_addr<1>(n[h][r], lane_base)), s2[h]);
      }
      run(2 * r, a);
#pragma unroll
      for (int h = 0; h < 2; h++) {
        a[h] = mul2<T>(lds32(entry_addr<2>(n[h][r], lane_base)), s2[h]);
        a[h + 2] = mul2<T>(lds32(entry_addr<3>(n[h][r], lane_base)), s2[h]);
      }
      run(2 * r + 1, a);
    }
  }
}

// Fragment order of staged x: slot u of MMA s of step t for lane c sits at
// ((t * 8 + s) * 4 + c) * 4 + u; a lane loads its two B registers with one 8-byte load. Rows
// are kXPad halves longer than the steps need (row stride = 32 bytes mod 128: the 4 rows of a
// half-warp hit distinct banks).
__host__ __device__ constexpr int frag_index(int t, int s, int c) { return ((t * 8 + s) * 4 + c) * 4; }
// NT = 1 (M <= 8) with KBIT_MMA_XPAIR: MMAs 2p and 2p + 1 of lane c side by side, so that one
// 16-byte load brings both B fragments (at M <= 2 one shared-memory wavefront for two MMAs
// instead of two); rows 64 bytes mod 128 apart (xpad_of), so that a quarter-warp's two rows
// (the unit of a 16-byte load) hit distinct banks. NOTES.md v56, next-session item (a).
template <int K_BITS, int NT>
__host__ __device__ constexpr int frag_at(int t, int s, int c) {
  return kXPair<K_BITS, NT> ? ((t * 4 + s / 2) * 4 + c) * 8 + (s & 1) * 4 : frag_index(t, s, c);
}
// halves of padding per staged x row for M tokens (NT = 1 iff M <= 8)
template <int K_BITS>
__host__ __device__ constexpr int xpad_of(int M) { return M <= 8 && kXPair<K_BITS, 1> ? 2 * kXPad : kXPad; }

constexpr int kZeroBytes = 256;  // a zero x "row" of one step, read by the lanes of tokens >= M

// The setup's divisions by runtime values, as multiplications: n / d == __umulhi(n, m) with
// m = 2^32 / d + 1 (d >= 2) whenever 0 <= n and n * d < 2^32 (n = qd + r: n m / 2^32 = q + r / d
// + n e / (d 2^32) with e = m d - 2^32 in [1, d], which stays below q + 1 when n d < 2^32);
// m = 0 stands for d = 1. The launcher computes them: as signed divisions they were ~60 of
// the ~185 instructions every warp ran before its first load (ncu source counters, NOTES.md
// v37).
inline uint32_t magic_for(int64_t d) { return d <= 1 ? 0u : uint32_t((int64_t(1) << 32) / d + 1); }
__device__ __forceinline__ int div_magic(int n, uint32_t m) { return m == 0u ? n : int(__umulhi(uint32_t(n), m)); }
struct Divs {
  uint32_t unit;   // 4 M: the units of staged x (a block of one token) per step
  uint32_t steps;  // `steps`: the steps of a slice (every slice but a split's last)
  uint32_t last;   // the steps of a split's last slice
  int ks_shift;    // log2 of the K slices (1, 2, 4 or 8)
  uint32_t ipw;    // items per warp (the slot flush's epilogue)
  int slots;       // 1: the flush stores into per-warp slots instead of adding atomically (mma_body)
};

// Shared memory (byte offsets from the start of dynamic shared memory, whose shared address is
// `base`): the table; "small" = [E4M4 scales][zero row][accumulator: `acc` tiles of M x
// kAccStride floats][2 S mbarriers]; the staged
// x rows; (bulk) S stages, 128-byte aligned, last. The wide k = 5 table (kWide5) starts at the
// window's kWideAt, everything else behind it. Any other table starts at the first 64 KB
// boundary of the shared window; small and as many x rows as fit go in front of it, the other
// x rows behind it. If small does not fit in front (the slot flush's 2 W tiles at M >= 25,
// NT = 4), as many x rows as fit go in front and small behind the table, then the other x
// rows: it used to put everything behind, leaving the 63 KB in front empty, so that the slots
// did not fit at M = 25..32 and those calls fell back to the flush's atomics (gateup, M = 24 ->
// 28, S = 2: 8.7 -> 10.3 us, H200; NOTES.md v44).
struct Layout {
  size_t table, small, x_front, x_back, stages, end;
  int rows_front;  // x rows in front of the table (rows >= this one live at x_back)
};
template <typename T, int K_BITS>
__host__ __device__ Layout layout_of(uint32_t base, int M, int steps, int acc, int n_stages, int stage_bytes,
                                     bool wide = false) {
  const size_t small = kScalePairBytes + kZeroBytes + size_t(acc) * M * kAccStride * sizeof(float) + 16 * size_t(n_stages);
  const size_t row = size_t(steps * kStepK + xpad_of<K_BITS>(M)) * sizeof(T);
  Layout l;
  // wide: at the window's kWideAt (dynamic shared memory starts there or before: `base` is
  // its offset in the window, <= kWideAt; plan_of checks), everything else behind it
  l.table = wide ? kWideAt - (base & 0xFFFFu) : ((base + kTableAlign - 1) & ~(kTableAlign - 1)) - base;
  const size_t table_end = l.table + (wide ? kWideBytes : table_bytes<K_BITS>());
  if (small <= l.table && !wide) {
    l.small = 0;
    l.x_front = small;
    l.rows_front = min(M, int(uint32_t(l.table - small) / uint32_t(row)));  // < 64 KB / row: 32 bits
    l.x_back = table_end;
  } else {
    l.small = table_end;
    l.x_front = 0;
    l.rows_front = wide ? 0 : min(M, int(uint32_t(l.table) / uint32_t(row)));
    l.x_back = table_end + small;
  }
  const size_t used = max(table_end, l.x_back + (M - l.rows_front) * row);
  l.stages = n_stages > 0 ? ((base + used + 127) & ~size_t(127)) - base : used;
  l.end = l.stages + size_t(n_stages) * stage_bytes;
  return l;
}
// Bytes to ask for, given that dynamic shared memory starts `reserved` bytes into the window
// (the kernel derives the layout from where it actually starts and checks it against this).
template <typename T, int K_BITS>
size_t smem_bytes(int M, int steps, int acc, int reserved, int n_stages, int stage_bytes, bool wide = false) {
  return layout_of<T, K_BITS>(uint32_t(reserved), M, steps, acc, n_stages, stage_bytes, wide).end;
}
// Bulk variant: bytes of one stage (2 k-tiles of the CTA's rg * 16 rows: words, then scales).
// The second k-tile's words start kWordsPad bytes after the first's end: a quarter-warp's
// word loads (lanes g = 2q, 2q + 1, c = 0..3: 2 x 32 bytes of each k-tile at k = 4; k = 2, 3,
// 5 alike) then hit distinct banks; without it, wchunk being a multiple of 128 bytes (rg = 14:
// 7168), every LDS.128 of the words took 8 wavefronts instead of 4 (ncu source counters, 8192
// x 28672 at M = 1, k = 4: 23% of the kernel's shared-memory wavefronts; NOTES.md v56).
#ifndef KBIT_MMA_WPAD
#define KBIT_MMA_WPAD 64
#endif
constexpr int kWordsPad = KBIT_MMA_WPAD;
template <int K_BITS>
__host__ __device__ constexpr int words_chunk(int rg) { return rg * kRows * kTileBlocks * K_BITS * 4; }
template <int K_BITS>
__host__ __device__ constexpr int words_stride(int rg) { return words_chunk<K_BITS>(rg) + kWordsPad; }
__host__ __device__ constexpr int scales_chunk(int rg, int scale_bytes) { return rg * kRows * kTileBlocks * scale_bytes; }
template <int K_BITS>
__host__ __device__ constexpr int stage_bytes_of(int rg, int scale_bytes) {
  return (2 * words_stride<K_BITS>(rg) + 2 * scales_chunk(rg, scale_bytes) + 127) / 128 * 128;
}
template <int FMT> constexpr int kScaleBytes = absmax_bytes(FMT);

// BULK = false: each warp loads its items' blocks into registers (a ring of kDepth items; the
// first kUpfront before the table build, the rest after it).
// BULK = true (RG >= KBIT_MMA_BULK_MIN_RG, N % 16 == 0, 16-byte aligned weights, RG < warps):
// the last warp streams the CTA's weights step by step into a ring of n_stages shared-memory
// stages with bulk asynchronous copies (4 per step: 2 k-tiles x words, scales; mbarrier
// "full" / "empty" per stage); consumer warp w works on row group w % rg_per_cta and every
// P-th step from w / rg_per_cta (P = consumers / rg_per_cta), so the warps of one step are its
// rg_per_cta row groups and the ring moves in step order. These loads never occupy the SM's
// load/store queue (where the register ring's loads hold up the table build) and a CTA keeps
// n_stages steps in flight; but each copy took ~50 ns of the SM's copy unit (measured), which
// only pays off for large chunks (many row groups per CTA).
// SPLIT: the split-K variant (kslices > 1 CTAs per row-group set, partial sums through the
// workspace `ws`). The plain variant has no division of blockIdx.x and no split epilogue
// (with them in one kernel, every M <= 8 call was 0.15-0.25 us slower: H100,
// scripts/mma_timeline.cu, A/B).
template <typename T, int K_BITS, int FMT, int NT, bool BULK, bool SPLIT, int W>
__device__ __forceinline__ void mma_body(
    const T* __restrict__ x, int64_t ldx, int M, const int32_t* __restrict__ packed,
    const void* __restrict__ absmax, const float* __restrict__ codebook, int N, int K, int KT,
    int steps, int kslices, int owners, int rg_per_cta, int items_per_warp, int n_stages, float shift_up,
    bool vec_x, const T* __restrict__ bias, T* __restrict__ out, int64_t ldo, int pdl, uint32_t* __restrict__ ws,
    Divs divs) {
  constexpr int kThreads = W * 32;
  constexpr int kWarps = W;
  KBIT_MMA_MARK(0, 0u);
  // Split-K (kslices > 1; the kslices CTAs of a row-group set are consecutive blocks): CTA
  // `slice` runs steps step0 .. step0 + lsteps - 1 (`steps` per slice; the last may have
  // fewer) and stages only that part of x; step 4 adds the partial results.
  const int slice = SPLIT ? int(blockIdx.x) & (kslices - 1) : 0;
  const int cta = SPLIT ? int(blockIdx.x) >> divs.ks_shift : int(blockIdx.x);
  const int step0 = slice * steps;
  const int lsteps = SPLIT ? max(0, min(steps, (KT + 1) / 2 - step0)) : steps;
  extern __shared__ __align__(16) char smem[];
  const uint32_t smem_sh = uint32_t(__cvta_generic_to_shared(smem));
  const uint32_t stage_bytes = stage_bytes_of<K_BITS>(rg_per_cta, kScaleBytes<FMT>);
  // the flush's per-warp slots (2 per warp) or the atomics' accumulator (1 per row group)
  const bool slot_mode = !BULK && divs.slots != 0;
  constexpr bool kW5 = kWide5<K_BITS, NT, BULK>;
  const Layout lay = layout_of<T, K_BITS>(smem_sh, M, steps, slot_mode ? 2 * kWarps : rg_per_cta, n_stages, stage_bytes, kW5);
  {
    uint32_t dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (lay.end > dyn || (kW5 && (smem_sh & 0xFFFFu) > kWideAt)) __trap();  // launcher bug
  }
  char* table = smem + lay.table;
  const uint32_t table_sh = smem_sh + uint32_t(lay.table);
  char* scales = smem + lay.small;
  const uint32_t* scale_pairs = reinterpret_cast<const uint32_t*>(scales);
  T* zero_row = reinterpret_cast<T*>(scales + kScalePairBytes);
  float* acc_s = reinterpret_cast<float*>(scales + kScalePairBytes + kZeroBytes);
  // bulk variant: mbarriers full[S], empty[S] after the accumulator (8-byte aligned)
  const uint32_t full_sh = uint32_t(__cvta_generic_to_shared(acc_s + size_t(rg_per_cta) * M * kAccStride));
  const uint32_t empty_sh = full_sh + 8 * n_stages;
  char* stages = smem + lay.stages;
  const uint32_t stages_sh = smem_sh + uint32_t(lay.stages);
  const int x_row = steps * kStepK + xpad_of<K_BITS>(M);  // halves
  // staged x row of token m: in front of the table or behind it
  auto x_at = [&](int m) {
    return m < lay.rows_front ? reinterpret_cast<T*>(smem + lay.x_front) + size_t(m) * x_row
                              : reinterpret_cast<T*>(smem + lay.x_back) + size_t(m - lay.rows_front) * x_row;
  };

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;

  // 0. The small loads first, so that they do not queue behind the weights: this lane's
  // codebook entry (the table is built from registers by shuffles) and this thread's first
  // unit of x (unit (m, t, c) = x[m][t * 128 + 32c + q], q = 0..31: one quantization block's
  // worth). Units are numbered (t * M + m) * 4 + c: a warp's 16 lanes of one fragment store
  // cover 4 rows x 4 c, 16 distinct 8-byte bank slots (rows are 32 bytes apart mod 128) for M
  // >= 4; numbered with t outside m (at M < 4 a warp's t share slots: 2- to 4-way store
  // conflicts on a few units).
  constexpr int cmask = (1 << K_BITS) - 1;
  // A thread's units are threadIdx.x + i * kThreads: (step t, rest = unit % (M * 4)) advanced
  // without a division per unit (XUnit, next_unit).
  struct XUnit {
    int t, rest;
  };
  const int unit_step = M * 4;
  const int dt = div_magic(kThreads, divs.unit), dr = kThreads - dt * unit_step;
  const int t0 = div_magic(int(threadIdx.x), divs.unit);
  const XUnit xu0{t0, int(threadIdx.x) - t0 * unit_step};
  auto next_unit = [&](XUnit& u) {
    u.t += dt;
    u.rest += dr;
    if (u.rest >= unit_step) {
      u.rest -= unit_step;
      u.t++;
    }
  };
  // a unit's 32 values as 16 pairs (pair j = values 2j, 2j + 1)
  auto fetch_x = [&](const XUnit& u, uint32_t (&v)[16]) {
    const int m = u.rest >> 2;
    const int k0 = (step0 + u.t) * kStepK + 32 * (u.rest & 3);
    const T* src = x + m * ldx + k0;
    if (vec_x && k0 + 32 <= K) {
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const uint4 a = __ldg(reinterpret_cast<const uint4*>(src) + i);
        v[4 * i] = a.x; v[4 * i + 1] = a.y; v[4 * i + 2] = a.z; v[4 * i + 3] = a.w;
      }
    } else {
      const unsigned short* src16 = reinterpret_cast<const unsigned short*>(src);  // 0 bits = +0
#pragma unroll
      for (int j = 0; j < 16; j++) {
        const uint32_t lo = k0 + 2 * j < K ? src16[2 * j] : 0u;
        const uint32_t hi = k0 + 2 * j + 1 < K ? src16[2 * j + 1] : 0u;
        v[j] = lo | hi << 16;
      }
    }
  };
  // the unit's values into the fragment order of step t: MMA s's 4 slots as one 8-byte store
  auto stage_x = [&](const XUnit& u, const uint32_t (&v)[16]) {
    const int m = u.rest >> 2, cc = u.rest & 3;
    T* dst = x_at(m);
    // PRMT selector nibbles that put value q's 2 bytes at result bytes 0, 1 (hi = 0) or 2, 3 (hi = 1)
    auto half_of = [&](int q, int hi) {
      return (q & 1) ? (hi == 0 ? 0x32 : 0x3200) : (hi == 0 ? 0x10 : 0x1000);
    };
    uint32_t pe[2] = {0u, 0u};  // XPAIR: the even MMA's pair, stored with the odd one's
#pragma unroll
    for (int s = 0; s < 8; s++) {
      // MMA s slot w reads block position slot_position(s, w)
      uint32_t pr[2];
#pragma unroll
      for (int w = 0; w < 2; w++) {
        const int qa = slot_position<K_BITS>(s, 2 * w), qb = slot_position<K_BITS>(s, 2 * w + 1);
        if ((qa >> 1) == (qb >> 1)) {  // both values in one pair (the order may swap)
          pr[w] = (qa & 1) ? __byte_perm(v[qa >> 1], 0u, 0x1032) : v[qa >> 1];
        } else {  // low half from value qa, high half from value qb
          pr[w] = __byte_perm(v[qa >> 1], v[qb >> 1], half_of(qa, 0) | (half_of(qb, 1) + 0x4400));
        }
      }
      if constexpr (kXPair<K_BITS, NT>) {
        if (s & 1)
          *reinterpret_cast<uint4*>(dst + frag_at<K_BITS, NT>(u.t, s - 1, cc)) = make_uint4(pe[0], pe[1], pr[0], pr[1]);
        pe[0] = pr[0];
        pe[1] = pr[1];
      } else {
        *reinterpret_cast<uint2*>(dst + frag_index(u.t, s, cc)) = make_uint2(pr[0], pr[1]);
      }
    }
  };
  const int group0 = cta * rg_per_cta;
  const int item0 = warp * items_per_warp;
  const int n_items = max(0, min(items_per_warp, rg_per_cta * lsteps - item0));

  // A cursor over this warp's items in (row group, step) order; one step advances the block
  // by 2 k-tiles (2 * N * 2 blocks), a new row group restarts from its first k-tile. Row
  // g + 8's block is 16 blocks after row g's.
  struct Cursor {
    int rg, step;
    uint32_t block;  // tiled64 block index of row g's block (the launcher checks < 2^31 words)
    bool row_lo, row_hi;
  };
  const uint32_t step_blocks = uint32_t(4 * N);
  auto at_group = [&](Cursor& cur) {
    const int n = (group0 + cur.rg) * kRows + g;
    cur.row_lo = n < N;
    cur.row_hi = n + 8 < N;
    cur.block = uint32_t(((2 * (step0 + cur.step) + (c >> 1)) * N + n) * kTileBlocks + (c & 1));
  };
  // (chosen by the slice index: a first version selected on `lsteps == steps`, and on the
  // device both slices then took the other slice's divisor; not understood, NOTES.md v37)
  const uint32_t steps_magic = SPLIT && slice == kslices - 1 ? divs.last : divs.steps;
  auto cursor_at = [&](int item) {
    Cursor cur;
    cur.rg = div_magic(item, steps_magic);
    cur.step = item - cur.rg * lsteps;
    at_group(cur);
    return cur;
  };
  auto advance = [&](Cursor& cur) {
    if (++cur.step == lsteps) {
      cur.step = 0;
      cur.rg++;
      at_group(cur);
    } else {
      cur.block += step_blocks;
    }
  };
  auto load = [&](Item<K_BITS>& it, const Cursor& cur, bool any) {
    const bool kt_ok = any && 2 * (step0 + cur.step) + (c >> 1) < KT;
    load_block<K_BITS, FMT>(it.w[0], it.scale_bits[0], packed, absmax, cur.block, kt_ok && cur.row_lo);
    load_block<K_BITS, FMT>(it.w[1], it.scale_bits[1], packed, absmax, cur.block + 16, kt_ok && cur.row_hi);
  };

  // 1. Put the first weights in flight before anything else: this warp's first kDepth items
  // (register ring), or (bulk) the first n_stages steps of the CTA.
  constexpr int D = BULK ? 1 : (W == kFewWarps && K_BITS == 2) ? kFewWarpsDepth2 : kDepth<K_BITS>;
  Item<K_BITS> ring[D];
  Cursor load_cur = cursor_at(item0);
  const int groups = (N + kRows - 1) / kRows;
  const int rg_valid = min(rg_per_cta, groups - group0);
  // bulk: step s -> stage s % n_stages; the copies of its (up to) 2 k-tiles of rows
  // group0 * 16 .. + rows (words, then scales) complete on full[stage]
  const int rows = rg_valid * kRows;
  // stage layout: words of k-tile j at j * wstride, scales of k-tile j at 2 * wstride + j * schunk
  const uint32_t wstride = words_stride<K_BITS>(rg_per_cta), schunk = scales_chunk(rg_per_cta, kScaleBytes<FMT>);
  const uint32_t wb = rows * kTileBlocks * K_BITS * 4, sb = rows * kTileBlocks * kScaleBytes<FMT>;
  // f(j, words, scales) for the (up to) 2 k-tiles j of `step`: their global addresses
  auto step_chunks = [&](int step, auto&& f) {
    const int kts = min(2, KT - 2 * (step0 + step));
    for (int j = 0; j < kts; j++) {
      const size_t blk = (size_t(2 * (step0 + step) + j) * N + size_t(group0) * kRows) * kTileBlocks;
      f(j, packed + blk * K_BITS, static_cast<const char*>(absmax) + blk * kScaleBytes<FMT>);
    }
    return kts;
  };
  auto issue = [&](int step, int stage) {
    const uint32_t bar = full_sh + 8 * stage, dst = stages_sh + stage * stage_bytes;
    mbar_expect_tx(bar, min(2, KT - 2 * (step0 + step)) * (wb + sb));
    step_chunks(step, [&](int j, const int32_t* words, const char* sc) {
      bulk_copy(dst + j * wstride, words, wb, bar);
      bulk_copy(dst + 2 * wstride + j * schunk, sc, sb, bar);
    });
  };

  // The codebook table from each lane's codebook entry cbv (lane i holds entry i % 2^k).
  auto build_table = [&](float cbv) {
    auto cb = [&](int i) { return __shfl_sync(0xffffffffu, cbv, i); };
    // every warp runs whole iterations (warp-uniform shuffles): trip counts rounded up to the
    // CTA size, the stores past the table's end skipped
    auto whole = [](int n) { return (n + kThreads - 1) / kThreads * kThreads; };
    if constexpr (kW5) {
      // entry e = hi1 << 9 | lo << 1 | hi0: 128 bytes (32 columns) at row (hi1 << 8 | lo) * 256 +
      // hi0 * 128; a thread takes whole entries (2 shuffles, 8 stores), the stores of a warp
      // rotated by the lane so that each 8-lane phase covers 8 distinct 16-byte chunks
      for (int e0 = 0; e0 < 1024; e0 += kThreads) {
        const int e = e0 + int(threadIdx.x);
        const int ec = e < 1024 ? e : 0;  // every lane shuffles
        const int lo = (ec >> 1) & 255, hb0 = ec & 1, hb1 = ec >> 9;
        const uint32_t v = Pair<T>::pack(cb((lo & 15) | hb0 << 4), cb((lo >> 4) | hb1 << 4));
        if (e < 1024) {
          uint4* const dst = reinterpret_cast<uint4*>(table + ((hb1 << 8 | lo) * 256 + hb0 * 128));
#pragma unroll
          for (int j = 0; j < 8; j++) dst[(j + e) & 7] = make_uint4(v, v, v, v);
        }
      }
    } else if constexpr (K_BITS == 5) {
      for (int i = threadIdx.x; i < whole(1024 * 4); i += kThreads) {  // 4 columns per 16-byte store
        const int e = i >> 2, lo = e >> 2, hb = e & 3;  // entry (lo, hi) at lo * 256 + hi * 64
        const uint32_t v = Pair<T>::pack(cb((lo & 15) | (hb & 1) << 4), cb((lo >> 4) | (hb >> 1) << 4));
        if (i < 1024 * 4) reinterpret_cast<uint4*>(table + e * 64)[i & 3] = make_uint4(v, v, v, v);
      }
    } else if constexpr (K_BITS == 2) {
      constexpr int kStores = KBIT_MMA_K2_COLS / 2;  // 16-byte stores per entry (2 columns each)
      for (int i = threadIdx.x; i < whole(256 * kStores); i += kThreads) {
        const int e = i / kStores;
        const uint32_t lo = Pair<T>::pack(cb(e & 3), cb((e >> 2) & 3));
        const uint32_t hi = Pair<T>::pack(cb((e >> 4) & 3), cb((e >> 6) & 3));
        if (i < 256 * kStores) reinterpret_cast<uint4*>(table + e * 256)[i % kStores] = make_uint4(lo, hi, lo, hi);
      }
    } else {
      constexpr int entries = table_bytes<K_BITS>() / 256;
      for (int i = threadIdx.x; i < whole(entries * 8); i += kThreads) {  // 4 lanes per 16-byte store
        const int e = i >> 3;
        const uint32_t v = Pair<T>::pack(cb(e & 15 & cmask), cb((e >> 4) & cmask));
        if (i < entries * 8) reinterpret_cast<uint4*>(table + e * 256)[i & 7] = make_uint4(v, v, v, v);
      }
    }
  };

  // PDL (launched with it when pdl > 0; common.cuh): let the next kernel of the stream start
  // (it takes an SM once this CTA leaves it: one CTA per SM), then wait for the previous
  // kernel before the first real load. Everything above only computed addresses. (L2
  // prefetches of the first weights before the wait, KBIT_PDL = 2, were no faster back-to-back
  // and 6-12% slower after a plain kernel: removed, NOTES.md v47.) KBIT_MMA_SPEC_TABLE
  // also reads the codebook and builds the table before the wait; the barrier after the
  // prologue checks it against the codebook read after the wait.
  constexpr bool kSpec = KBIT_MMA_SPEC_TABLE == 2 || (KBIT_MMA_SPEC_TABLE == 1 && K_BITS == 5 && NT == 1);
  const bool spec = kSpec && pdl > 0;
  float cb_spec = 0.f;
  // pdl >= 2 (the caller's KBIT_MMA_WEIGHTS_STABLE, kbit.h: no kernel that may still be running
  // or flushing wrote the weights): the first kUpfront ring items are requested before the
  // wait, so that they stream while the previous kernel finishes (H100 A/B, NOTES.md v52: M = 1
  // k = 4 dense TOTAL -1.3..-1.8 us back-to-back). griddepcontrol.wait is what makes the
  // previous grid's writes visible: without the caller's promise the weights wait like
  // everything else. One token tile only: compiled into the NT = 2 kernels, the switch made M
  // = 16 k = 4 0.8-1.3 us (TOTAL) slower with it off and 0.2-0.6 with it on (v52).
  constexpr bool kEarlyW = !BULK && NT == 1;
  const bool early_w = kEarlyW && pdl > 1;
  // the same promise covers the codebook (KBIT_MMA_EARLY_CB): no re-read after the wait
  constexpr bool kEarlyCb = kEarlyW || (!BULK && NT > 1 && ((KBIT_MMA_EARLY_NT2_KMASK >> K_BITS) & 1));
  const bool early_cb = kEarlyCb && pdl > 2 && !spec;
  const bool early_tb = early_cb && pdl > 3;
  float cb_early = 0.f;
  if (pdl > 0) {
    pdl_trigger();
    if constexpr (kEarlyCb) {
      if (early_cb) cb_early = codebook[lane & cmask];  // first: the table build waits on it
      if (kEarlyW && early_w) {
#pragma unroll
        for (int d = 0; d < kUpfront<D, NT, K_BITS>; d++) {
          load(ring[d], load_cur, d < n_items);
          advance(load_cur);
        }
      }
      if (early_tb) build_table(cb_early);
    }
    if (spec) {
      cb_spec = __ldcg(codebook + (lane & cmask));
      build_table(cb_spec);
    }
    pdl_wait();
  }
  // The stable-weights promise with KBIT_MMA_EARLY_CB = 2 (pdl 4) covers the speculative
  // table's codebook too: no re-read through L2 and no compare after the wait (mode 1 keeps
  // both, for A/Bs; NOTES.md v61).
  const bool spec_trusted = spec && pdl > 3;
  const float cb_lane = spec_trusted ? cb_spec
                        : spec       ? __ldcg(codebook + (lane & cmask))
                        : early_cb   ? cb_early
                                     : codebook[lane & cmask];
  // A thread's second unit of x is also asked for here, and every later one before the
  // previous is staged, so that no unit's L2 round trip waits for another's staging (M = 16: 2-3
  // units per thread, M = 8 with K >= 4096: 2-3; NOTES.md v35: asking for each unit after
  // the previous one was staged made M = 8 calls 0.5-1 us slower in total).
  uint32_t x0[16], x1[16];
  XUnit xu1 = xu0;
  next_unit(xu1);
  if (xu0.t < lsteps) fetch_x(xu0, x0);
  if (xu1.t < lsteps) fetch_x(xu1, x1);
  KBIT_MMA_MARK(6, 0u);
  KBIT_MMA_MARK(7, 0u);
  if constexpr (BULK) {
    if (warp == kWarps - 1) {
      if (lane == 0) {
        for (int i = 0; i < n_stages; i++) {
          mbar_init(full_sh + 8 * i, 1);
          mbar_init(empty_sh + 8 * i, rg_valid);
        }
        mbar_fence_init();
      }
      __syncwarp();
      // the first fill from all lanes of the producer warp (one lane's copies took ~0.1 us
      // each to issue)
      for (int step = lane; step < min(n_stages, lsteps); step += 32) issue(step, step);
    }
  } else if (!early_w) {
#pragma unroll
    for (int d = 0; d < kUpfront<D, NT, K_BITS>; d++) {
      load(ring[d], load_cur, d < n_items);
      advance(load_cur);
    }
  }
  KBIT_MMA_MARK(1, 0u);

  // 2. Staged x, tables, zeroed accumulator. x first: its units were asked for before the
  // codebook's entry returns, so the table build (which waits on that entry) comes after the
  // staging instead of delaying it (H100 A/B, NOTES.md v38: dense TOTAL -0.3..-0.9 us at M =
  // 1..16, k = 2..4; k = 5 at NT = 1 builds its table before the PDL wait).
  if (FMT == KBIT_ABSMAX_E4M4) fill_scale_pairs<T>(reinterpret_cast<uint32_t*>(scales), threadIdx.x, kThreads);
  {
    // two buffers in turn: stage unit a (x0), ask for the unit after b into x0, stage b (x1), ...
    XUnit xa = xu0, xb = xu1;
    while (xa.t < lsteps) {
      stage_x(xa, x0);
      xa = xb;
      next_unit(xa);
      if (xa.t < lsteps) fetch_x(xa, x0);
      if (xb.t >= lsteps) break;
      stage_x(xb, x1);
      xb = xa;
      next_unit(xb);
      if (xb.t < lsteps) fetch_x(xb, x1);
    }
  }
  if (!spec && !early_tb) build_table(cb_lane);
  if (threadIdx.x < kZeroBytes / 4) reinterpret_cast<uint32_t*>(zero_row)[threadIdx.x] = 0u;
  if (!slot_mode)
    for (int i = threadIdx.x; i < rg_per_cta * M * kAccStride; i += kThreads) acc_s[i] = 0.f;
  if (!spec || spec_trusted) {
    __syncthreads();
  } else if (__syncthreads_or(__float_as_uint(cb_lane) != __float_as_uint(cb_spec))) {
    build_table(cb_lane);  // the codebook changed under the speculative table: rebuild it
    __syncthreads();
  }
  if constexpr (!BULK) {
#pragma unroll
    for (int d = kUpfront<D, NT, K_BITS>; d < D; d++) {
      load(ring[d], load_cur, d < n_items);
      advance(load_cur);
    }
  }
  KBIT_MMA_MARK(2, 0u);
  KBIT_MMA_MARK(3, BULK ? 0u : ring[0].w[0][0] ^ ring[0].w[1][0]);

  // 3. Main loop over this warp's items. Item i's slot is refilled with item i + D right
  // after i is decoded. kAccSets accumulators per token tile (2 at NT = 1: half the MMA chain).
  const uint32_t lane_base = kW5 ? (smem_sh & 0xFFFF0000u) | uint32_t(lane) * 4u  // + kWideAt in the LDS
                            : table_sh | (K_BITS == 5   ? uint32_t(lane & 15) * 4u
                                          : K_BITS == 2 ? uint32_t(lane & (KBIT_MMA_K2_COLS - 1)) * 8u
                                                        : uint32_t(lane) * 4u);
  float acc[NT][kAccSets<NT>][4] = {};
  // this lane's staged x (token tt * 8 + g) at step 0; for a token >= M: at NT = 1 token 0's
  // (item_mma skips those lanes' loads: at M <= 4 a warp's x load then takes one shared-memory
  // wavefront instead of two, NOTES.md v56), else the zero row (at NT >= 2 the predicated loads
  // made the register-ring kernels spill: 8192 x 28672 at M = 16 twice as slow)
  const T* xb0[NT];
  bool tok_ok[NT];
#pragma unroll
  for (int tt = 0; tt < NT; tt++) {
    tok_ok[tt] = tt * 8 + g < M;
    xb0[tt] = (tok_ok[tt] ? x_at(tt * 8 + g) : NT == 1 ? x_at(0) : zero_row) + frag_at<K_BITS, NT>(0, 0, c);
  }
  // A warp's sums of a row group leave its registers when it moves on to the next row group
  // or runs out of items (flush). Two ways:
  // - atomics: added into the CTA's accumulator (a tile per row group, zeroed in the prologue)
  //   with shared-memory atomicAdd, which sm_90 runs as a compare-and-swap loop (LDS, FADD,
  //   ATOMS.CAST.SPIN, branch): the warp waits for it mid-loop and before the barrier (a
  //   probe with plain stores instead: up to 1.4-3 us of dense TOTAL at M = 1..16, NOTES.md
  //   v37);
  // - slots (slot_mode: register ring, at most 2 row groups per warp, the tiles fit): plain stores
  //   into the warp's own tile (warp, 0) for its first row group, (warp, 1) for its second;
  //   the epilogue adds the tiles of the warps that cover a row group, in warp order (so the
  //   sums are deterministic). No zeroing, no read-modify-write, nothing to wait for.
  const int rg_first = div_magic(item0, steps_magic);
  auto flush = [&](int rg) {
    float* const dst = slot_mode ? acc_s + size_t(2 * warp + (rg - rg_first)) * M * kAccStride
                                 : acc_s + size_t(rg) * M * kAccStride;
#pragma unroll
    for (int tt = 0; tt < NT; tt++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int token = tt * 8 + 2 * c + (i & 1), row = g + 8 * (i >> 1);
        float v = 0.f;
#pragma unroll
        for (int j = 0; j < kAccSets<NT>; j++) {
          v += acc[tt][j][i];
          acc[tt][j][i] = 0.f;
        }
        if (token < M) {
          if (slot_mode)
            dst[token * kAccStride + row] = v;
          else
            atomicAdd(dst + token * kAccStride + row, v);
        }
      }
  };
  if constexpr (BULK) {
    if (warp == kWarps - 1) {  // the producer refills each stage once its row groups read it
      if (lane == 0)
        for (int step = n_stages; step < lsteps; step++) {
          const int stage = step % n_stages;
          mbar_wait(empty_sh + 8 * stage, ((step / n_stages) - 1) & 1);
          issue(step, stage);
        }
    } else {
      const int P = (kWarps - 1) / rg_per_cta, rgw = warp % rg_per_cta, p = warp / rg_per_cta;
      if (p < P && rgw < rg_valid) {
        int stage = p % n_stages;
        uint32_t phase = (p / n_stages) & 1;
        const int row = rgw * kRows + g;  // row g + 8's block is 16 blocks later
        const uint32_t woff = (c >> 1) * wstride + (row * kTileBlocks + (c & 1)) * K_BITS * 4;
        const uint32_t soff = 2 * wstride + (c >> 1) * schunk + (row * kTileBlocks + (c & 1)) * kScaleBytes<FMT>;
        for (int step = p; step < lsteps; step += P) {
          mbar_wait(full_sh + 8 * stage, phase);
          const char* sp = stages + size_t(stage) * stage_bytes;
          Item<K_BITS> it;
          read_block<K_BITS, FMT>(it.w[0], it.scale_bits[0], sp + woff, sp + soff);
          read_block<K_BITS, FMT>(it.w[1], it.scale_bits[1], sp + woff + 8 * kTileBlocks * K_BITS * 4,
                                  sp + soff + 8 * kTileBlocks * kScaleBytes<FMT>);
          __syncwarp();
          if (lane == 0) mbar_arrive(empty_sh + 8 * stage);
          if (2 * (step0 + step) + (c >> 1) >= KT) it.scale_bits[0] = it.scale_bits[1] = 0u;  // no such k-tile
          const uint32_t s2[2] = {scale_pair<T>(it.scale_bits[0], FMT, scale_pairs),
                                  scale_pair<T>(it.scale_bits[1], FMT, scale_pairs)};
          const T* xb[NT];
#pragma unroll
          for (int tt = 0; tt < NT; tt++) xb[tt] = xb0[tt] + (NT == 1 || tok_ok[tt] ? frag_index(step, 0, 0) : 0);
          item_mma<T, K_BITS, NT>(it, s2, lane_base, xb, tok_ok, acc);
          stage += P;
          while (stage >= n_stages) {
            stage -= n_stages;
            phase ^= 1u;
          }
        }
        flush(rgw);
      }
    }
  }
  Cursor cur = cursor_at(item0);
  // One round of the ring: items base .. base + D - 1
  auto ring_round = [&](int base) {
#pragma unroll
    for (int d = 0; d < D; d++) {
      if (base + d < n_items) {
        const uint32_t s2[2] = {scale_pair<T>(ring[d].scale_bits[0], FMT, scale_pairs),
                                scale_pair<T>(ring[d].scale_bits[1], FMT, scale_pairs)};
        const Item<K_BITS> it = ring[d];
        if (base + d + D < n_items) {
          load(ring[d], load_cur, true);
          advance(load_cur);
        }
        const T* xb[NT];
#pragma unroll
        for (int tt = 0; tt < NT; tt++) xb[tt] = xb0[tt] + (NT == 1 || tok_ok[tt] ? frag_index(cur.step, 0, 0) : 0);
        item_mma<T, K_BITS, NT, kW5>(it, s2, lane_base, xb, tok_ok, acc);
        const int rg = cur.rg;
        advance(cur);
        if (cur.rg != rg || base + d + 1 == n_items) flush(rg);
      }
    }
  };
  if constexpr (!BULK) {
    int base = 0;
    if (KBIT_MMA_PEEL && NT == 1 && n_items > 0) {
      ring_round(0);
      base = D;
    }
    for (; base < n_items; base += D) ring_round(base);
  }
  KBIT_MMA_MARK(4, 0u);
  __syncthreads();
  // The CTA's sums of row group rg, token m, rows row .. row + 3: the accumulator's, or (slot
  // mode) the sum of the slots of warps w_lo .. w_hi, whose items cover the row group's
  // (w_lo's may start in the row group before: then its tile is (w_lo, 1); every later warp
  // starts inside this row group: tile (w, 0)).
  auto partial = [&](int rg, int m, int row) {
    if (!slot_mode) return *reinterpret_cast<const float4*>(acc_s + (rg * M + m) * kAccStride + row);
    const int i0 = rg * lsteps;
    const int w_lo = div_magic(i0, divs.ipw), w_hi = div_magic(i0 + lsteps - 1, divs.ipw);
    const float* p = acc_s + (m * kAccStride + row);
    float4 v = *reinterpret_cast<const float4*>(p + (2 * w_lo + (w_lo * items_per_warp < i0)) * M * kAccStride);
#pragma unroll 4
    for (int w = w_lo + 1; w <= w_hi; w++) {
      const float4 a = *reinterpret_cast<const float4*>(p + 2 * w * M * kAccStride);
      v.x += a.x;
      v.y += a.y;
      v.z += a.z;
      v.w += a.w;
    }
    return v;
  };

  // 4. Write C, in quads of 4 rows (16-byte shared loads). Split-K: the workspace holds
  // kslices partial tiles per row-group set (rg_per_cta * M * 16 floats each; slice r's in
  // tile r), every word 0 between calls. owners = kslices: slice r owns the r-th 1 / kslices
  // of the quads; owners = 1: the last slice owns them all (the others store and leave, so
  // that the next kernel's CTAs can take their SMs sooner). A slice stores the quads other
  // slices own into its tile, then adds the others' partials of its own quads to its own as
  // they arrive, in slice order (deterministic), writes C and zeroes the words it read. No
  // fence and no counter: each 32-bit word is its own flag, stored bit-inverted (and a float
  // of all-ones bits, a NaN no arithmetic makes, as the canonical NaN) so that it is never 0.
  // A slice waits for the other slices of its set (consecutive blocks): all of them run at
  // once on one wave, or once the sets before them leave their SMs; the next kernel's CTAs
  // (PDL) cannot take those SMs first, as they start only when every CTA of this grid has.
  const int quads = rg_per_cta * M * (kRows / 4);
  uint4* const wtile = SPLIT ? reinterpret_cast<uint4*>(ws) + size_t(cta) * kslices * quads : nullptr;
  int first = 0, last = quads;
  if (SPLIT) {
    if (owners == 1) {
      first = slice == kslices - 1 ? 0 : quads;
    } else {
      const int share = (quads + kslices - 1) / kslices;
      first = min(quads, slice * share);
      last = min(quads, first + share);
    }
    auto word = [](float f) {
      const uint32_t b = __float_as_uint(f);
      return ~(b == 0xffffffffu ? 0x7fffffffu : b);
    };
    for (int j = int(threadIdx.x); j < quads - (last - first); j += kThreads) {
      const int i = j < first ? j : j + (last - first);  // a quad another slice owns
      const int rg = i / (M * 4), rest = i - rg * M * 4, m = rest >> 2, row = (rest & 3) * 4;
      if ((group0 + rg) * kRows + row >= N) continue;  // its owner skips it too
      const float4 v = partial(rg, m, row);
      __stcg(wtile + size_t(slice) * quads + i, make_uint4(word(v.x), word(v.y), word(v.z), word(v.w)));
    }
    KBIT_MMA_MARK(8, 0u);
  }
  for (int i = first + int(threadIdx.x); i < last; i += kThreads) {
    const int rg = i / (M * 4), rest = i - rg * M * 4, m = rest >> 2, row = (rest & 3) * 4;
    const int n = (group0 + rg) * kRows + row;
    if (n < N) {
      // split: the first look at the other slices' partials goes out before this slice's own
      // sum (shared loads), so that the sum overlaps its L2 round trip
      uint4 part[kMaxKSlices];
      if (SPLIT) {
#pragma unroll
        for (int r = 0; r < kMaxKSlices; r++)
          if (r < kslices && r != slice) part[r] = ld_relaxed_u32x4(wtile + size_t(r) * quads + i);
      }
      float4 v = partial(rg, m, row);
      if (SPLIT) {
        const float4 own = v;
        v = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int r = 0; r < kMaxKSlices; r++) {
          if (r >= kslices) continue;
          float4 add = own;
          if (r != slice) {
            uint4& p = part[r];
            while (p.x == 0u || p.y == 0u || p.z == 0u || p.w == 0u) p = ld_relaxed_u32x4(wtile + size_t(r) * quads + i);
            __stcg(wtile + size_t(r) * quads + i, make_uint4(0u, 0u, 0u, 0u));
            add = make_float4(__uint_as_float(~p.x), __uint_as_float(~p.y), __uint_as_float(~p.z), __uint_as_float(~p.w));
          }
          v.x += add.x; v.y += add.y; v.z += add.z; v.w += add.w;
        }
      }
      const float f[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < 4; j++)
        if (n + j < N) out[m * ldo + n + j] = from_float<T>(f[j] * shift_up + (bias != nullptr ? to_float(bias[n + j]) : 0.f));
    }
  }
  KBIT_MMA_MARK(5, 0u);
}

template <typename T, int K_BITS, int FMT, int NT, bool BULK, bool SPLIT, int W = kWarpsPerCta<NT>>
__global__ void __launch_bounds__(W * 32, 1) mma_kernel(
    const T* __restrict__ x, int64_t ldx, int M, const int32_t* __restrict__ packed,
    const void* __restrict__ absmax, const float* __restrict__ codebook, int N, int K, int KT,
    int steps, int kslices, int owners, int rg_per_cta, int items_per_warp, int n_stages, float shift_up,
    bool vec_x, const T* __restrict__ bias, T* __restrict__ out, int64_t ldo, int pdl, uint32_t* __restrict__ ws,
    Divs divs) {
  mma_body<T, K_BITS, FMT, NT, BULK, SPLIT, W>(x, ldx, M, packed, absmax, codebook, N, K, KT, steps, kslices,
                                               owners, rg_per_cta, items_per_warp, n_stages, shift_up, vec_x, bias, out, ldo,
                                               pdl, ws, divs);
}

#ifndef KBIT_MMA_MAX_STAGES
#define KBIT_MMA_MAX_STAGES 32  // overridable for experiments; 0 disables the bulk variant
#endif

constexpr int kMaxM = 64;  // token tiles of 8: NT = 1, 2, 4, 8

// Forced K-slice count (tests, experiments): 0 = automatic. Set by kbit_mma_force_ksplit;
// starts from the environment variable KBIT_MMA_KSPLIT.
inline int& forced_ksplit() {
  static int v = env_int("KBIT_MMA_KSPLIT", 0);
  return v;
}

// Forced CTA width of the unsplit register-ring calls at M <= 8 (experiments): 0 = the rule in
// launch, 1 = kFewWarps always, 2 = never. From the environment variable KBIT_MMA_FEW_WARPS.
inline int forced_few_warps() {
  static const int v = env_int("KBIT_MMA_FEW_WARPS", 0);
  return v;
}

// How a call runs: S K-slices (1 = no split), `sps` steps per slice, rg row groups per CTA,
// `ctas` CTAs per slice, and its shared memory (0: the call is not handled: M out of range,
// or x / the accumulator do not fit). rg is the fewest row groups that cover the rows in one
// wave of CTAs (one per SM); where the accumulator does not fit then, the fewest that need the
// waves the largest fitting rg needs (the row groups spread evenly over them). Which S:
// - M <= 16: the smallest S whose CTA stages <= kSplitXBytes of x, or whose weights are >= 3x
//   its x. Staging x is bound by L2 -> SM bandwidth (every CTA reads its slice of x whole) and
//   each split costs the wait for the partial sums. Measured (H200, NOTES.md
//   v36, M = 1..16, k = 2..5, S = 1, 2, 4 forced on the model shapes): halving 64-160 KB of x
//   per CTA gained 0.2-1.3 us per call, below 40 KB a split lost 0.1-0.7; the 8192 x 28672
//   weight (458-1146 KB of weights per CTA) gained nothing from a split at M = 8, and at M =
//   16, k = 2 (3.6x) S = 2 was 8 us faster than S = 4.
//   At M = 9..16 (two token tiles) the unsplit plan also takes up to kSplitXBytesNT2 of x where
//   each CTA has >= 2 row groups, and never runs with 1 row group per CTA (forced-S sweeps of
//   session 34, H100 and H200, NOTES.md v43: Q at M = 12..16 was 0.1-0.5 us faster unsplit,
//   with 48-64 KB of x per CTA; KV, 32 one-row-group CTAs unsplit, was 0.1-0.4 us faster with
//   S = 2 at M = 9..16, also below 40 KB (down to 36 KB at M = 9; at <= kSplitXBytesOneRg,
//   not measured, the 40 KB rule stands); gateup, 3 row groups, within 0.1-0.3 either way).
// - M > 16: the S with the fewest bytes of staged x + accumulator + 4 x the partial sums a
//   slice reads, per CTA, times waves (a model: the cluster-split sweep of NOTES.md v8 tuned it
//   without the last term). The partial sums weigh 4x: they go out and come back through L2
//   after the main loop, behind a flag (x staging overlaps the weights' stream). Forced-S
//   sweeps at M = 24..64 (session 34, H100, 5 shapes x k = 2, 4, 5; NOTES.md v44): with
//   weight 1 the model split twice as far as the fastest S at M = 24 (gateup k = 4 S = 4 9.70
//   us vs S = 2 8.87; O S = 8 9.22 vs S = 4 7.79) and lost 26 us over the 60 cases against
//   the best forced S; with weight 4 it loses none where mma is faster than wgmma.
// The partial sums are added by the last slice alone (owners = 1) where S = 2 and M <= 16,
// else by all S slices, each for 1 / S of the outputs (H200, v36: the last slice alone was
// 0.1-0.5 us faster per call at S = 2, M <= 16, and up to 10 us slower at S = 8, M = 64).
struct Plan {
  int S = 0, sps = 0, rg = 0, ctas = 0;
  int owners = 1;  // slices of a set that add up partial sums (mma_body, step 4): 1 or S
  size_t smem = 0, ws_bytes = 0;  // ws_bytes: the workspace the split needs
};
constexpr size_t kSplitXBytes = 40 * 1024;
constexpr size_t kSplitXBytesNT2 = 64 * 1024;
constexpr size_t kSplitXBytesOneRg = 32 * 1024;  // (measured down to 36 KB: KV at M = 9)
constexpr size_t kPartialsWeight = 4;  // M > 16: a byte of partial sums against one of staged x
template <typename T, int K_BITS>
Plan plan_of(int M, int64_t N, int64_t K, const DeviceInfo& dev, bool can_split) {
  Plan best;
  if (M < 1 || M > kMaxM || N < 1 || K < 1) return best;
  // the wide table sits at the window's kWideAt, which must not precede dynamic shared memory
  if (wide5_at<K_BITS>(M) && dev.smem_reserved > int(kWideAt)) return best;
  const int64_t KT = ceil_div(ceil_div(K, kBlock), kTileBlocks);
  const int64_t total = ceil_div(KT, 2), groups = ceil_div(N, kRows);
  if (total >= (int64_t(1) << 24) || groups >= (int64_t(1) << 26)) return best;
  const int forced = forced_ksplit();
  size_t best_cost = 0;
  for (int S = 1; S <= kMaxKSlices; S *= 2) {
    if ((forced > 0 && S != forced) || S > total || S > dev.sms || (S > 1 && !can_split)) continue;
    const int sps = int(ceil_div(total, S));
    if (int64_t(S - 1) * sps >= total) continue;  // an empty slice: a smaller S does the same
    const size_t x_bytes = size_t(M) * sps * kStepK * sizeof(T);
    if (size_t(M) * (sps * kStepK + xpad_of<K_BITS>(M)) * sizeof(T) > size_t(kMaxXSmem)) continue;
    const int per_wave = dev.sms / S;  // CTAs of one slice per wave
    int rg = int(ceil_div(groups, per_wave));
    // (the register ring's layout; the bulk variant, chosen later, has its own)
    const bool wide = wide5_at<K_BITS>(M);
    size_t smem = smem_bytes<T, K_BITS>(M, sps, rg, dev.smem_reserved, 0, 0, wide);
    while (smem > size_t(dev.smem_optin) && rg > 1) smem = smem_bytes<T, K_BITS>(M, sps, --rg, dev.smem_reserved, 0, 0, wide);
    if (smem > size_t(dev.smem_optin)) continue;
    // More than one wave: the fewest row groups per CTA that still need that many waves, so
    // that the last wave is not a few CTAs doing a whole CTA's work while the others idle
    // (8192 x 28672 at M = 16, S = 2, k = 4: rg 28 -> 23 for the accumulator gave 156 CTAs on
    // 132 SMs, 99.8 us, against k = 3's 128 CTAs in one wave, 63.1 us; NOTES.md v42).
    const int64_t rg_waves = ceil_div(ceil_div(groups, int64_t(rg)), int64_t(per_wave));
    if (rg_waves > 1) {
      rg = int(ceil_div(groups, rg_waves * per_wave));
      smem = smem_bytes<T, K_BITS>(M, sps, rg, dev.smem_reserved, 0, 0, wide);
    }
    Plan p;
    p.S = S;
    p.sps = sps;
    p.rg = rg;
    p.ctas = int(ceil_div(groups, rg));
    p.smem = smem;
    p.ws_bytes = S > 1 ? size_t(S) * p.ctas * rg * M * kRows * sizeof(float) : 0;  // (1 of S tiles idle)
    p.owners = S == 2 && M <= 16 ? 1 : S;
    if (forced > 0) return p;
    if (M <= 16) {
      const size_t w_bytes = size_t(rg) * kRows * sps * kStepK * K_BITS / 8;
      if (w_bytes >= 3 * x_bytes) return p;
      if (S == 1 && M > 8) {
        if (rg >= 2 && x_bytes <= kSplitXBytesNT2) return p;
        if (rg < 2 && x_bytes > kSplitXBytesOneRg) {  // one row group per CTA: split (below, or the largest S that fits)
          best = p;
          continue;
        }
      }
      if (x_bytes <= kSplitXBytes) return p;
      best = p;  // none qualifies: the largest S that fits
      continue;
    }
    const size_t waves = size_t(ceil_div(p.ctas, per_wave));
    const size_t partials = size_t(S - 1) * rg * M * kRows * sizeof(float) / S;  // a slice reads
    const size_t cost = waves * (x_bytes + size_t(rg) * M * kAccStride * sizeof(float) + kPartialsWeight * partials);
    if (best.smem == 0 || cost < best_cost) {
      best = p;
      best_cost = cost;
    }
  }
  return best;
}

// KBIT_MMA_EARLY_CB's mode (0..2) for a kernel with NT token tiles: the macro, or the
// environment variable (read once); 0 for NT >= 2 where the environment's KBIT_MMA_EARLY_NT2 is
// 0 (kernels without the early path compiled in ignore the mode)
inline int early_cb_mode(int nt) {
  static const int mode = [] {
    const int v = env_int("KBIT_MMA_EARLY_CB", KBIT_MMA_EARLY_CB);
    return v < 0 ? 0 : v > 2 ? 2 : v;
  }();
  static const bool nt2 = env_int("KBIT_MMA_EARLY_NT2", 1) != 0;
  return nt == 1 || nt2 ? mode : 0;
}

template <typename T, int K_BITS, int FMT, int NT>
cudaError_t launch(cudaStream_t s, const void* x, int64_t ldx, int M, const int32_t* packed,
                   const void* absmax, const float* cb, int64_t N, int64_t K, int exponent,
                   const void* bias, void* out, int64_t ldo, const Workspace& ws) {
  const int64_t KT = ceil_div(ceil_div(K, kBlock), kTileBlocks);
  // 32-bit block indices and sizes inside the kernel
  if (KT * kTileBlocks * N * K_BITS >= (int64_t(1) << 31) || N >= (int64_t(1) << 30)) return cudaErrorInvalidValue;
  int device = 0;
  cudaGetDevice(&device);
  const DeviceInfo& dev = device_info(device);
  // without a workspace, no split (kbit_mma_workspace_bytes: plan_for, the same plan with one)
  const Plan plan = plan_of<T, K_BITS>(M, N, K, dev, ws.ptr != nullptr);
  if (plan.smem == 0 || plan.smem > size_t(dev.smem_optin)) return cudaErrorInvalidValue;
  if (plan.S > 1 && (int64_t(plan.ws_bytes) > ws.bytes || reinterpret_cast<uintptr_t>(ws.ptr) % 16 != 0))
    return cudaErrorInvalidValue;
  const int rg = plan.rg, steps = plan.sps;
  // The bulk variant when its copies are legal (16-byte aligned chunks: whole row groups,
  // aligned tensors), its warp split exists and at least 2 stages (or all steps) fit.
  int n_stages = 0;
  size_t bulk_bytes = 0;
  // Each bulk copy costs the producer ~0.1 us to issue (measured: 4 copies per step), so
  // small chunks (few row groups per CTA) stream slower than the register ring.
  if (rg >= KBIT_MMA_BULK_MIN_RG && has_sm90_code<mma_kernel<T, K_BITS, FMT, NT, true, false>>(device) &&
      N % kRows == 0 && reinterpret_cast<uintptr_t>(packed) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(absmax) % 16 == 0 && rg <= kWarpsPerCta<NT> - 1) {
    const int sb = stage_bytes_of<K_BITS>(rg, kScaleBytes<FMT>);
    // P consumer warps per row group take every P-th step; when the ring wraps (fewer stages
    // than steps), the stage count must be a multiple of P so that a stage's next use is read
    // by the warps that read its previous one (else a warp could wait on a stage's next
    // "full" phase before its previous phase completed, and pass the parity test at once).
    const int P = (kWarpsPerCta<NT> - 1) / rg;
    for (int st = min(steps, KBIT_MMA_MAX_STAGES); st >= min(steps, 2) && st > 0; st--) {
      if (st < steps && st % P != 0) continue;
      bulk_bytes = smem_bytes<T, K_BITS>(M, steps, rg, dev.smem_reserved, st, sb);
      if (bulk_bytes <= size_t(dev.smem_optin)) {
        n_stages = st;
        break;
      }
    }
  }
  const bool vec_x = ldx % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  uint32_t* const wsp = plan.S > 1 ? static_cast<uint32_t*>(ws.ptr) : nullptr;
  // the kernel's divisions by 4 M, by a slice's steps and (slot flush) by the items per warp
  // (div_magic: exact for n * d < 2^32; n is a thread index or an item index below rg * steps
  // + 32, d at most `steps`: the slot flush needs items per warp <= the last slice's steps)
  const int last_steps = int(ceil_div(KT, 2)) - (plan.S - 1) * steps;
  if ((int64_t(rg) * steps + 32) * steps >= (int64_t(1) << 32) || last_steps < 1) return cudaErrorInvalidValue;
  const Divs divs0{magic_for(4 * M), magic_for(steps), magic_for(last_steps), __builtin_ctz(unsigned(plan.S)), 0u, 0};
  auto run = [&](auto kernel, cudaError_t attr_err, size_t smem, int warps, int items_per_warp, int pdl, const Divs& divs) {
    if (attr_err != cudaSuccess) return attr_err;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(unsigned(plan.ctas * plan.S));
    cfg.blockDim = dim3(unsigned(warps * 32));
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    return launch_kernel(cfg, 1, 0, pdl, kernel, static_cast<const T*>(x), ldx, M, packed, absmax, cb, int(N),
                         int(K), int(KT), steps, plan.S, plan.owners, rg, items_per_warp, n_stages, ldexpf(1.f, exponent), vec_x,
                         static_cast<const T*>(bias), static_cast<T*>(out), ldo, pdl, wsp, divs);
  };
  auto go = [&](auto bulk, auto split, auto warps) {
    constexpr int W = decltype(warps)::value;
    constexpr auto kernel = mma_kernel<T, K_BITS, FMT, NT, decltype(bulk)::value, decltype(split)::value, W>;
    // 2..4: PDL with the first weights (and by KBIT_MMA_EARLY_CB the codebook, the table)
    // requested before the wait (mma_body), where the caller promised that no earlier kernel
    // still in flight wrote them
    const int pdl = pdl_for<kernel>(device) > 0 ? (ws.weights_stable && !decltype(bulk)::value ? 2 + early_cb_mode(NT) : 1) : 0;
    const int items_per_warp = int(ceil_div(int64_t(rg) * steps, W));
    // the flush's slots (mma_body) where a warp's items touch at most 2 row groups in every
    // slice and the 2 W slot tiles fit (M = 48: 123 KB); else the atomics (and their
    // accumulator of rg tiles)
    Divs divs = divs0;
    size_t smem = bulk ? bulk_bytes : plan.smem;
    if (!decltype(bulk)::value && items_per_warp <= last_steps) {
      const size_t slot_smem = smem_bytes<T, K_BITS>(M, steps, 2 * W, dev.smem_reserved, 0, 0, wide5_at<K_BITS>(M));
      if (slot_smem <= size_t(dev.smem_optin)) {
        divs.ipw = magic_for(items_per_warp);
        divs.slots = 1;
        smem = slot_smem;
      }
    }
    return run(kernel, smem_optin<kernel>(device, dev.smem_optin), smem, W, bulk ? 0 : items_per_warp, pdl, divs);
  };
  using Yes = std::true_type;
  using No = std::false_type;
  using Warps = std::integral_constant<int, kWarpsPerCta<NT>>;
  if (n_stages > 0) return plan.S > 1 ? go(Yes{}, Yes{}, Warps{}) : go(Yes{}, No{}, Warps{});
  if (plan.S > 1) return go(No{}, Yes{}, Warps{});
  if constexpr (NT == 1) {
    // kFewWarps where it measured faster per shape (H200 with the slot flush, NOTES.md v38,
    // M = 1..8, 8 against 16 warps on every model shape): k = 2 with 9..16 items (Q, O: 0.1
    // us), k = 5 with 9..40 (O, down: 0.1-0.4 us; Q, gateup within 0.1 either way); never at k
    // = 3, 4 (16 warps: KV k = 3 0.4 us faster, the rest equal) nor with <= 8 items (KV).
    // (NOTES.md v33 had chosen it for <= 16 items at every k, with the flush's atomics.)
    const int64_t items = int64_t(rg) * steps;
    const int fw = forced_few_warps();
    const bool few = items > 8 && ((K_BITS == 2 && items <= 16) || (K_BITS == 5 && items <= 40));
    if (fw == 1 || (fw == 0 && few)) return go(No{}, No{}, std::integral_constant<int, kFewWarps>{});
  }
  return go(No{}, No{}, Warps{});
}

template <typename T, int K_BITS, int FMT>
cudaError_t launch_m(int M, cudaStream_t s, const void* x, int64_t ldx, const int32_t* p,
                     const void* a, const float* cb, int64_t N, int64_t K, int e,
                     const void* bias, void* out, int64_t ldo, const Workspace& ws) {
  if (M <= 8) return launch<T, K_BITS, FMT, 1>(s, x, ldx, M, p, a, cb, N, K, e, bias, out, ldo, ws);
  if (M <= 16) return launch<T, K_BITS, FMT, 2>(s, x, ldx, M, p, a, cb, N, K, e, bias, out, ldo, ws);
  if (M <= 32) return launch<T, K_BITS, FMT, 4>(s, x, ldx, M, p, a, cb, N, K, e, bias, out, ldo, ws);
  return launch<T, K_BITS, FMT, 8>(s, x, ldx, M, p, a, cb, N, K, e, bias, out, ldo, ws);
}

template <typename T, int K_BITS>
cudaError_t launch_fmt(int fmt, int M, cudaStream_t s, const void* x, int64_t ldx, const int32_t* p,
                       const void* a, const float* cb, int64_t N, int64_t K, int e,
                       const void* bias, void* out, int64_t ldo, const Workspace& ws) {
  if constexpr (KBIT_MMA_AB_ONLY) {
    if constexpr (std::is_same<T, __half>::value)
      if (fmt == KBIT_ABSMAX_E4M4) return launch_m<T, K_BITS, KBIT_ABSMAX_E4M4>(M, s, x, ldx, p, a, cb, N, K, e, bias, out, ldo, ws);
    return cudaErrorNotSupported;
  } else {
    switch (fmt) {
      case KBIT_ABSMAX_E4M4: return launch_m<T, K_BITS, KBIT_ABSMAX_E4M4>(M, s, x, ldx, p, a, cb, N, K, e, bias, out, ldo, ws);
      case KBIT_ABSMAX_F16: return launch_m<T, K_BITS, KBIT_ABSMAX_F16>(M, s, x, ldx, p, a, cb, N, K, e, bias, out, ldo, ws);
      case KBIT_ABSMAX_F32: return launch_m<T, K_BITS, KBIT_ABSMAX_F32>(M, s, x, ldx, p, a, cb, N, K, e, bias, out, ldo, ws);
    }
  }
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t launch_k(int k, int fmt, int M, cudaStream_t s, const void* x, int64_t ldx,
                     const int32_t* p, const void* a, const float* cb, int64_t N, int64_t K,
                     int e, const void* bias, void* out, int64_t ldo, const Workspace& ws) {
  switch (k) {
    case 2: return launch_fmt<T, 2>(fmt, M, s, x, ldx, p, a, cb, N, K, e, bias, out, ldo, ws);
    case 3: return launch_fmt<T, 3>(fmt, M, s, x, ldx, p, a, cb, N, K, e, bias, out, ldo, ws);
    case 4: return launch_fmt<T, 4>(fmt, M, s, x, ldx, p, a, cb, N, K, e, bias, out, ldo, ws);
    case 5: return launch_fmt<T, 5>(fmt, M, s, x, ldx, p, a, cb, N, K, e, bias, out, ldo, ws);
  }
  return cudaErrorInvalidValue;
}

}  // namespace
}  // namespace kbit

extern "C" int kbit_mma_max_x_bytes(void) { return kbit::kMaxXSmem; }

namespace kbit {
namespace {
// The plan of a call with these sizes on `device`, K split allowed (the caller gives a
// workspace); the plan does not depend on the 16-bit activation type.
Plan plan_for(int device, int k, int64_t M, int64_t N, int64_t K) {
  if (device < 0 || M < 1 || M > kMaxM || N < 1 || K < 1) return Plan{};
  const DeviceInfo& dev = device_info(device);
  switch (k) {
    case 2: return plan_of<__half, 2>(int(M), N, K, dev, true);
    case 3: return plan_of<__half, 3>(int(M), N, K, dev, true);
    case 4: return plan_of<__half, 4>(int(M), N, K, dev, true);
    case 5: return plan_of<__half, 5>(int(M), N, K, dev, true);
  }
  return Plan{};
}
}  // namespace
}  // namespace kbit

extern "C" int64_t kbit_mma_smem_bytes(int device, int dtype, int k, int64_t M, int64_t N, int64_t K) {
  if (dtype != KBIT_F16 && dtype != KBIT_BF16) return 0;
  return int64_t(kbit::plan_for(device, k, M, N, K).smem);
}

// Force the mma launcher's K-slice count (1, 2, 4, 8; 0: automatic again) for this process; calls
// the forced count cannot take are refused (cudaErrorInvalidValue). For tests and experiments.
extern "C" void kbit_mma_force_ksplit(int S) { kbit::forced_ksplit() = S; }

// K-slices the mma launcher would use for this call, given a workspace (0: not handled).
extern "C" int kbit_mma_ksplit(int device, int k, int64_t M, int64_t N, int64_t K) {
  return kbit::plan_for(device, k, M, N, K).S;
}

// Workspace bytes kbit_mma would use for this call (0: none, it would not split K).
extern "C" int64_t kbit_mma_workspace_bytes(int device, int k, int64_t M, int64_t N, int64_t K) {
  return int64_t(kbit::plan_for(device, k, M, N, K).ws_bytes);
}

extern "C" int kbit_device_smem_optin(int device) {
  return device < 0 ? 0 : kbit::device_info(device).smem_optin;
}

extern "C" int kbit_mma(int device, void* stream, const void* x, int dtype, int64_t M,
                        int64_t ldx, const int32_t* packed, const void* absmax, int absmax_format,
                        const float* codebook, int k, int64_t N, int64_t K, int absmax_exponent,
                        const void* bias, void* out, int64_t ldo, void* workspace, int64_t workspace_bytes,
                        int flags) {
  using namespace kbit;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  Workspace ws{workspace, workspace_bytes, nullptr};
  ws.weights_stable = (flags & KBIT_MMA_WEIGHTS_STABLE) != 0;
  return small_m_entry(device, dtype, M, N, kMaxM, [&](auto t) {
    return launch_k<decltype(t)>(k, absmax_format, int(M), s, x, ldx, packed, absmax, codebook, N, K,
                                 absmax_exponent, bias, out, ldo, ws);
  });
}
