// mma: C[M, N] = x[M, K] @ W^T (+ bias) for M = 1..16 on tensor cores, W k-bit in the tiled64
// layout. The weights are decoded straight into mma.sync B fragments in registers; no
// dequantized tile ever goes through shared memory.
//
// One mma.sync.m16n8k16 multiplies A = x (16 tokens x 16 k, rows >= M are zero) by
// B = W^T (16 k x 8 weight rows). A lane (g = lane / 4, c = lane % 4) holds four B values of
// column g per MMA. A "step" of a warp is 8 weight rows x 128 k = 32 quantization blocks: lane
// (g, c) loads block c of row g (k-tile 2 * step + c / 2, block c % 2), decodes its 32 values
// and feeds them to 8 MMAs. The k order inside an MMA is free as long as x uses the same one,
// so each lane keeps the values of its own block and x is staged in shared memory in that
// permuted "fragment order" (one 8-byte load per lane per MMA, conflict-free).
//
// Decode (k = 2..4): the k bit-planes of a block are transposed in registers (delta swaps)
// into words whose nibbles (k = 3, 4) or 2-bit fields (k = 2) hold the indices of values
// r, r + 4, r + 8, ... (r = word); one shared-memory load then returns two codebook values as
// a packed pair (table indexed by a byte, or a nibble for k = 2), multiplied by the block
// scale with one packed multiply. The pair table is private per lane (entry e of lane L at
// word e * 32 + L), so the lookups of a warp never conflict. k = 5 looks up single values in
// a 32-entry float table. The block scale (E4M4 decoded, exact in fp16/bf16) multiplies the
// codebook value in the activation dtype; the per-tensor power of two multiplies the fp32
// accumulator at the end, so it cannot overflow or underflow the 16-bit weights.
//
// Work split: one CTA of 32 warps per SM (the codebook table and staged x are built once per
// SM); a CTA owns RG groups of 8 rows over all of K and its warps share its RG * steps items
// ("item" = one warp step) in contiguous runs; each warp issues the loads of its next kDepth
// items before it decodes one (register ring), so every lane has several sectors in flight
// from the start. Warps add their fp32 results into a shared accumulator when their row group
// changes and at the end; the CTA then writes C. RG = the fewest row groups per CTA that
// cover the grid in one wave.
#include "common.cuh"

namespace kbit {
namespace {

#ifndef KBIT_MMA_WARPS
#define KBIT_MMA_WARPS 32  // overridable for experiments (scripts/build_variant.sh)
#endif
constexpr int kWarpsPerCta = KBIT_MMA_WARPS;
constexpr int kThreadsPerCta = kWarpsPerCta * 32;
#ifndef KBIT_MMA_DEPTH
#define KBIT_MMA_DEPTH(k) ((k) >= 4 ? 3 : 4)
#endif
template <int K_BITS> constexpr int kDepth = KBIT_MMA_DEPTH(K_BITS);  // items in flight per warp (registers)
constexpr int kStepK = 128;                 // k values per step
constexpr int kXPad = 32;                   // halves of padding per staged x row (bank spread)
constexpr int kMaxXSmem = 136 * 1024;       // staged x larger than this: not handled here (+ 65 KB tables fits 227 KB)

template <typename T> struct Pair;
template <> struct Pair<__half> {
  using type = __half2;
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};
template <> struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};

template <typename T>
__device__ __forceinline__ uint32_t mul2(uint32_t a, uint32_t b) {
  using P = typename Pair<T>::type;
  P r = __hmul2(*reinterpret_cast<P*>(&a), *reinterpret_cast<P*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}

template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  if constexpr (sizeof(T) == 2 && std::is_same<T, __half>::value) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// Swap the bits of a at positions (mask << d) with the bits of b at positions mask.
__device__ __forceinline__ void delta_swap(uint32_t& a, uint32_t& b, int d, uint32_t mask) {
  const uint32_t t = ((a >> d) ^ b) & mask;
  b ^= t;
  a ^= t << d;
}

// x >> s for an s that may be negative (then a left shift); s is a constant after unrolling.
__device__ __forceinline__ uint32_t shr(uint32_t x, int s) { return s >= 0 ? x >> s : x << -s; }

// d = (a & mask) | c in one LOP3 (the compiler splits it in two when it cannot prove that c
// and mask do not overlap).
template <uint32_t MASK>
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "n"(MASK), "r"(c));
  return d;
}

// Position (0..31) inside the lane's block of the value that MMA s, slot u (0..3) uses:
// slots 0, 1 form B register 0 and slots 2, 3 register 1 (k = 2c, 2c + 1 and 2c + 8, 2c + 9
// of the MMA). It follows from the decode below; the x staging uses the same map.
template <int K_BITS>
__host__ __device__ constexpr int slot_position(int s, int u) {
  return K_BITS == 2 ? 8 * (s & 3) + (s >> 2) + 2 * u   // word r = s / 4, byte j = s % 4
                     : 16 * (s & 1) + (s >> 1) + 4 * u;  // word r = s / 2, byte pair h = s % 2
}

// Shared memory: codebook table, E4M4 scale table, staged x, accumulator.
// Codebook table, private per lane (entry e of lane L at (e * 32 + L) * entry bytes):
// k = 2: 256 entries of 4 values (a byte of 2-bit indices); k = 3, 4: 128 / 256 entries of
// 2 values (a byte of two nibbles); k = 5: the 32 codebook floats, shared.
template <int K_BITS>
__host__ __device__ constexpr int table_bytes() {
  return K_BITS == 2 ? 256 * 32 * 8 : K_BITS == 3 ? 128 * 32 * 4 : K_BITS == 4 ? 256 * 32 * 4 : 32 * 4;
}
constexpr int kScaleTableBytes = 256 * 4;  // E4M4 code -> packed (scale, scale)

// Block words + stored absmax of one item.
template <int K_BITS>
struct Item {
  uint32_t w[K_BITS];
  uint32_t scale_bits;
};

// Loads without a branch: an invalid item (row >= N or k-tile >= KT) reads block 0, which
// always exists, and is zeroed after (scale 0 in every absmax format).
template <int K_BITS, int FMT>
__device__ __forceinline__ void load_item(Item<K_BITS>& it, const int32_t* __restrict__ packed,
                                          const void* __restrict__ absmax, uint32_t block,
                                          bool valid) {
  const uint32_t blk = valid ? block : 0u;
  const int32_t* src = packed + blk * K_BITS;
  if constexpr (K_BITS == 4) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(src));
    it.w[0] = v.x; it.w[1] = v.y; it.w[2] = v.z; it.w[3] = v.w;
  } else if constexpr (K_BITS == 2) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(src));
    it.w[0] = v.x; it.w[1] = v.y;
  } else {
#pragma unroll
    for (int b = 0; b < K_BITS; b++) it.w[b] = uint32_t(__ldg(src + b));
  }
  if constexpr (FMT == KBIT_ABSMAX_E4M4) it.scale_bits = __ldg(static_cast<const uint8_t*>(absmax) + blk);
  else if constexpr (FMT == KBIT_ABSMAX_F16) it.scale_bits = __ldg(static_cast<const unsigned short*>(absmax) + blk);
  else it.scale_bits = __float_as_uint(__ldg(static_cast<const float*>(absmax) + blk));
#pragma unroll
  for (int b = 0; b < K_BITS; b++) it.w[b] = valid ? it.w[b] : 0u;
  it.scale_bits = valid ? it.scale_bits : 0u;
}

// The block scale as a packed pair in T (without the per-tensor power of two). E4M4 comes
// from the shared table (exact in fp16 and bf16: 4 mantissa bits, range 2^-14 .. 31).
template <typename T, int FMT>
__device__ __forceinline__ uint32_t scale_pair(uint32_t bits, const char* smem_scales) {
  if constexpr (FMT == KBIT_ABSMAX_E4M4) return *reinterpret_cast<const uint32_t*>(smem_scales + bits * 4);
  else if constexpr (FMT == KBIT_ABSMAX_F16 && std::is_same<T, __half>::value) return bits | (bits << 16);
  else if constexpr (FMT == KBIT_ABSMAX_F16) {
    const float f = __half2float(__ushort_as_half((unsigned short)bits));
    return Pair<T>::pack(f, f);
  } else {
    return Pair<T>::pack(__uint_as_float(bits), __uint_as_float(bits));
  }
}

// Decode one item into the 16 B registers of its 8 MMAs (b[2s], b[2s + 1] for MMA s).
// table: shared codebook table; lane_off: this lane's byte offset in it (0 for k = 5).
template <typename T, int K_BITS>
__device__ __forceinline__ void decode(const Item<K_BITS>& it, uint32_t s2, const char* table,
                                       uint32_t lane_off, uint32_t (&b)[16]) {
  if constexpr (K_BITS == 5) {
    const float scale = to_float(*reinterpret_cast<const T*>(&s2));
    uint32_t n0 = it.w[0], n1 = it.w[1], n2 = it.w[2], n3 = it.w[3];
    delta_swap(n0, n2, 2, 0x33333333u); delta_swap(n1, n3, 2, 0x33333333u);
    delta_swap(n0, n1, 1, 0x55555555u); delta_swap(n2, n3, 1, 0x55555555u);
    const uint32_t n[4] = {n0, n1, n2, n3};
    const float* cb = reinterpret_cast<const float*>(table);
#pragma unroll
    for (int s = 0; s < 8; s++) {
      const int r = s >> 1, h = s & 1;
      float v[4];
#pragma unroll
      for (int u = 0; u < 4; u++) {
        const int j = 4 * h + u;  // nibble of word r: value 4j + r of the block
        const uint32_t lo = (n[r] >> (4 * j)) & 15u;
        const uint32_t hi = (it.w[4] >> (4 * j + r)) & 1u;
        v[u] = cb[lo | (hi << 4)] * scale;
      }
      b[2 * s] = Pair<T>::pack(v[0], v[1]);
      b[2 * s + 1] = Pair<T>::pack(v[2], v[3]);
    }
  } else if constexpr (K_BITS == 2) {
    uint32_t n0 = it.w[0], n1 = it.w[1];
    delta_swap(n0, n1, 1, 0x55555555u);
    const uint32_t n[2] = {n0, n1};
    // byte j of word r: the 2-bit indices of values 8j + r + {0, 2, 4, 6}, one 8-byte entry
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const uint32_t off = and_or<0xff00u>(shr(n[r], 8 * j - 8), lane_off);  // entry * 256
        const uint2 q = *reinterpret_cast<const uint2*>(table + off);
        b[2 * (4 * r + j)] = mul2<T>(q.x, s2);
        b[2 * (4 * r + j) + 1] = mul2<T>(q.y, s2);
      }
  } else {
    uint32_t n0 = it.w[0], n1 = it.w[1], n2 = it.w[2], n3 = K_BITS == 4 ? it.w[3] : 0u;
    delta_swap(n0, n2, 2, 0x33333333u); delta_swap(n1, n3, 2, 0x33333333u);
    delta_swap(n0, n1, 1, 0x55555555u); delta_swap(n2, n3, 1, 0x55555555u);
    const uint32_t n[4] = {n0, n1, n2, n3};
    constexpr uint32_t mask = K_BITS == 4 ? 0x7f80u : 0x3f80u;
    // byte i of word r: the indices of values 8i + r (low nibble) and 8i + 4 + r
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const uint32_t off = and_or<mask>(shr(n[r], 8 * i - 7), lane_off);  // entry * 128
        const uint32_t pair = *reinterpret_cast<const uint32_t*>(table + off);
        // MMA s = 2r + i / 2 takes bytes i (even: register 0) and i + 1 (register 1)
        b[2 * (2 * r + (i >> 1)) + (i & 1)] = mul2<T>(pair, s2);
      }
  }
}

// Fragment order of staged x: slot u of MMA s of step t for lane c sits at
// ((t * 4 + s / 2) * 4 + c) * 8 + (s % 2) * 4 + u, so one 16-byte load gives a lane the A
// values of two MMAs. Rows are kXRowPad halves longer than the steps need (row stride = 64
// bytes mod 128: the 8-lane phases of a 16-byte load hit distinct banks).
__host__ __device__ constexpr int frag_index(int t, int s, int c) {
  return ((t * 4 + (s >> 1)) * 4 + c) * 8 + (s & 1) * 4;
}

template <typename T, int K_BITS, int FMT, bool M16>
__global__ void __launch_bounds__(kThreadsPerCta, 1) mma_kernel(
    const T* __restrict__ x, int64_t ldx, int M, const int32_t* __restrict__ packed,
    const void* __restrict__ absmax, const float* __restrict__ codebook, int N, int K, int KT,
    int steps, int rg_per_cta, int items_per_warp, float shift_up, bool vec_x,
    const T* __restrict__ bias, T* __restrict__ out, int64_t ldo) {
  extern __shared__ __align__(16) char smem[];
  const char* table = smem;
  char* scales = smem + table_bytes<K_BITS>();
  T* xs = reinterpret_cast<T*>(scales + kScaleTableBytes);
  const int x_row = steps * kStepK + kXPad;  // halves
  float* acc_s = reinterpret_cast<float*>(xs + size_t(M) * x_row);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int group0 = blockIdx.x * rg_per_cta;
  const int item0 = warp * items_per_warp;
  const int n_items = max(0, min(items_per_warp, rg_per_cta * steps - item0));

  // A cursor over this warp's items in (row group, step) order; one step advances the block
  // by 2 k-tiles (2 * N * 2 blocks), a new row group restarts from its first k-tile.
  struct Cursor {
    int rg, step;
    uint32_t block;  // tiled64 block index of this lane's block (the launcher checks < 2^31 words)
    bool row_ok;
  };
  const uint32_t step_blocks = uint32_t(4 * N);
  auto cursor_at = [&](int item) {
    Cursor cur;
    cur.rg = item / steps;
    cur.step = item - cur.rg * steps;
    const int n = (group0 + cur.rg) * 8 + g;
    cur.row_ok = n < N;
    cur.block = uint32_t(((2 * cur.step + (c >> 1)) * N + n) * kTileBlocks + (c & 1));
    return cur;
  };
  auto advance = [&](Cursor& cur) {
    if (++cur.step == steps) {
      cur.step = 0;
      cur.rg++;
      const int n = (group0 + cur.rg) * 8 + g;
      cur.row_ok = n < N;
      cur.block = uint32_t(((c >> 1) * N + n) * kTileBlocks + (c & 1));
    } else {
      cur.block += step_blocks;
    }
  };
  auto valid = [&](const Cursor& cur) { return cur.row_ok && 2 * cur.step + (c >> 1) < KT; };

  // 1. Put this warp's first kDepth items in flight before anything else.
  constexpr int D = kDepth<K_BITS>;
  Item<K_BITS> ring[D];
  Cursor load_cur = cursor_at(item0);
#pragma unroll
  for (int d = 0; d < D; d++) {
    load_item<K_BITS, FMT>(ring[d], packed, absmax, load_cur.block, d < n_items && valid(load_cur));
    advance(load_cur);
  }

  // 2. Tables, staged x, zeroed accumulator.
  constexpr int cmask = (1 << K_BITS) - 1;
  if constexpr (K_BITS == 5) {
    if (threadIdx.x < 32) reinterpret_cast<float*>(smem)[threadIdx.x] = codebook[threadIdx.x];
  } else if constexpr (K_BITS == 2) {
    for (int i = threadIdx.x; i < 256 * 16; i += kThreadsPerCta) {  // 2 lanes per 16-byte store
      const int e = i >> 4;
      const uint32_t lo = Pair<T>::pack(codebook[e & 3], codebook[(e >> 2) & 3]);
      const uint32_t hi = Pair<T>::pack(codebook[(e >> 4) & 3], codebook[(e >> 6) & 3]);
      reinterpret_cast<uint4*>(smem)[i] = make_uint4(lo, hi, lo, hi);
    }
  } else {
    constexpr int entries = table_bytes<K_BITS>() / 128;
    for (int i = threadIdx.x; i < entries * 8; i += kThreadsPerCta) {  // 4 lanes per store
      const int e = i >> 3;
      const uint32_t v = Pair<T>::pack(codebook[e & 15 & cmask], codebook[(e >> 4) & cmask]);
      reinterpret_cast<uint4*>(smem)[i] = make_uint4(v, v, v, v);
    }
  }
  if (FMT == KBIT_ABSMAX_E4M4 && threadIdx.x < 256) {
    const float sc = e4m4_decode(threadIdx.x);
    reinterpret_cast<uint32_t*>(scales)[threadIdx.x] = Pair<T>::pack(sc, sc);
  }
  {
    // unit (m, t, c, h): x[m][t * 128 + 32c + 16h + q], q = 0..15, goes to fragment slots.
    const int units = M * steps * 8;
    for (int unit = threadIdx.x; unit < units; unit += kThreadsPerCta) {
      const int m = unit / (steps * 8), rest = unit - m * steps * 8;
      const int t = rest >> 3, cc = (rest >> 1) & 3, h = rest & 1;
      const int k0 = t * kStepK + 32 * cc + 16 * h;
      T v[16];
      const T* src = x + m * ldx + k0;
      if (vec_x && k0 + 16 <= K) {
        const uint4 a = __ldg(reinterpret_cast<const uint4*>(src));
        const uint4 bq = __ldg(reinterpret_cast<const uint4*>(src) + 1);
        const T* pa = reinterpret_cast<const T*>(&a);
        const T* pb = reinterpret_cast<const T*>(&bq);
#pragma unroll
        for (int q = 0; q < 8; q++) { v[q] = pa[q]; v[q + 8] = pb[q]; }
      } else {
#pragma unroll
        for (int q = 0; q < 16; q++) v[q] = k0 + q < K ? src[q] : from_float<T>(0.f);
      }
      T* dst = xs + size_t(m) * x_row;
#pragma unroll
      for (int s = 0; s < 8; s++) {
        // MMA s slot u reads block position slot_position(s, u) = 16h' + q' (one h' per s)
        if ((slot_position<K_BITS>(s, 0) >> 4) != h) continue;
        T quad[4];
#pragma unroll
        for (int u = 0; u < 4; u++) quad[u] = v[slot_position<K_BITS>(s, u) & 15];
        *reinterpret_cast<uint2*>(dst + frag_index(t, s, cc)) = *reinterpret_cast<uint2*>(quad);
      }
    }
  }
  for (int i = threadIdx.x; i < rg_per_cta * M * 8; i += kThreadsPerCta) acc_s[i] = 0.f;
  __syncthreads();

  // 3. Main loop over this warp's items. Item i's slot is refilled with item i + D right
  // after i is decoded. Two accumulators halve the chain of dependent MMAs per item.
  const uint32_t lane_off = K_BITS == 5 ? 0u : uint32_t(lane) * (K_BITS == 2 ? 8u : 4u);
  const T* xa = xs + size_t(g) * x_row + frag_index(0, 0, c);  // A rows g and g + 8
  const bool a_lo = g < M, a_hi = M16 && g + 8 < M;
  float acc[2][4] = {};
  auto flush = [&](int rg) {
    float* dst = acc_s + (size_t(rg) * M) * 8 + 2 * c;
    if (a_lo) {
      atomicAdd(dst + g * 8, acc[0][0] + acc[1][0]);
      atomicAdd(dst + g * 8 + 1, acc[0][1] + acc[1][1]);
    }
    if (a_hi) {
      atomicAdd(dst + (g + 8) * 8, acc[0][2] + acc[1][2]);
      atomicAdd(dst + (g + 8) * 8 + 1, acc[0][3] + acc[1][3]);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) acc[0][i] = acc[1][i] = 0.f;
  };
  Cursor cur = cursor_at(item0);
  for (int base = 0; base < n_items; base += D) {
#pragma unroll
    for (int d = 0; d < D; d++) {
      if (base + d < n_items) {
        uint32_t bf[16];
        decode<T, K_BITS>(ring[d], scale_pair<T, FMT>(ring[d].scale_bits, scales), table, lane_off, bf);
        if (base + d + D < n_items) {
          load_item<K_BITS, FMT>(ring[d], packed, absmax, load_cur.block, valid(load_cur));
          advance(load_cur);
        }
        const T* xrow = xa + cur.step * kStepK;
#pragma unroll
        for (int p = 0; p < 4; p++) {
          uint4 lo = make_uint4(0u, 0u, 0u, 0u), hi = make_uint4(0u, 0u, 0u, 0u);
          if (a_lo) lo = *reinterpret_cast<const uint4*>(xrow + p * 32);
          if (a_hi) hi = *reinterpret_cast<const uint4*>(xrow + 8 * x_row + p * 32);
          mma16816<T>(acc[0], lo.x, hi.x, lo.y, hi.y, bf[4 * p], bf[4 * p + 1]);
          mma16816<T>(acc[1], lo.z, hi.z, lo.w, hi.w, bf[4 * p + 2], bf[4 * p + 3]);
        }
        const int rg = cur.rg;
        advance(cur);
        if (cur.rg != rg || base + d + 1 == n_items) flush(rg);
      }
    }
  }
  __syncthreads();

  // 4. Write C.
  for (int i = threadIdx.x; i < rg_per_cta * M * 8; i += kThreadsPerCta) {
    const int rg = i / (M * 8), rest = i - rg * M * 8, m = rest >> 3, row = rest & 7;
    const int n = (group0 + rg) * 8 + row;
    if (n < N) {
      float v = acc_s[i] * shift_up;
      if (bias != nullptr) v += to_float(bias[n]);
      out[m * ldo + n] = from_float<T>(v);
    }
  }
}

template <typename T, int K_BITS>
size_t smem_bytes(int M, int steps, int rg) {
  return table_bytes<K_BITS>() + kScaleTableBytes + size_t(M) * (steps * kStepK + kXPad) * sizeof(T) +
         size_t(rg) * M * 8 * sizeof(float);
}

template <typename T, int K_BITS, int FMT, bool M16>
cudaError_t launch(cudaStream_t s, const void* x, int64_t ldx, int M, const int32_t* packed,
                   const void* absmax, const float* cb, int64_t N, int64_t K, int exponent,
                   const void* bias, void* out, int64_t ldo) {
  const int64_t KT = ceil_div(ceil_div(K, kBlock), kTileBlocks);
  const int steps = int(ceil_div(KT, 2));
  const int64_t groups = ceil_div(N, 8);
  if (size_t(M) * (steps * kStepK + kXPad) * sizeof(T) > size_t(kMaxXSmem)) return cudaErrorInvalidValue;
  // 32-bit block indices and sizes inside the kernel
  if (KT * kTileBlocks * N * K_BITS >= (int64_t(1) << 31) || N >= (int64_t(1) << 30)) return cudaErrorInvalidValue;
  int device = 0;
  cudaGetDevice(&device);
  const DeviceInfo& dev = device_info(device);
  auto kernel = mma_kernel<T, K_BITS, FMT, M16>;
  // once per instantiation: the shared-memory opt-in
  static const cudaError_t attr_err = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dev.smem_optin);
  if (attr_err != cudaSuccess) return attr_err;
  // One CTA per SM: the fewest row groups per CTA that cover the rows in one wave.
  const int rg = int(ceil_div(groups, dev.sms));
  if (smem_bytes<T, K_BITS>(M, steps, rg) > size_t(dev.smem_optin)) return cudaErrorInvalidValue;
  const int items_per_warp = int(ceil_div(int64_t(rg) * steps, kWarpsPerCta));
  const bool vec_x = ldx % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  kernel<<<unsigned(ceil_div(groups, rg)), kThreadsPerCta, smem_bytes<T, K_BITS>(M, steps, rg), s>>>(
      static_cast<const T*>(x), ldx, M, packed, absmax, cb, int(N), int(K), int(KT), steps, rg,
      items_per_warp, ldexpf(1.f, exponent), vec_x, static_cast<const T*>(bias),
      static_cast<T*>(out), ldo);
  return cudaGetLastError();
}

template <typename T, int K_BITS, int FMT>
cudaError_t launch_m(int M, cudaStream_t s, const void* x, int64_t ldx, const int32_t* p,
                     const void* a, const float* cb, int64_t N, int64_t K, int e,
                     const void* bias, void* out, int64_t ldo) {
  if (M <= 8) return launch<T, K_BITS, FMT, false>(s, x, ldx, M, p, a, cb, N, K, e, bias, out, ldo);
  return launch<T, K_BITS, FMT, true>(s, x, ldx, M, p, a, cb, N, K, e, bias, out, ldo);
}

template <typename T, int K_BITS>
cudaError_t launch_fmt(int fmt, int M, cudaStream_t s, const void* x, int64_t ldx, const int32_t* p,
                       const void* a, const float* cb, int64_t N, int64_t K, int e,
                       const void* bias, void* out, int64_t ldo) {
  switch (fmt) {
    case KBIT_ABSMAX_E4M4: return launch_m<T, K_BITS, KBIT_ABSMAX_E4M4>(M, s, x, ldx, p, a, cb, N, K, e, bias, out, ldo);
    case KBIT_ABSMAX_F16: return launch_m<T, K_BITS, KBIT_ABSMAX_F16>(M, s, x, ldx, p, a, cb, N, K, e, bias, out, ldo);
    case KBIT_ABSMAX_F32: return launch_m<T, K_BITS, KBIT_ABSMAX_F32>(M, s, x, ldx, p, a, cb, N, K, e, bias, out, ldo);
  }
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t launch_k(int k, int fmt, int M, cudaStream_t s, const void* x, int64_t ldx,
                     const int32_t* p, const void* a, const float* cb, int64_t N, int64_t K,
                     int e, const void* bias, void* out, int64_t ldo) {
  switch (k) {
    case 2: return launch_fmt<T, 2>(fmt, M, s, x, ldx, p, a, cb, N, K, e, bias, out, ldo);
    case 3: return launch_fmt<T, 3>(fmt, M, s, x, ldx, p, a, cb, N, K, e, bias, out, ldo);
    case 4: return launch_fmt<T, 4>(fmt, M, s, x, ldx, p, a, cb, N, K, e, bias, out, ldo);
    case 5: return launch_fmt<T, 5>(fmt, M, s, x, ldx, p, a, cb, N, K, e, bias, out, ldo);
  }
  return cudaErrorInvalidValue;
}

}  // namespace
}  // namespace kbit

extern "C" int kbit_mma_max_x_bytes(void) { return kbit::kMaxXSmem; }

extern "C" int kbit_mma(int device, void* stream, const void* x, int dtype, int64_t M,
                        int64_t ldx, const int32_t* packed, const void* absmax, int absmax_format,
                        const float* codebook, int k, int64_t N, int64_t K, int absmax_exponent,
                        const void* bias, void* out, int64_t ldo) {
  using namespace kbit;
  DeviceGuard guard(device);
  if (guard.err != cudaSuccess) return guard.err;
  if (M == 0 || N == 0) return cudaSuccess;
  if (M > 16) return cudaErrorInvalidValue;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int m = int(M);
  switch (dtype) {
    case KBIT_F16: return launch_k<__half>(k, absmax_format, m, s, x, ldx, packed, absmax, codebook, N, K, absmax_exponent, bias, out, ldo);
    case KBIT_BF16: return launch_k<__nv_bfloat16>(k, absmax_format, m, s, x, ldx, packed, absmax, codebook, N, K, absmax_exponent, bias, out, ldo);
  }
  return cudaErrorInvalidValue;
}
