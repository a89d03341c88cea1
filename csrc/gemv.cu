// gemv: C[M, N] = x[M, K] @ W^T (+ bias) for M = 1..4, W k-bit in the tiled64 layout.
//
// Written for latency (session 23; measured in session 24, NOTES.md v29): no shared memory,
// no barrier, no table to build. A warp owns R = 1 or 2 output rows over all of K; lane l takes
// the k-tiles l, l + 32, ... (64 values each, both blocks of tiled64's (kt, n) pair) and puts
// U = 2 of them per row in flight at once, words and stored scales straight into registers,
// so the weights stream from the first instruction after the PDL wait. The codebook lives in
// registers: lane L holds entry L mod 2^k and a value's index is the source lane of one
// shuffle (k <= 4: the shuffle reads only the low 5 bits of the index field, and entries repeat
// every 2^k lanes, so the bits above a value's nibble need no mask); at k = 2 a lane holds a
// pair of entries as fp16 and one shuffle by a 4-bit pair index gives two values (session 54,
// NOTES.md v64: shuffle_table, block_dot). Each block's 32 products
// are summed in fp32 and scaled once; the lanes' sums meet in a butterfly reduction and lane 0
// writes the R x M outputs.
//
// Why: mma.cu's CTAs build a 64 KB table and stage x behind a barrier before their first
// decode (~1.3 us of an M = 1 call, NOTES.md v27/v28), and the old scalar GEMV (fp32 codebook
// and spread tables in shared memory: ~2.25 shared loads per value) was bound by those loads.
// Here a value costs one shift, one shuffle and, per token, one conversion of x and one FMA.
// Index decode: the k bit-planes of a block are transposed in registers (nibble_transpose) so
// that nibble j of word r holds the index of value 4j + r; k = 5 adds the fifth plane's bit as
// bit 4 of byte-wide fields.
// Weak point: lane l reads k-tile l, so each warp load touches 32 lines (x) or 32 sectors
// N * 8k bytes apart (weights): ~8x the L1 wavefronts of coalesced loads. So it wins only on
// small weights, where a call is all latency: H100, cold, M = 1, k = 4 (bench v29): KV (512 x
// 2048) 3.1 us vs mma 3.9 (the old GEMV 4.5); gateup 9.8 vs mma 6.0 (the old GEMV 8.9).
#include <stdio.h>

#include <algorithm>

#include "common.cuh"
#include "tc.cuh"

namespace kbit {
namespace {

constexpr int kWarps = 4;  // warps per CTA: small CTAs, many per SM

// One k-tile of one row: both blocks' plane words and stored scale bits.
template <int K_BITS>
struct Tile {
  uint32_t w[kTileBlocks][K_BITS];
  uint32_t sbits[kTileBlocks];
};

// x[m][col .. col + 31] (one block) as 16 packed pairs; zeros past K or for an invalid tile.
template <typename T, int M>
__device__ __forceinline__ void load_x_block(uint32_t (&xw)[M][16], const T* __restrict__ x, int64_t ldx,
                                             int64_t col, int64_t K, bool valid, bool vec_x) {
#pragma unroll
  for (int m = 0; m < M; m++) {
    const T* src = x + m * ldx + col;
    if (valid && vec_x && col + 32 <= K) {
#pragma unroll
      for (int q = 0; q < 4; q++) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(src) + q);
        xw[m][4 * q] = v.x; xw[m][4 * q + 1] = v.y; xw[m][4 * q + 2] = v.z; xw[m][4 * q + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int q = 0; q < 16; q++) {
        const unsigned short lo = valid && col + 2 * q < K ? __ldg(reinterpret_cast<const unsigned short*>(src + 2 * q)) : 0;
        const unsigned short hi = valid && col + 2 * q + 1 < K ? __ldg(reinterpret_cast<const unsigned short*>(src + 2 * q + 1)) : 0;
        xw[m][q] = uint32_t(lo) | uint32_t(hi) << 16;
      }
    }
  }
}

// Half `i` (0 = low) of a word of two packed T (fp16 / bf16) values, as a float.
template <typename T>
__device__ __forceinline__ float half_to_float(uint32_t word, int i) {
  const uint32_t bits = (word >> (16 * i)) & 0xffffu;
  if constexpr (std::is_same<T, __half>::value) return __half2float(__ushort_as_half((unsigned short)bits));
  else return __uint_as_float(bits << 16);
}

// Values 4j .. 4j + 3 (j = 0..7) of a block of x as floats, from its packed pairs.
template <typename T>
__device__ __forceinline__ float4 x_quad(const uint32_t (&xw)[16], int j) {
  float f[4];
#pragma unroll
  for (int i = 0; i < 4; i++) f[i] = half_to_float<T>(xw[2 * j + (i >> 1)], i & 1);
  return make_float4(f[0], f[1], f[2], f[3]);
}

__device__ __forceinline__ float quad_at(const float4& q, int i) {
  return i == 0 ? q.x : i == 1 ? q.y : i == 2 ? q.z : q.w;
}

// sum[m] += codebook[idx(v)] * x[m][v] over the 32 values of one block; xq(m, j) gives token
// m's values 4j .. 4j + 3 as a float4 (packed pairs in registers for gemv_kernel, fp32 in
// shared memory for gemv_rows_kernel).
// KBIT_GEMV_PROBE (timing probes only, wrong results; default 0): bit 0 drops the rows kernel's
// decode (a block's words XORed into one product), bit 1 its read of x (constants staged), bit 2
// its codebook shuffles (block_dot: an XOR with the source lane instead, same dependencies),
// bit 3 its shared-memory loads of x in the decode (constants instead).
#ifndef KBIT_GEMV_PROBE
#define KBIT_GEMV_PROBE 0
#endif

// block_dot's codebook lookup: lane idx's table word (KBIT_GEMV_PROBE bit 2: an XOR instead).
template <typename V>
__device__ __forceinline__ V table_shfl(V v, int idx) {
#if KBIT_GEMV_PROBE & 4
  if constexpr (sizeof(V) == 4 && !std::is_integral_v<V>) return __uint_as_float(__float_as_uint(v) ^ uint32_t(idx & 31));
  else return v ^ V(idx & 31);
#else
  return __shfl_sync(0xffffffffu, v, idx);
#endif
}

// The shuffles' table of a lane (block_dot's cb): k = 3..5 codebook entry lane mod 2^k as fp32;
// k = 2 a pair of entries as two fp16 halves, entry (lane & 3) low and ((lane >> 2) & 3) high
// (entries repeat every 16 lanes), so that one shuffle by a 4-bit pair index gives two values.
template <int K_BITS>
__device__ __forceinline__ float shuffle_table(const float* __restrict__ codebook, int lane) {
  if constexpr (K_BITS == 2) {
    const __half2 p = __floats2half2_rn(__ldg(codebook + (lane & 3)), __ldg(codebook + ((lane >> 2) & 3)));
    return __uint_as_float(*reinterpret_cast<const uint32_t*>(&p));
  } else {
    return __ldg(codebook + (lane & ((1 << K_BITS) - 1)));
  }
}

template <int K_BITS, int M, typename XQuad>
__device__ __forceinline__ void block_dot(const uint32_t (&w)[K_BITS], float cb, XQuad&& xq, float (&sum)[M]) {
  uint32_t t0 = w[0], t1 = w[1], t2 = K_BITS > 2 ? w[2] : 0u, t3 = K_BITS > 3 ? w[3] : 0u;
  nibble_transpose(t0, t1, t2, t3);
  const uint32_t t[4] = {t0, t1, t2, t3};  // nibble j of t[r]: the index of value 4j + r
  if constexpr (K_BITS == 5) {
    // byte i of e[r] (o[r]): index of value 8i + r (8i + 4 + r), its fifth bit as bit 4
    uint32_t e[4], o[4];
    const uint32_t hi = w[4 % K_BITS];
#pragma unroll
    for (int r = 0; r < 4; r++) {
      e[r] = (t[r] & 0x0f0f0f0fu) | (((hi >> r) & 0x01010101u) << 4);
      o[r] = ((t[r] >> 4) & 0x0f0f0f0fu) | (((hi >> (r + 4)) & 0x01010101u) << 4);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
      float4 xe[M], xo[M];
#pragma unroll
      for (int m = 0; m < M; m++) { xe[m] = xq(m, 2 * i); xo[m] = xq(m, 2 * i + 1); }
#pragma unroll
      for (int r = 0; r < 4; r++) {
        const float we = table_shfl(cb, int(e[r] >> (8 * i)));
        const float wo = table_shfl(cb, int(o[r] >> (8 * i)));
#pragma unroll
        for (int m = 0; m < M; m++) {
          sum[m] = fmaf(we, quad_at(xe[m], r), sum[m]);
          sum[m] = fmaf(wo, quad_at(xo[m], r), sum[m]);
        }
      }
    }
  } else if constexpr (K_BITS == 2) {
    // Pairs: nibble j of u (v) is the 4-bit pair index of values 4j, 4j + 1 (4j + 2, 4j + 3)
    // (k = 2 leaves nibble bits 2-3 of t[r] zero); one shuffle of shuffle_table<2>'s fp16 pairs
    // per two values instead of one per value. The codebook is rounded to fp16 (2^-11
    // relative, as mma's fp16 fragments round it); products and sums stay fp32.
    const uint32_t u = t[0] | (t[1] << 2), v = t[2] | (t[3] << 2);
    const uint32_t table = __float_as_uint(cb);
#pragma unroll
    for (int j = 0; j < 8; j++) {
      float4 xv[M];
#pragma unroll
      for (int m = 0; m < M; m++) xv[m] = xq(m, j);
      const uint32_t pu = table_shfl(table, int(u >> (4 * j)));
      const uint32_t pv = table_shfl(table, int(v >> (4 * j)));
      const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&pu));
      const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&pv));
#pragma unroll
      for (int m = 0; m < M; m++) {
        sum[m] = fmaf(a.x, xv[m].x, sum[m]);
        sum[m] = fmaf(a.y, xv[m].y, sum[m]);
        sum[m] = fmaf(b.x, xv[m].z, sum[m]);
        sum[m] = fmaf(b.y, xv[m].w, sum[m]);
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; j++) {
      float4 xv[M];
#pragma unroll
      for (int m = 0; m < M; m++) xv[m] = xq(m, j);
#pragma unroll
      for (int r = 0; r < 4; r++) {
        const float wv = table_shfl(cb, int(t[r] >> (4 * j)));
#pragma unroll
        for (int m = 0; m < M; m++) sum[m] = fmaf(wv, quad_at(xv[m], r), sum[m]);
      }
    }
  }
}

// Bytes of (hi:lo) picked by the 4 selector nibbles of sel[15:0] (prmt.b32, default mode). The
// codebook lookups of gemv_tc_kernel pass nibbles 0..7 only (bit 3, sign replication, clear), so
// the nibble masks that __byte_perm's C semantics cost (one LOP3 per call in SASS) are not needed.
__device__ __forceinline__ uint32_t prmt(uint32_t lo, uint32_t hi, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(lo), "r"(hi), "r"(sel));
  return d;
}

// KBIT_GEMV_XPAD (default on since session 56) pads each k-tile of the rows kernel's staged x
// by 4 floats, so that the 2 or 4 k-tiles a warp reads at once (RL = 16 / 8) sit in different
// banks (unpadded: 2- / 4-way conflicts on every x load). H100, M = 1 Scalar (NOTES.md v66):
// KV k = 2, 5 -0.1..-0.15 us, O k = 2 -0.1, down k = 3 5.7 -> 5.0 (U = 5, the slowdown of v64
// item 6); the other cells within the run's noise; Q (RL = 32) unchanged.
// KBIT_GEMV_PAIRTAB (experiment switch, default off) decodes k = 3, 4 through a shared-memory
// table of fp16 codebook pairs instead of one shuffle per value. Measured (v66, M = 1): slower
// at k = 4 on every shape (+0.15..+0.45 us) and on gateup k = 3 (+0.9), faster on down k = 3
// (-0.8) and O k = 3 (-0.15): the decode is latency-, not MIO-bound at M = 1.
#ifndef KBIT_GEMV_XPAD
#define KBIT_GEMV_XPAD 1
#endif
#ifndef KBIT_GEMV_PAIRTAB
#define KBIT_GEMV_PAIRTAB 0
#endif
// Floats after each k-tile's 64 in the rows kernel's staged x, per (k, rows per CTA): none at
// k = 4 with 16 rows per CTA, where padding made O (M = 1, 16 x 8) 0.6 us slower on the H100
// (v66: 4.0 -> 4.6 us, same instruction mix, 80 -> 73 registers; not understood); those
// kernels stay as before.
// KBIT_GEMV_TC_DEFAULT: which k at M = 1 take gemv_tc_kernel unless KBIT_GEMV_TC says (the
// values of tc_mode: 0, 1 or a mask of k). H100, session 62 (NOTES.md v71): with 12 (k = 2 and 3)
// the dense M = 1 Scalar TOTAL went k = 2 16.9 -> 15.2 us, k = 3 19.7 -> 16.7; k = 4 on tensor
// cores is slower (19.0 -> 28.0), so k = 4, 5 stay on the rows kernel.
#ifndef KBIT_GEMV_TC_DEFAULT
#define KBIT_GEMV_TC_DEFAULT 12
#endif
template <int K_BITS>
constexpr int x_pad(int rl) { return KBIT_GEMV_XPAD && !(K_BITS == 4 && rl == 16) ? 4 : 0; }
template <int K_BITS>
constexpr bool pair_table_on() { return KBIT_GEMV_PAIRTAB && (K_BITS == 3 || K_BITS == 4); }
// Rows of the pair table: row e holds (codebook[e & 15], codebook[e >> 4]) as fp16 in all 32
// words (one per bank), so lane l reading word l of any row never conflicts. k = 3's pair
// indices have bits 3 and 7 clear: rows 0..127 are enough.
template <int K_BITS>
constexpr int pair_table_rows() { return pair_table_on<K_BITS>() ? (K_BITS == 4 ? 256 : 128) : 0; }

// block_dot for k = 3, 4 through the pair table, in two halves so that the rows kernel can
// put the lookups of a whole tile (both blocks) ahead of their products: ptxas otherwise
// places each shared load just before its use. pair_lookups: the block's 16 table words
// (tab: the shared address of the table's word `lane`); one 4-byte shared load gives two
// values (half the MIO work of two shuffles).
template <int K_BITS>
__device__ __forceinline__ void pair_lookups(const uint32_t (&w)[K_BITS], uint32_t tab, uint32_t (&pr)[4][4]) {
  static_assert(K_BITS == 3 || K_BITS == 4, "pair table: k = 3, 4");
  uint32_t t0 = w[0], t1 = w[1], t2 = w[2], t3 = K_BITS > 3 ? w[3] : 0u;
  nibble_transpose(t0, t1, t2, t3);  // nibble j of t_r: the index of value 4j + r
  // byte i of p[q]: the pair index (low nibble first) of values 8i + 2q, 8i + 2q + 1
  // (q = 0, 1) and 8i + 4 + 2(q - 2), 8i + 5 + 2(q - 2) (q = 2, 3)
  const uint32_t p[4] = {(t0 & 0x0f0f0f0fu) | ((t1 & 0x0f0f0f0fu) << 4),
                         (t2 & 0x0f0f0f0fu) | ((t3 & 0x0f0f0f0fu) << 4),
                         ((t0 >> 4) & 0x0f0f0f0fu) | (t1 & 0xf0f0f0f0u),
                         ((t2 >> 4) & 0x0f0f0f0fu) | (t3 & 0xf0f0f0f0u)};
#pragma unroll
  for (int i = 0; i < 4; i++) {
#pragma unroll
    for (int q = 0; q < 4; q++) {
      // byte i by one PRMT (zeros above it), the row's shared address by one LEA (a 32-bit
      // address: the C++ form became PRMT, IMAD, LEA). Not volatile, so that the loads can be
      // scheduled early; tab comes from a volatile asm after the barrier that ends the table's
      // build, which keeps them after it.
      const uint32_t e = __byte_perm(p[q], 0u, 0x4440u + i);
      asm("ld.shared.b32 %0, [%1];" : "=r"(pr[i][q]) : "r"(tab + (e << 7)));
    }
  }
}

// sum[m] += the block's 32 products from pair_lookups' words (xq as in block_dot)
template <int M, typename XQuad>
__device__ __forceinline__ void pair_products(const uint32_t (&pr)[4][4], XQuad&& xq, float (&sum)[M]) {
#pragma unroll
  for (int i = 0; i < 4; i++) {
    float4 xa[M], xb[M];
#pragma unroll
    for (int m = 0; m < M; m++) { xa[m] = xq(m, 2 * i); xb[m] = xq(m, 2 * i + 1); }
    float2 v[4];
#pragma unroll
    for (int q = 0; q < 4; q++) v[q] = __half22float2(*reinterpret_cast<const __half2*>(&pr[i][q]));
#pragma unroll
    for (int m = 0; m < M; m++) {
      sum[m] = fmaf(v[0].x, xa[m].x, sum[m]);
      sum[m] = fmaf(v[0].y, xa[m].y, sum[m]);
      sum[m] = fmaf(v[1].x, xa[m].z, sum[m]);
      sum[m] = fmaf(v[1].y, xa[m].w, sum[m]);
      sum[m] = fmaf(v[2].x, xb[m].x, sum[m]);
      sum[m] = fmaf(v[2].y, xb[m].y, sum[m]);
      sum[m] = fmaf(v[3].x, xb[m].z, sum[m]);
      sum[m] = fmaf(v[3].y, xb[m].w, sum[m]);
    }
  }
}

// At least 4 CTAs per SM (<= 128 registers), 5 at M = 1 (<= 102: a gateup-sized call puts ~20
// warps on every SM at R = 2 and should have them all resident at once).
template <typename T, int K_BITS, int M, int R, int U>
__global__ void __launch_bounds__(kWarps * 32, M == 1 ? 5 : 4) gemv_kernel(
    const T* __restrict__ x, int64_t ldx, const int32_t* __restrict__ packed,
    const void* __restrict__ absmax, int absmax_format, const float* __restrict__ codebook,
    int64_t N, int64_t K, int64_t KT, float shift_up, bool vec_x, const T* __restrict__ bias,
    T* __restrict__ out, int64_t ldo, int pdl) {
  const int lane = threadIdx.x & 31;
  const int64_t n0 = (int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * R;
  if (n0 >= N) return;  // no barrier in this kernel: a warp without rows just leaves
  // tiled64 block index of (kt, row n0 + r, block 0)
  auto block_of = [&](int64_t kt, int r) { return (kt * N + n0 + r) * kTileBlocks; };
  // PDL (common.cuh): wait for the previous kernel before any real load. The trigger follows
  // the main loop: many small CTAs triggered at entry let the next calls' grids pile up
  // (NOTES.md v16).
  if (pdl > 0) pdl_wait();
  // lane L holds codebook entry L mod 2^k (k = 2: a pair of entries; the shuffles' table)
  const float cb = shuffle_table<K_BITS>(codebook, lane);

  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int m = 0; m < M; m++) acc[r][m] = 0.f;

  // Rounds of U tiles per lane (tile u of a round: kt = base + 32u + lane); the loop bounds
  // and the slot test are warp-uniform, as the shuffles need. A lane past KT (or a row past
  // N) decodes block 0 with scale 0 and x = 0.
  for (int64_t base = 0; base < KT; base += 32 * U) {
    Tile<K_BITS> tile[U][R];
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (base + 32 * u >= KT) break;  // warp-uniform: no lane has this slot
      const int64_t kt = base + 32 * u + lane;
#pragma unroll
      for (int r = 0; r < R; r++) {
        const bool ok = kt < KT && n0 + r < N;
        const int64_t blk = ok ? block_of(kt, r) : 0;
#pragma unroll
        for (int h = 0; h < kTileBlocks; h++) {
          load_words<K_BITS, true>(tile[u][r].w[h], packed + (blk + h) * K_BITS);
          tile[u][r].sbits[h] = load_absmax_bits_if<true>(absmax, absmax_format, blk + h, ok);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (base + 32 * u >= KT) break;  // warp-uniform: no lane has this slot
      const int64_t kt = base + 32 * u + lane;
#pragma unroll
      for (int h = 0; h < kTileBlocks; h++) {
        uint32_t xw[M][16];
        load_x_block<T, M>(xw, x, ldx, kt * 64 + 32 * h, K, kt < KT, vec_x);
#pragma unroll
        for (int r = 0; r < R; r++) {
          float sum[M];
#pragma unroll
          for (int m = 0; m < M; m++) sum[m] = 0.f;
          block_dot<K_BITS, M>(tile[u][r].w[h], cb, [&](int m, int j) { return x_quad<T>(xw[m], j); }, sum);
          const float scale = absmax_of_bits(tile[u][r].sbits[h], absmax_format);
#pragma unroll
          for (int m = 0; m < M; m++) acc[r][m] = fmaf(sum[m], scale, acc[r][m]);
        }
      }
    }
  }
  if (pdl > 0) pdl_trigger();
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int m = 0; m < M; m++) {
      float v = acc[r][m];
#pragma unroll
      for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
      acc[r][m] = v;
    }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; r++) {
      const int64_t n = n0 + r;
      if (n < N) {
        const float b = bias != nullptr ? to_float(bias[n]) : 0.f;
#pragma unroll
        for (int m = 0; m < M; m++) out[m * ldo + n] = from_float<T>(acc[r][m] * shift_up + b);
      }
    }
  }
}

// gemv_rows_kernel: M = 1..4 tokens with coalesced weights (session 24; M = 2..4 session 43).
// Lane l of a warp takes row n0 + l % RL and k phase warp * 32 / RL + l / RL; a CTA of W warps
// covers RL rows with W * 32 / RL phases, tile kt going to phase kt mod (W * 32 / RL). tiled64
// stores the (kt, n) tiles of consecutive n one after another, so the RL lanes of a phase read
// RL * 8k contiguous bytes. x is the same for every row: the CTA stages the M tokens once in
// shared memory as fp32 rows (token m at xs + m * KT * 64, zeros past K) while its first tiles
// are in flight, and every lane reads its tile's 64 values as float4 broadcasts. The decode is
// gemv_kernel's (block_dot: one shuffle per value, fp32 block sums, one scale per block; each
// decoded value serves the M tokens). Partial sums meet in a shuffle over the phases of a
// warp, then in shared memory over the warps. Measured (H100, M = 1, cold,
// docs/gemv_rows_sweep_h100_v30.txt, bench v31): faster than gemv_kernel on every dense
// shape; faster than mma on KV, Q at k = 2, 5 and gateup / O at k = 5, slower on the rest; on
// 28672 x 8192 ~1.6 TB/s at k = 4 (mma 2.7): one shuffle per value caps the decode. At M =
// 2..4 gemv_kernel's uncoalesced loads were ~2.3x (M = 2) to ~3x (M = 4) slower (H200, v53).
// M = 1 takes its own forms of the x staging (no division) and of the epilogue (one `if`
// rather than a loop): with the general forms ptxas unrolled the main loop into two copies of
// the round body instead of three (79 registers instead of 99) and M = 1 ran 5-25% slower
// (v53 item 5); with them the M = 1 code is instruction for instruction session 24's kernel
// (scripts/sass_diff.py, NOTES.md v54 item 7).
// Row groups (GR > 1, M = 1; session 57): a CTA covers GR groups of RL rows with WG warps each
// (GR * WG warps), so that N / (RL * GR) CTAs are one per SM where RL <= 32 rows cannot get
// there: gateup (N = 5120) as 8 rows x 5 groups = 40 rows, 128 CTAs, where 32-row CTAs are 160
// (1-2 per SM: the SMs with two take twice the decode). Session 53's form of this (one warp
// per group, 8 tiles per lane) was slower (v64 item 1: k = 4 4.9 -> 6.5 us): 5 warps per SM did
// not hide the shuffle chain's latency; WG = 2 keeps gateup at 4 tiles per lane on 10 warps.
template <typename T, int K_BITS, int M, int RL, int U, int GR = 1, int WG = 0>
__global__ void __launch_bounds__(GR == 1 ? 256 : 32 * GR * WG) gemv_rows_kernel(
    const T* __restrict__ x, int64_t ldx, const int32_t* __restrict__ packed, const void* __restrict__ absmax,
    int absmax_format, const float* __restrict__ codebook, int64_t N, int64_t K, int64_t KT,
    float shift_up, bool vec_x, const T* __restrict__ bias, T* __restrict__ out, int64_t ldo, int pdl) {
  extern __shared__ float4 rows_smem[];
  constexpr int kTabRows = pair_table_rows<K_BITS>();
  uint32_t* table = reinterpret_cast<uint32_t*>(rows_smem);  // kTabRows x 32 words (pair table)
  constexpr int kXPad = x_pad<K_BITS>(RL);
  float* xs = reinterpret_cast<float*>(table + kTabRows * 32);  // M rows of KT k-tiles of 64 + kXPad floats
  const int64_t row_len = KT * (64 + kXPad);
  float* red = xs + M * row_len;                      // W * RL * M partial sums
  constexpr int G = 32 / RL;                          // phases per warp
  static_assert(GR == 1 ? WG == 0 : M == 1 && WG > 0, "row groups: M = 1, WG warps per group");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = blockDim.x >> 5;
  // this warp's row group and its index among the group's warps (GR = 1: the CTA's warps)
  const int group = GR == 1 ? 0 : warp / WG, wig = GR == 1 ? warp : warp - group * WG;
  const int64_t P = int64_t(GR == 1 ? W : WG) * G;   // phases per row group
  const int64_t n = (int64_t(blockIdx.x) * GR + group) * RL + lane % RL;
  const int64_t phase = wig * G + lane / RL, warp_phase = wig * G;
  const bool row_ok = n < N;
  auto tile_block = [&](int64_t kt) { return (kt * N + n) * kTileBlocks; };  // block 0 of (kt, n)
  // pdl 2 (the caller's KBIT_WEIGHTS_STABLE, kbit.h: no kernel still in flight wrote the
  // weights or the codebook): the codebook and the first round of tiles are requested before
  // the PDL wait, so that they stream while the previous kernel finishes (x, bias and out wait
  // for it as before); mma does the same (NOTES.md v52, v60). H200, 3 rounds back-to-back (v61):
  // KV, Q -0.03..-0.3 us per call, down (3 rounds of tiles) -0.5..-1.7; after a plain kernel
  // within 0.1 us.
  // The next kernel may start (pdl_trigger) right after this call's wait on stable weights
  // (pdl 2), so that its own early loads overlap this call's main loop, one grid ahead at most:
  // its wait ends with this call (session 52, NOTES.md v62: H200 back-to-back M = 1 KV -0.45
  // us, Q / O / gateup -0.5..-0.7; after a plain kernel within 0.1 us). Triggering at the very
  // start let grids pile up on the SMs (3 at k = 2) and cost up to +3.4 us. pdl 3
  // (KBIT_GEMV_EARLY_TRIGGER=0, for A/Bs) triggers after the main loop as pdl 1 does.
  const bool early = pdl > 1;
  if (pdl > 0 && !early) pdl_wait();
  const float cb = pair_table_on<K_BITS>() ? 0.f : shuffle_table<K_BITS>(codebook, lane);  // the shuffles' table
  // the pair table's row threadIdx.x (built after the first tiles are requested), requested here
  constexpr int kCbMask = (1 << K_BITS) - 1;
  auto pair_row = [&](int e) {
    const __half2 pr = __floats2half2_rn(__ldg(codebook + (e & 15 & kCbMask)), __ldg(codebook + ((e >> 4) & kCbMask)));
    return *reinterpret_cast<const uint32_t*>(&pr);
  };
  uint32_t first_row = 0;
  if constexpr (kTabRows > 0) first_row = threadIdx.x < kTabRows ? pair_row(threadIdx.x) : 0u;
  // A round: U tiles per lane, tile u at kt = base + u * P + phase. A slot is skipped when no
  // warp of the CTA has it (kWarpBreak: no lane of this warp; either way uniform, as the
  // shuffles need); a lane without a tile (past KT or N) decodes block 0 with scale 0, a warp
  // without the slot zeros.
  Tile<K_BITS> tile[U];
  constexpr bool kWarpBreak = K_BITS == 5 || (K_BITS == 4 && U == 5);  // see the decode loop
  // where both loops stop: slot u of a round lies past KT for every warp of the CTA
  // (kWarpBreak: for this warp)
  auto past_slots = [&](int64_t slot_base) { return slot_base + (kWarpBreak ? warp_phase : 0) >= KT; };
  auto load_round = [&](int64_t base) {
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (past_slots(base + u * P)) break;
      if (base + u * P + warp_phase >= KT) {  // no lane of this warp has it: zeros (scale 0),
#pragma unroll                                 // which the decode loop reads
        for (int h = 0; h < kTileBlocks; h++) {
#pragma unroll
          for (int b = 0; b < K_BITS; b++) tile[u].w[h][b] = 0u;
          tile[u].sbits[h] = 0u;
        }
        continue;
      }
      const int64_t kt = base + u * P + phase;
      const bool ok = row_ok && kt < KT;
      const int64_t blk = ok ? tile_block(kt) : 0;
#pragma unroll
      for (int h = 0; h < kTileBlocks; h++) {
        load_words<K_BITS, true>(tile[u].w[h], packed + (blk + h) * K_BITS);
        tile[u].sbits[h] = load_absmax_bits_if<true>(absmax, absmax_format, blk + h, ok);
      }
    }
  };
  load_round(0);
  if (early) pdl_wait();
  if (pdl == 2) pdl_trigger();
  if constexpr (kTabRows > 0) {
    // the pair table, after the first tiles are requested (waiting for the codebook would hold
    // them back): a thread writes row e's 8 chunks of 16 bytes starting at chunk e mod 8, so the
    // 8 threads of a store phase hit 8 different bank groups
    for (int e = threadIdx.x; e < kTabRows; e += blockDim.x) {
      const uint32_t wv = e == int(threadIdx.x) ? first_row : pair_row(e);
      uint4* row = reinterpret_cast<uint4*>(table + e * 32);
#pragma unroll
      for (int c = 0; c < 8; c++) row[(c + e) & 7] = make_uint4(wv, wv, wv, wv);
    }
  }
  // x -> fp32 in shared memory, 8 values per thread and step (token m at xs + m * row_len,
  // column c at c + (c / 64) * kXPad)
  const int64_t x_len = KT * 64;
  for (int64_t i = int64_t(threadIdx.x) * 8; i < M * x_len; i += int64_t(blockDim.x) * 8) {
    int64_t m = 0, c = i;
    if constexpr (M > 1) {
      m = i / x_len;  // a step never crosses a token (x_len % 8 == 0)
      c = i - m * x_len;
    }
    const T* src = x + m * ldx + c;
    float f[8];
    if (KBIT_GEMV_PROBE & 2) {  // timing probe (wrong results): x not read
#pragma unroll
      for (int e = 0; e < 8; e++) f[e] = float(e);
    } else if (vec_x && c + 8 <= K) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(src));
      const uint32_t wv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 8; e++) f[e] = half_to_float<T>(wv[e >> 1], e & 1);
    } else {
#pragma unroll
      for (int e = 0; e < 8; e++) f[e] = c + e < K ? to_float(src[e]) : 0.f;
    }
    float* dst = kXPad ? xs + m * row_len + c + (c >> 6) * kXPad : xs + i;
    reinterpret_cast<float4*>(dst)[0] = make_float4(f[0], f[1], f[2], f[3]);
    reinterpret_cast<float4*>(dst)[1] = make_float4(f[4], f[5], f[6], f[7]);
  }
  __syncthreads();
  // the shared address of the pair table's word `lane` (k = 3, 4), taken after the barrier
  uint32_t tab_lane = uint32_t(__cvta_generic_to_shared(table + lane));
  if constexpr (kTabRows > 0) asm volatile("mov.b32 %0, %0;" : "+r"(tab_lane));
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; m++) acc[m] = 0.f;
  for (int64_t base = 0; base < KT; base += P * U) {
    if (base > 0) load_round(base);
#pragma unroll
    for (int u = 0; u < U; u++) {
      // k = 2..4 (except U = 5): the break tests a CTA-uniform bound only, and a warp decodes
      // the slots that only other warps have as zeros (load_round zeroed them). A per-warp
      // break (warp-uniform, but not provably so) makes ptxas wrap every shuffle in WARPSYNC /
      // ENDCOLLECTIVE and keep a second copy of the decode for divergent warps. With this
      // break, H200 back-to-back M = 1 (session 54, NOTES.md v64 item 6): KV, Q, O k = 2..4
      // -0.1..-0.5 us; but down k = 3 (U = 5) +0.54. Without any break, k = 5 (Q +0.7, gateup
      // +0.85) and down k = 4 at U = 5 (+0.45) were slower; not understood, so those keep the
      // per-warp break (kWarpBreak).
      if (past_slots(base + u * P)) break;
      const int64_t kt = base + u * P + phase;
      const float4* xq = reinterpret_cast<const float4*>(xs + (kt < KT ? kt : 0) * (64 + kXPad));
      uint32_t pr[kTabRows > 0 ? kTileBlocks : 1][4][4];  // the pair table's words (k = 3, 4)
      if constexpr (kTabRows > 0) {
#pragma unroll
        for (int h = 0; h < kTileBlocks; h++) pair_lookups<K_BITS>(tile[u].w[h], tab_lane, pr[h]);
      }
#pragma unroll
      for (int h = 0; h < kTileBlocks; h++) {
        float sum[M];
#pragma unroll
        for (int m = 0; m < M; m++) sum[m] = 0.f;
        // token m's float4 j of this block: xq + m * (row_len / 4) + 8h + j
#if KBIT_GEMV_PROBE & 8
        auto xquad = [&](int m, int j) { return make_float4(0.5f + j, 1.5f + m, 2.5f + h, 3.5f); };
#else
        auto xquad = [&](int m, int j) { return xq[m * (row_len >> 2) + 8 * h + j]; };
#endif
#if KBIT_GEMV_PROBE & 1
        {  // timing probe (wrong results): no decode, the words and one x quad still used
          uint32_t hw = tile[u].w[h][0];
#pragma unroll
          for (int b = 1; b < K_BITS; b++) hw ^= tile[u].w[h][b];
          sum[0] = __uint_as_float((hw & 0x007fffffu) | 0x3f000000u) * xquad(0, 0).x + cb;
        }
#else
        if constexpr (kTabRows > 0) pair_products<M>(pr[h], xquad, sum);
        else block_dot<K_BITS, M>(tile[u].w[h], cb, xquad, sum);
#endif
        const float scale = absmax_of_bits(tile[u].sbits[h], absmax_format);
#pragma unroll
        for (int m = 0; m < M; m++) acc[m] = fmaf(sum[m], scale, acc[m]);
      }
    }
  }
  if (pdl == 1 || pdl == 3) pdl_trigger();
#pragma unroll
  for (int m = 0; m < M; m++) {
#pragma unroll
    for (int d = RL; d < 32; d <<= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], d);
    if (lane < RL) red[(warp * RL + lane) * M + m] = acc[m];
  }
  __syncthreads();
  if constexpr (GR > 1) {  // M = 1; RL * GR <= 32 * GR * WG threads
    if (threadIdx.x < RL * GR) {
      const int g = threadIdx.x / RL, r = threadIdx.x - g * RL;
      const int64_t row = (int64_t(blockIdx.x) * GR + g) * RL + r;
      float v = 0.f;
      for (int w = 0; w < WG; w++) v += red[(g * WG + w) * RL + r];
      if (row < N) out[row] = from_float<T>(v * shift_up + (bias != nullptr ? to_float(bias[row]) : 0.f));
    }
  } else if constexpr (M == 1) {  // RL <= 32 <= blockDim.x
    if (threadIdx.x < RL) {
      const int64_t row = int64_t(blockIdx.x) * RL + threadIdx.x;
      float v = 0.f;
      for (int w = 0; w < W; w++) v += red[w * RL + threadIdx.x];
      if (row < N) out[row] = from_float<T>(v * shift_up + (bias != nullptr ? to_float(bias[row]) : 0.f));
    }
  } else {
    for (int t = threadIdx.x; t < RL * M; t += blockDim.x) {  // a 1-warp CTA has fewer threads than outputs
      const int r = t % RL, m = t / RL;
      const int64_t row = int64_t(blockIdx.x) * RL + r;
      float v = 0.f;
      for (int w = 0; w < W; w++) v += red[(w * RL + r) * M + m];
      if (row < N) out[m * ldo + row] = from_float<T>(v * shift_up + (bias != nullptr ? to_float(bias[row]) : 0.f));
    }
  }
}

// An E4M4 code (0..255) -> its value / 16 as a T pair, exactly. The code shifted left by 6 is an
// fp16 with the code's exponent and mantissa fields (bias 15 against E4M4's 11, and E4M4's
// subnormals, m * 2^-14, land on fp16's), so at fp16 one multiply by 0x00400040 makes the pair
// (v72: ~10 instructions of a float decode + pack per block before); bf16 goes through float.
// H100 (NOTES.md v74): dense M = 1 TOTAL k = 2 15.5 -> 15.0 us, k = 3 17.0 -> 16.3 (2 rounds).
template <typename T>
__device__ __forceinline__ uint32_t e4m4_pair_div16(uint32_t code) {
  if constexpr (std::is_same_v<T, __half>) {
    return code * 0x00400040u;
  } else {
    const float f = __half2float(__ushort_as_half(static_cast<unsigned short>(code << 6)));
    return Pair<T>::pack(f, f);
  }
}

// gemv_tc_kernel: M = 1, k = 2..4 with the products on tensor cores (sessions 58-59, experiment:
// KBIT_GEMV_TC=1). Why: the rows kernel's decode costs ~1.1-1.5 us of every M = 1 call (H100,
// NOTES.md v68: the same kernel without it is that much faster per shape) at ~3.7 instructions per
// value (shift, shuffle, fp16 -> fp32 conversion, FFMA, a quarter of a shared load of x): with only
// 2 warps per scheduler it is bound by issue and latency. Here the products go to mma.sync and the
// codebook lookup is a byte permute (prmt) on a byte table: per 4 values, one prmt picks their low
// bytes from the (block-scaled) codebook entries' low bytes (k = 2: 4 entries in one register; k =
// 3: 8 in two), one their high bytes, and two more interleave them into the two MMA registers: ~2.7
// instructions per value at k = 2 in SASS (rows kernel ~3.7; NOTES.md v69). k = 4 (16 entries):
// with a symmetric codebook (entry 15 - i = -entry i: the nf codebooks) the 8 magnitudes' bytes,
// the index planes turned into magnitude and sign planes before the transpose, and the sign XORed
// into the high bytes by one more prmt; otherwise two lookups per half table and a third prmt that
// picks the half. The selectors are the nibble-transposed indices themselves (nibble j of t[r]: the
// index of value 4j + r; prmt reads the low 16 bits), so values r + 4q (q = 0..3) of a block's half
// hf form one MMA slice. A = 16 weight "rows": row g (< 8) is weight row g of an 8-row group at
// k-tile kt0, row g + 8 the same weight row at kt1 = kt0 + 4 (another phase); B = x: column 0 at
// kt0's k, column 1 at kt1's (columns 2..7 are whatever their lanes load and never read). So
// D[g][0] + D[g + 8][1] is row g's sum over the 8 k-tiles of the warp's 4 lanes (g, c) (2 each),
// and lane (g, 0) holds both (its D registers 0 and 3). Lane (g, c) = (lane / 4, lane % 4) holds
// row g's tiles kt0 = phase c and kt1 = kt0 + 4 (both blocks, 64 values each); x is staged once per
// CTA in T with each 32-value block permuted to the slices (position 16 hf + 4 r + q holds value 16
// hf + r + 4 q, so one 8-byte load gives B's 2 registers) and k-tiles padded by 4 values, so that
// the 8 tiles a warp reads at once hit different banks. The byte tables are rebuilt per block and
// tile: entries x block scale (2^(k-1) packed multiplies), then 2^(k-2) prmt pairs. A CTA: GR
// groups of 8 rows x WG warps each (8 phases per warp), as the rows kernel's row groups; rounds of
// U units (2 tiles) per lane; PDL order as in the rows kernel.
// Precision: the weights enter the MMA as T (the codebook rounded to T, then times the scale
// rounded to T again, as mma.cu does), products and sums in fp32. Range: E4M4 scales (<= 31; the
// per-tensor power of two is applied to the fp32 sum) cannot overflow T; fp32 absmax scales outside
// fp16's range would, with fp16 activations (as in mma.cu), so launch_rows takes this kernel for
// E4M4 scales only.
// No __launch_bounds__ minimum: an explicit minimum of 1 gives ptxas leave to take more registers,
// and a minimum of 2 ("lean") was slower (NOTES.md v70, v71).
template <typename T, int K_BITS, int GR, int WG, int U>
__global__ void __launch_bounds__(32 * GR * WG) gemv_tc_kernel(
    const T* __restrict__ x, int64_t ldx, const int32_t* __restrict__ packed, const void* __restrict__ absmax,
    int absmax_format, const float* __restrict__ codebook, int64_t N, int64_t K, int64_t KT,
    float shift_up, bool vec_x, const T* __restrict__ bias, T* __restrict__ out, int64_t ldo, int pdl) {
  static_assert(K_BITS >= 2 && K_BITS <= 4, "gemv_tc_kernel: k = 2..4");
  if (absmax_format != KBIT_ABSMAX_E4M4) __trap();  // launch_rows takes this kernel for E4M4 only
  extern __shared__ float4 rows_smem[];
  constexpr int kTileLen = 64 + 4;          // T values per staged k-tile (4 of padding)
  constexpr int kPairs = 1 << (K_BITS - 1);  // codebook entries as T pairs
  constexpr int kTab = 1 << (K_BITS - 2);    // byte-table registers (4 entries each)
  T* xs = reinterpret_cast<T*>(rows_smem);
  float* red = reinterpret_cast<float*>(xs + KT * kTileLen);  // GR * WG * 8 partial sums
  constexpr int P = WG * 8;                                   // phases per row group
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int group = warp / WG, wig = warp - group * WG;
  const int g = lane >> 2, c = lane & 3;
  const int64_t n = (int64_t(blockIdx.x) * GR + group) * 8 + g;
  const int64_t warp_phase = wig * 8, phase0 = warp_phase + c;  // part p: phase0 + 4p
  const bool row_ok = n < N;
  const bool early = pdl > 1;
  if (pdl > 0 && !early) pdl_wait();
  // the codebook x 16 as T pairs (entries 2i, 2i + 1): times the scales / 16 of
  // e4m4_pair_div16, the same products as T(codebook) x T(scale) (powers of two; codebook entries
  // are in [-1, 1]), except for fp16 entries below 2^-14 in magnitude, which T(16 x entry) keeps
  // more exactly than fp16's subnormals did (review, session 63)
  uint32_t cb2[kPairs];
#pragma unroll
  for (int i = 0; i < kPairs; i++)
    cb2[i] = Pair<T>::pack(16.f * __ldg(codebook + 2 * i), 16.f * __ldg(codebook + 2 * i + 1));
  // k = 4: a symmetric codebook (entry 15 - i = -entry i, as the nf codebooks) takes the
  // magnitude table (8 entries, half the prmt work); any other the full 16-entry one
  bool sym = K_BITS == 4;
  if constexpr (K_BITS == 4) {
#pragma unroll
    for (int i = 0; i < 8; i++) sym = sym && __ldg(codebook + 15 - i) == -__ldg(codebook + i);
  }
  Tile<K_BITS> tile[U][2];
  auto load_round = [&](int64_t base) {
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (base + u * P >= KT) break;  // CTA-uniform: no warp has this unit
#pragma unroll
      for (int p = 0; p < 2; p++) {
        const int64_t kt = base + u * P + phase0 + 4 * p;
        const bool ok = row_ok && kt < KT;
        if (base + u * P + warp_phase + 4 * p >= KT) {  // no lane of this warp has it: zeros (scale 0)
#pragma unroll
          for (int h = 0; h < kTileBlocks; h++) {
#pragma unroll
            for (int b = 0; b < K_BITS; b++) tile[u][p].w[h][b] = 0u;
            tile[u][p].sbits[h] = 0u;
          }
          continue;
        }
        const int64_t blk = ok ? (kt * N + n) * kTileBlocks : 0;
#pragma unroll
        for (int h = 0; h < kTileBlocks; h++) {
          load_words<K_BITS, true>(tile[u][p].w[h], packed + (blk + h) * K_BITS);
          tile[u][p].sbits[h] = load_absmax_bits_if<true>(absmax, KBIT_ABSMAX_E4M4, blk + h, ok);
        }
      }
    }
  };
  // one block h of unit u's two tiles decoded up to the MMA operands: the transposed index words
  // (nibble j of t[p][r]: value 4j + r) and the byte tables of entries x block scale (lo / hi bytes)
  struct Dec {
    uint32_t t[2][4], lo[2][kTab], hi[2][kTab];
  };
  // kSym (k = 4, symmetric codebook): 8 magnitudes + a sign
  auto prep = [&](auto sym_tag, int u, int h, Dec& d) {
    constexpr bool kSym = decltype(sym_tag)::value;
    constexpr int kT = kSym ? 2 : kTab;  // byte-table registers per tile (4 entries each)
#pragma unroll
    for (int p = 0; p < 2; p++) {
      const uint32_t w3 = K_BITS > 3 ? tile[u][p].w[h][K_BITS - 1] : 0u;
      d.t[p][0] = tile[u][p].w[h][0];
      d.t[p][1] = tile[u][p].w[h][1];
      d.t[p][2] = K_BITS > 2 ? tile[u][p].w[h][K_BITS > 2 ? 2 : 0] : 0u;
      d.t[p][3] = w3;
      if constexpr (kSym) {  // index i >= 8: magnitude i - 8; i < 8: magnitude 7 - i, negative
#pragma unroll
        for (int b = 0; b < 3; b++) d.t[p][b] = ~(d.t[p][b] ^ w3);
        d.t[p][3] = ~w3;
      }
      if constexpr (K_BITS == 2) {
        // two planes: z holds even values' indices as 2-bit fields (bits 2m, 2m + 1: value 2m),
        // zo the odd ones'; then t[r] = one 2-bit field per nibble (~10 instructions against the
        // 4 delta swaps' ~16; same words). H100 (NOTES.md v74): dense M = 1 k = 2 TOTAL 15.0 ->
        // 14.7 us over 2 rounds (the rounds' spread is ~0.3)
        const uint32_t w0 = d.t[p][0], w1 = d.t[p][1];
        const uint32_t z = (w0 & 0x55555555u) | ((w1 << 1) & 0xaaaaaaaau);
        const uint32_t zo = ((w0 >> 1) & 0x55555555u) | (w1 & 0xaaaaaaaau);
        d.t[p][0] = z & 0x33333333u;
        d.t[p][1] = zo & 0x33333333u;
        d.t[p][2] = (z >> 2) & 0x33333333u;
        d.t[p][3] = (zo >> 2) & 0x33333333u;
      } else {
        nibble_transpose(d.t[p][0], d.t[p][1], d.t[p][2], d.t[p][3]);  // nibble j of t[r]: value 4j + r
      }
      const uint32_t s2 = e4m4_pair_div16<T>(tile[u][p].sbits[h]);  // E4M4 only (launch_rows)
#pragma unroll
      for (int j = 0; j < kT; j++) {  // entries 4j .. 4j + 3 (kSym: 8 + 4j ..) x scale
        const int e = kSym ? 4 + 2 * j : 2 * j;
        const uint32_t e01 = mul2<T>(cb2[e], s2), e23 = mul2<T>(cb2[e + 1], s2);
        d.lo[p][j] = prmt(e01, e23, 0x6420u);
        d.hi[p][j] = prmt(e01, e23, 0x7531u);
      }
    }
  };
  auto run = [&](auto sym_tag, const Dec& d, const T* xq, int h, float (&ac)[4][4]) {
#pragma unroll
    for (int r = 0; r < 4; r++) {
      // k = 4: nibble bits 0-2 as selectors (m), bit 3 moved to bit 2 (n: the table half, or
      // kSym the sign), for both halves hf of the word at once
      uint32_t m[2], nb[2];
#pragma unroll
      for (int p = 0; p < 2; p++) {
        m[p] = K_BITS > 3 ? d.t[p][r] & 0x77777777u : d.t[p][r];
        nb[p] = K_BITS > 3 ? (d.t[p][r] >> 1) & 0x44444444u : 0u;
      }
#pragma unroll
      for (int hf = 0; hf < 2; hf++) {  // slice 4 hf + r: values 16 hf + r + 4 q, q = 0..3
        const uint2 xb = *reinterpret_cast<const uint2*>(xq + 32 * h + 16 * hf + 4 * r);
        uint32_t a[4];
#pragma unroll
        for (int p = 0; p < 2; p++) {
          const uint32_t ms = hf ? m[p] >> 16 : m[p];  // nibble q: value 16 hf + r + 4 q
          uint32_t lb, hb;
          if constexpr (K_BITS <= 3) {
            lb = prmt(d.lo[p][0], d.lo[p][kTab - 1], ms);  // k <= 3: never kSym
            hb = prmt(d.hi[p][0], d.hi[p][kTab - 1], ms);
          } else if constexpr (decltype(sym_tag)::value) {  // kSym
            const uint32_t neg = prmt(0u, 0x80808080u, hf ? nb[p] >> 16 : nb[p]);  // 0x80: negative
            lb = prmt(d.lo[p][0], d.lo[p][1], ms);
            hb = prmt(d.hi[p][0], d.hi[p][1], ms) ^ neg;  // XOR: any codebook with entry 15 - i = -entry i
          } else {
            const uint32_t half = (hf ? nb[p] >> 16 : nb[p]) | 0x3210u;  // entries 8..15: bytes 4..7
            lb = prmt(prmt(d.lo[p][0], d.lo[p][1], ms), prmt(d.lo[p][2], d.lo[p][3], ms), half);
            hb = prmt(prmt(d.hi[p][0], d.hi[p][1], ms), prmt(d.hi[p][2], d.hi[p][3], ms), half);
          }
          a[p] = prmt(lb, hb, 0x5140u);      // values q = 0, 1 (row g / g + 8)
          a[p + 2] = prmt(lb, hb, 0x7362u);  // values q = 2, 3
        }
        mma16816<T>(ac[2 * h + hf], a[0], a[1], a[2], a[3], xb.x, xb.y);
      }
    }
  };
  // kPre (k <= 3): unit 0 of the first round decoded (prep) while x is read; the other units where
  // they are used. H100 (v71): k = 2, 3 dense M = 1 TOTAL 19.0 -> 15.3, 23.8 -> 17.6 us against
  // decoding every unit where it is used. k = 4 keeps the plain order (its form is not the default).
  // Decoding unit 0 before the PDL wait instead (session 63, H100, v72: k = 2 +-0.1 us per shape,
  // k = 3 +0.2..+1.8 us with 20 more registers) was slower: x's read already hides it.
  constexpr bool kPre = K_BITS <= 3;
  Dec pre[kTileBlocks];  // unused where !kPre
  auto prep_unit0 = [&]() {
#pragma unroll
    for (int h = 0; h < kTileBlocks; h++) prep(std::false_type{}, 0, h, pre[h]);
  };
  load_round(0);
  if (early) pdl_wait();
  if (pdl == 2) pdl_trigger();
  // x -> T in shared memory (k-tile t at t * kTileLen), 8 values per thread and step, zeros past K
  auto x_load = [&](int64_t i) {
    uint4 v;
    if (vec_x && i + 8 <= K) {
      v = __ldg(reinterpret_cast<const uint4*>(x + i));
    } else {
      uint32_t e[8];
#pragma unroll
      for (int j = 0; j < 8; j++) e[j] = i + j < K ? __ldg(reinterpret_cast<const unsigned short*>(x + i + j)) : 0u;
      v = make_uint4(e[0] | e[1] << 16, e[2] | e[3] << 16, e[4] | e[5] << 16, e[6] | e[7] << 16);
    }
    return v;
  };
  auto x_store = [&](int64_t i, uint4 v) {
    // values 8 q8 + e (e = 0..7) of block (i & 63) / 32 to positions 16 hf + 4 r + q of its staged
    // block (value 16 hf + r + 4 q: hf = q8 / 2, r = e % 4, q = 2 (q8 % 2) + e / 4)
    const uint32_t wv[4] = {v.x, v.y, v.z, v.w};
    const int q8 = int(i & 31) >> 3;
    unsigned short* dst =
        reinterpret_cast<unsigned short*>(xs + (i >> 6) * kTileLen + (i & 32)) + 16 * (q8 >> 1) + 2 * (q8 & 1);
#pragma unroll
    for (int e = 0; e < 8; e++) dst[4 * (e & 3) + (e >> 2)] = (unsigned short)(wv[e >> 1] >> (16 * (e & 1)));
  };
  const int64_t x_step = int64_t(blockDim.x) * 8;
  int64_t xi = int64_t(threadIdx.x) * 8;
  if constexpr (kPre) {  // the first 2 steps of x requested before unit 0's decode
    uint4 xr[2];
#pragma unroll
    for (int st = 0; st < 2; st++)
      if (xi + st * x_step < KT * 64) xr[st] = x_load(xi + st * x_step);
    prep_unit0();
#pragma unroll
    for (int st = 0; st < 2; st++)
      if (xi + st * x_step < KT * 64) x_store(xi + st * x_step, xr[st]);
    xi += 2 * x_step;
  }
  for (; xi < KT * 64; xi += x_step) x_store(xi, x_load(xi));
  __syncthreads();
  // 4 accumulator sets (block h, half hf) shared by the units: chains of 4 U dependent MMAs. One set
  // per unit (16 registers more per extra unit) was slower at k = 3 (v71: 17.6 vs 16.7 us TOTAL).
  float acc[4][4];
#pragma unroll
  for (int ch = 0; ch < 4; ch++) acc[ch][0] = acc[ch][1] = acc[ch][2] = acc[ch][3] = 0.f;
  // one round of U units; kFirst: the first (its tiles loaded above; unit 0 prepped where kPre)
  auto do_round = [&](int64_t base, auto first_tag) {
    constexpr bool kFirst = decltype(first_tag)::value;
    if (!kFirst) load_round(base);
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (base + u * P >= KT) break;  // CTA-uniform
      // B column g of the MMAs: x of this lane's part g & 1 (columns 0, 1 matter)
      const int64_t ktx = base + u * P + phase0 + 4 * (g & 1);
      const T* xq = xs + (ktx < KT ? ktx : 0) * kTileLen;
#pragma unroll
      for (int h = 0; h < kTileBlocks; h++) {
        if (kPre && kFirst && u == 0) {
          run(std::false_type{}, pre[h], xq, h, acc);
          continue;
        }
        auto block = [&](auto sym_tag) {
          Dec d;
          prep(sym_tag, u, h, d);
          run(sym_tag, d, xq, h, acc);
        };
        if constexpr (K_BITS == 4) {
          if (sym) block(std::true_type{});
          else block(std::false_type{});
        } else {
          block(std::false_type{});
        }
      }
    }
  };
  // kPre: the first round peeled off the loop, so that unit 0's prepped registers end there
  int64_t base0 = 0;
  if constexpr (kPre) {
    do_round(0, std::true_type{});
    base0 = P * U;
  }
  for (int64_t base = base0; base < KT; base += P * U) do_round(base, std::false_type{});
  if (pdl == 1 || pdl == 3) pdl_trigger();
  // lane (g, 0): D[g][0] (kt0 parts) + D[g + 8][1] (kt1 parts) = row g over this warp's phases
  float d = 0.f;
#pragma unroll
  for (int ch = 0; ch < 4; ch++) d += acc[ch][0] + acc[ch][3];
  if (c == 0) red[warp * 8 + g] = d;
  __syncthreads();
  if (threadIdx.x < 8 * GR) {
    const int gg = threadIdx.x >> 3, r = threadIdx.x & 7;
    const int64_t row = (int64_t(blockIdx.x) * GR + gg) * 8 + r;
    float v = 0.f;
    for (int w = 0; w < WG; w++) v += red[(gg * WG + w) * 8 + r];
    if (row < N) out[row] = from_float<T>(v * shift_up + (bias != nullptr ? to_float(bias[row]) : 0.f));
  }
}

// gemv_rows_kernel's (rows per group, warps per CTA, row groups per CTA): forced by
// kbit_gemv_force_rows (tests, experiments; starts from KBIT_GEMV_ROWS="RL,W,GR", "RL,W" for one
// group, or "RL" for RL rows on 8 warps), rows -1 = never, 0 = automatic.
struct RowsChoice {
  int rl = 0, warps = 0, groups = 1;
};
// gemv_tc_kernel at M = 1, k = 2..4 where it applies: 1 = on for every k, 0 = off, other values a
// mask of k (bit k: 4 = k = 2, 8 = k = 3, 16 = k = 4; 12 = k = 2 and 3), from KBIT_GEMV_TC (default
// KBIT_GEMV_TC_DEFAULT); kbit_gemv_force_tc sets it (tests, experiments).
inline int& tc_mode() {
  static int v = env_int("KBIT_GEMV_TC", KBIT_GEMV_TC_DEFAULT);
  return v;
}
inline bool tc_on_for(int k) {
  const int v = tc_mode();
  return v == 1 || (v > 1 && ((v >> k) & 1) != 0);
}
// The pdl argument of the rows and tensor-core kernels: 0 = launched without PDL; 1 = wait at
// entry; 2 (stable weights): the codebook and the first tiles before the PDL wait, the trigger
// right after it; 3: the same loads, the trigger after the main loop. The environment variables
// KBIT_GEMV_EARLY=0 (pdl 1) and KBIT_GEMV_EARLY_TRIGGER=0 (pdl 3) are for A/Bs.
template <auto kernel>
int rows_pdl_mode(int device, bool stable) {
  static const bool early_ok = env_int("KBIT_GEMV_EARLY", 1) != 0;
  static const bool early_trigger = env_int("KBIT_GEMV_EARLY_TRIGGER", 1) != 0;
  return pdl_for<kernel>(device) > 0 ? (stable && early_ok ? (early_trigger ? 2 : 3) : 1) : 0;
}

inline RowsChoice& forced_rows() {
  static RowsChoice v = [] {
    RowsChoice c;
    if (const char* e = getenv("KBIT_GEMV_ROWS")) {
      const int n = sscanf(e, "%d,%d,%d", &c.rl, &c.warps, &c.groups);
      if (n < 1) c.rl = 0;
      else if (n == 1) c.warps = 8;
    }
    return c;
  }();
  return v;
}

// M = 1..4 through gemv_rows_kernel when it applies (x of M tokens fits the device's shared
// memory as fp32 with room for 2 CTAs per SM); returns false (nothing launched) otherwise.
template <typename T, int K_BITS, int M>
bool launch_rows(int device, cudaStream_t s, const T* x, int64_t ldx, const int32_t* packed, const void* absmax,
                 int fmt, const float* cb, int64_t N, int64_t K, int64_t KT, float shift_up, bool vec_x,
                 const T* bias, T* out, int64_t ldo, bool stable, cudaError_t& err) {
  RowsChoice c = forced_rows();
  if (c.rl < 0) return false;
  const DeviceInfo& dev = device_info(device);
  // M = 1 takes gemv_tc_kernel for this k (see below) where it is on and the scales are E4M4
  const bool tc_on = M == 1 && K_BITS <= 4 && tc_on_for(K_BITS) && fmt == KBIT_ABSMAX_E4M4;
  if (c.rl == 0) {
    const int64_t sms = dev.sms;
    if (M == 1 && ceil_div(N, 32) <= sms) {
      // M = 1 (session 53, NOTES.md v63): the fewest rows per CTA that keep the grid within one
      // CTA per SM, on 8 warps: 8 (KV), 16 (O, down), 32 (Q). The next call's grid then sits
      // beside this one (its trigger comes right after the PDL wait) one CTA per SM. H200,
      // back-to-back, k = 2..5 (rule of v31 -> this): O 4.41-5.25 -> 4.17-4.98 us, down k = 3, 4
      // -0.26, Q k = 4 3.98 -> 3.70 (k = 5 +0.06); KV unchanged.
      c = {ceil_div(N, 8) <= sms ? 8 : ceil_div(N, 16) <= sms ? 16 : 32, 8};
    } else if (M == 1 && ceil_div(N, 32) <= 2 * sms) {
      // M = 1, 32 rows per CTA would be 1-2 per SM (gateup): measured per k (session 53, H200
      // back-to-back, N = 5120; 16 x 4 / 16 x 8 / 32 x 8 us): k = 2 4.83 / 5.34 / 4.88, k = 3
      // 5.20 / 4.43 / 5.32, k = 4 5.30 / 5.67 / 4.90, k = 5 5.78 / 6.28 / 5.48. 16 x 8 wins
      // where its 2.4 CTAs per SM fit in one wave with room for part of the next grid (k = 3:
      // 80 registers, 3 per SM); at k = 4, 5 (104-128 registers, 2 per SM) it takes two waves.
      // Why k = 2 (4 per SM) prefers 16 x 4 is not understood.
      c = K_BITS == 2 ? RowsChoice{16, 4} : K_BITS == 3 ? RowsChoice{16, 8} : RowsChoice{32, 8};
      // k = 2, 4 where 40-row CTAs fit one per SM and K is one round of 4 tiles per lane
      // (KT <= 32): 5 groups of 8 rows on 10 warps (session 57, NOTES.md v67; H100 back-to-back,
      // gateup: k = 4 5.18 -> 4.19 us (mma 4.9), k = 2 4.05 -> 3.67; k = 3 4.54 -> 5.07 and k = 5
      // 5.62 -> 6.53 slower, not understood; 20 warps (4 per group) in between everywhere).
      // k = 3 on the tensor-core GEMV takes it too (session 65, NOTES.md v75): its (2, 4) form of
      // the 16 x 8 CTA has 96 registers, so 2 of its 2.4 CTAs per SM fit and the grid takes two
      // waves; H100 back-to-back, gateup k = 3: 3.85 -> 3.69 / 3.73 us (2 rounds)
      const bool tc3 = K_BITS == 3 && tc_on;
      if ((K_BITS == 2 || K_BITS == 4 || tc3) && ceil_div(N, 40) <= sms && KT <= 32) c = {8, 10, 5};
    } else if (ceil_div(N, 8) < 2 * sms) {
      // M = 2..4 (and M = 1 past 2 CTAs of 32 rows per SM: 16 x 4 below), from the H100 sweep of
      // NOTES.md v29, before the trigger after the wait: 8 x 8 where 16-row CTAs would be under
      // 2 per SM (KV, down, O), then 16 x 8, then 16 x 4 (gateup); benched as a rule in v31
      // (docs/bench_h100_v31.txt, M = 1) and taken for M = 2..4 in v53.
      c = {8, 8};
    } else {
      c = {16, ceil_div(N, 16) < 2 * sms ? 8 : 4};
    }
  }
  // M = 1 on tensor cores with byte-table lookups (gemv_tc_kernel; by default k = 2, 3, see
  // KBIT_GEMV_TC_DEFAULT; KBIT_GEMV_TC / kbit_gemv_force_tc) with the rows kernel's CTA as 8-row
  // groups: gateup 5 groups x 2 warps, Q 4 x 2, O 2 x 4, down 2 x 5 (80 k-tiles: 2 units of 2
  // tiles per lane), KV 1 x 4 (32 k-tiles: one unit per lane); other choices keep the rows
  // kernel. E4M4 scales only: codebook x scale is rounded to T, and fp32 absmax scales can fall
  // outside fp16's range (see gemv_tc_kernel); the rows kernel keeps the fp16 / fp32 formats.
  if constexpr (M == 1 && K_BITS <= 4) {
    const int gr = c.rl * c.groups / 8;
    int wg = gr > 0 ? c.warps / gr : 0;
    if (gr * wg != c.warps) wg = 0;
    if (gr == 2 && wg == 4 && KT % 32 != 0 && KT % 40 == 0) wg = 5;
    if (gr == 1 && KT <= 32) wg = 4;
    const int64_t units = wg > 0 ? ceil_div(KT, int64_t(wg) * 8) : 0;  // 2-tile units per lane
    const int64_t tc_smem = KT * (64 + 4) * 2 + int64_t(gr) * wg * 8 * 4;
    if (tc_on && wg > 0 && tc_smem <= 48 * 1024) {
      auto go_tc = [&](auto gr_tag, auto wg_tag, auto u_tag) {
        constexpr int GR = decltype(gr_tag)::value, WG = decltype(wg_tag)::value, U = decltype(u_tag)::value;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(unsigned(ceil_div(N, int64_t(8) * GR)));
        cfg.blockDim = dim3(GR * WG * 32);
        cfg.dynamicSmemBytes = size_t(tc_smem);
        cfg.stream = s;
        constexpr auto kernel = gemv_tc_kernel<T, K_BITS, GR, WG, U>;
        const int pdl = rows_pdl_mode<kernel>(device, stable);
        return launch_kernel(cfg, 1, 0, pdl, kernel, x, ldx, packed, absmax, fmt, cb, N, K, KT, shift_up, vec_x, bias,
                             out, ldo, pdl);
      };
      using I1 = std::integral_constant<int, 1>;
      using I2 = std::integral_constant<int, 2>;
      using I3 = std::integral_constant<int, 3>;
      using I4 = std::integral_constant<int, 4>;
      using I5 = std::integral_constant<int, 5>;
      using I8 = std::integral_constant<int, 8>;
      auto go_u = [&](auto gr_tag, auto wg_tag) {
        return units <= 1 ? go_tc(gr_tag, wg_tag, I1{}) : units == 2 ? go_tc(gr_tag, wg_tag, I2{}) : go_tc(gr_tag, wg_tag, I3{});
      };
      bool done = true;
      if (gr == 5 && wg == 2) err = go_u(I5{}, I2{});
      else if (gr == 4 && wg == 2) err = go_u(I4{}, I2{});
      else if (gr == 2 && wg == 4) err = go_u(I2{}, I4{});
      else if (gr == 2 && wg == 5) err = go_u(I2{}, I5{});
      else if (gr == 1 && wg == 4) err = go_u(I1{}, I4{});
      else if (gr == 1 && wg == 8) err = go_u(I1{}, I8{});
      else done = false;
      if (done) return true;
    }
  }
  // row groups: instantiated for M = 1 as 8 rows x 5 groups on 10 or 20 warps (2 or 4 per group)
  const bool grouped = c.groups != 1;
  if (grouped && (M != 1 || c.rl != 8 || c.groups != 5 || (c.warps != 10 && c.warps != 20))) return false;
  if (c.warps < 1 || (c.warps > 8 && !grouped) || (c.rl != 8 && c.rl != 16 && c.rl != 32)) return false;
  if (M > 1 && c.rl == 32) return false;  // not instantiated (tests force it at M = 1 only)
  const int64_t smem =
      (int64_t(pair_table_rows<K_BITS>()) * 32 + M * KT * (64 + x_pad<K_BITS>(c.rl)) + int64_t(c.warps) * c.rl * M) * 4;
  // M = 1 without the pair table: the default 48 KB (as measured in v29-v31); otherwise up to
  // half an SM's shared memory
  const int64_t limit = M == 1 && !pair_table_on<K_BITS>()
                            ? 48 * 1024
                            : std::min<int64_t>(dev.smem_optin, (dev.smem_per_sm - 2 * dev.smem_reserved) / 2);
  if (smem > limit) return false;
  // M = 1, 16 rows per CTA, k >= 3: 5 tiles per lane in one round where the k-tiles need exactly
  // 5 per phase (down: K = 5120, 80 k-tiles over 8 warps' 16 phases), instead of a second round
  // after the PDL wait (session 53, NOTES.md v63; H200 back-to-back, down: k = 3 6.5 -> 5.2 us,
  // k = 4 5.9 -> 5.0, k = 5 6.4 -> 5.5; k = 2 +0.15, so not there). KBIT_GEMV_U5=0 keeps rounds
  // of 4 (A/Bs).
  static const bool u5_ok = env_int("KBIT_GEMV_U5", 1) != 0;
  const bool u5 = M == 1 && K_BITS >= 3 && u5_ok && ceil_div(KT, int64_t(c.warps) * 2) == 5;
  auto go_groups = [&](auto rl_tag, auto u_tag, auto gr_tag, auto wg_tag) {
    constexpr int RL = decltype(rl_tag)::value, U = decltype(u_tag)::value;
    constexpr int GR = decltype(gr_tag)::value, WG = decltype(wg_tag)::value;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(unsigned(ceil_div(N, int64_t(RL) * GR)));
    cfg.blockDim = dim3(c.warps * 32);
    cfg.dynamicSmemBytes = size_t(smem);
    cfg.stream = s;
    constexpr auto kernel = gemv_rows_kernel<T, K_BITS, M, RL, U, GR, WG>;
    if (smem > 48 * 1024) {
      // x of M tokens as fp32 passes the default 48 KB at M * K > 12288 (M > 1 only: see limit)
      const cudaError_t e = smem_optin<kernel>(device, int(limit));
      if (e != cudaSuccess) return e;
    }
    const int pdl = rows_pdl_mode<kernel>(device, stable);
    return launch_kernel(cfg, 1, 0, pdl, kernel, x, ldx, packed, absmax, fmt, cb, N, K, KT, shift_up, vec_x, bias, out,
                         ldo, pdl);
  };
  auto go = [&](auto rl_tag, auto u_tag) {
    return go_groups(rl_tag, u_tag, std::integral_constant<int, 1>{}, std::integral_constant<int, 0>{});
  };
  using U4 = std::integral_constant<int, 4>;
  if constexpr (M == 1) {
    if (grouped) {
      using R8 = std::integral_constant<int, 8>;
      using G5 = std::integral_constant<int, 5>;
      if (c.warps == 10) err = go_groups(R8{}, U4{}, G5{}, std::integral_constant<int, 2>{});
      else err = go_groups(R8{}, U4{}, G5{}, std::integral_constant<int, 4>{});
      return true;
    }
  }
  if (c.rl == 8) err = go(std::integral_constant<int, 8>{}, U4{});
  else if constexpr (M == 1) {
    if (c.rl == 16) {
      if constexpr (K_BITS >= 3) {  // U = 5 is instantiated for k >= 3 only (u5 is false below)
        if (u5) err = go(std::integral_constant<int, 16>{}, std::integral_constant<int, 5>{});
        else err = go(std::integral_constant<int, 16>{}, U4{});
      } else {
        err = go(std::integral_constant<int, 16>{}, U4{});
      }
    } else {
      err = go(std::integral_constant<int, 32>{}, U4{});
    }
  } else {
    err = go(std::integral_constant<int, 16>{}, U4{});
  }
  return true;
}

template <typename T, int K_BITS, int M>
cudaError_t launch(int device, cudaStream_t s, const void* x, int64_t ldx, const int32_t* packed,
                   const void* absmax, int fmt, const float* cb, int64_t N, int64_t K,
                   int exponent, const void* bias, void* out, int64_t ldo, bool stable) {
  const int64_t KT = ceil_div(ceil_div(K, kBlock), kTileBlocks);
  // 16-byte loads of x where every row is 16-byte aligned (M = 1: one row, any stride)
  const bool vec_x = (M == 1 || ldx % 8 == 0) && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const T* xt = static_cast<const T*>(x);
  const T* bt = static_cast<const T*>(bias);
  const float shift_up = ldexpf(1.f, exponent);
  // Rounds of 2 tiles per lane (K <= 4096 in one round); at M = 1 2 rows per warp where the
  // rows are many (each lane's x block then serves both rows; at M > 1 the registers would not
  // allow 4 CTAs per SM). Rounds of 4 tiles made the object ~14 MB (every round unrolled).
  const int64_t per_lane = ceil_div(KT, 32);
  auto go = [&](auto r_tag, auto u_tag) {
    constexpr int R = decltype(r_tag)::value, U = decltype(u_tag)::value;
    constexpr auto kernel = gemv_kernel<T, K_BITS, M, R, U>;
    const int pdl = pdl_for<kernel>(device);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(unsigned(ceil_div(N, int64_t(kWarps) * R)));
    cfg.blockDim = dim3(kWarps * 32);
    cfg.stream = s;
    return launch_kernel(cfg, 1, 0, pdl, kernel, xt, ldx, packed, absmax, fmt, cb, N, K, KT, shift_up, vec_x, bt,
                         static_cast<T*>(out), ldo, pdl);
  };
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, 2>;
  cudaError_t err = cudaSuccess;
  if (launch_rows<T, K_BITS, M>(device, s, xt, ldx, packed, absmax, fmt, cb, N, K, KT, shift_up, vec_x, bt,
                                static_cast<T*>(out), ldo, stable, err))
    return err;
  if constexpr (M == 1) {
    if (N >= 2048 && per_lane <= 2) return go(Two{}, Two{});
  }
  return go(One{}, Two{});
}

template <typename T, int K_BITS>
cudaError_t launch_m(int m, int device, cudaStream_t s, const void* x, int64_t ldx, const int32_t* p,
                     const void* a, int fmt, const float* cb, int64_t N, int64_t K, int e,
                     const void* bias, void* out, int64_t ldo, bool stable) {
  switch (m) {
    case 1: return launch<T, K_BITS, 1>(device, s, x, ldx, p, a, fmt, cb, N, K, e, bias, out, ldo, stable);
    case 2: return launch<T, K_BITS, 2>(device, s, x, ldx, p, a, fmt, cb, N, K, e, bias, out, ldo, stable);
    case 3: return launch<T, K_BITS, 3>(device, s, x, ldx, p, a, fmt, cb, N, K, e, bias, out, ldo, stable);
    case 4: return launch<T, K_BITS, 4>(device, s, x, ldx, p, a, fmt, cb, N, K, e, bias, out, ldo, stable);
  }
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t launch_k(int k, int m, int device, cudaStream_t s, const void* x, int64_t ldx, const int32_t* p,
                     const void* a, int fmt, const float* cb, int64_t N, int64_t K, int e,
                     const void* bias, void* out, int64_t ldo, bool stable) {
  switch (k) {
    case 2: return launch_m<T, 2>(m, device, s, x, ldx, p, a, fmt, cb, N, K, e, bias, out, ldo, stable);
    case 3: return launch_m<T, 3>(m, device, s, x, ldx, p, a, fmt, cb, N, K, e, bias, out, ldo, stable);
    case 4: return launch_m<T, 4>(m, device, s, x, ldx, p, a, fmt, cb, N, K, e, bias, out, ldo, stable);
    case 5: return launch_m<T, 5>(m, device, s, x, ldx, p, a, fmt, cb, N, K, e, bias, out, ldo, stable);
  }
  return cudaErrorInvalidValue;
}

}  // namespace
}  // namespace kbit

extern "C" void kbit_gemv_force_rows(int rows, int warps, int groups) {
  kbit::forced_rows() = {rows, warps, groups};
}

// on < 0: back to KBIT_GEMV_TC (or the build's default), so a test that forces the form leaves an
// environment-selected mode in place for the tests after it
extern "C" void kbit_gemv_force_tc(int on) {
  kbit::tc_mode() = on < 0 ? kbit::env_int("KBIT_GEMV_TC", KBIT_GEMV_TC_DEFAULT) : on;
}

extern "C" int kbit_gemv(int device, void* stream, const void* x, int dtype, int64_t M,
                         int64_t ldx, const int32_t* packed, const void* absmax,
                         int absmax_format, const float* codebook, int k, int64_t N, int64_t K,
                         int absmax_exponent, const void* bias, void* out, int64_t ldo, int flags) {
  using namespace kbit;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  return small_m_entry(device, dtype, M, N, 4, [&](auto t) {
    return launch_k<decltype(t)>(k, int(M), device, s, x, ldx, packed, absmax, absmax_format, codebook, N, K,
                                 absmax_exponent, bias, out, ldo, (flags & KBIT_WEIGHTS_STABLE) != 0);
  });
}
