// Helpers of the register decode (csrc/mma.cu, csrc/wgmma.cu): private per-lane codebook
// tables addressed by one PRMT, packed multiplies, shared loads, the block-scale pairs, and the
// cluster occupancy query and cluster operations of their split-K variants.
#pragma once
#include <stdint.h>

#include "async.cuh"
#include "common.cuh"

namespace kbit {

template <typename T>
__device__ __forceinline__ uint32_t mul2(uint32_t a, uint32_t b) {
  using P = typename Pair<T>::type;
  P r = __hmul2(*reinterpret_cast<P*>(&a), *reinterpret_cast<P*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}

// D += A (16 x 16, row) * B (16 x 8, col) in fp32, A and B in T (fp16 / bf16): mma.sync.m16n8k16.
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

// Shared address of the table entry for byte I of the index word n, in one PRMT: lane_base =
// the table's address (64 KB aligned: bytes 2, 3; or, wgmma.cu, only the shared window's high
// bytes, the table's offset then added by the load: lds32_at) | this lane's offset in a row
// (byte 0); the byte of indices becomes byte 1.
template <int I>
__device__ __forceinline__ uint32_t entry_addr(uint32_t n, uint32_t lane_base) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(n), "r"(lane_base), "n"(0x7604 | (I << 4)));
  return d;
}

// k = 5: shared address of the entry for byte I of the low-nibble word n and byte I of hi
// (its 2 high bits at bits 6-7): the low nibbles become byte 1, the high bits byte 0, OR-ed
// with lane_base (the table's 64 KB aligned address, or the window's as above | this lane's
// column * 4).
template <int I>
__device__ __forceinline__ uint32_t entry_addr5(uint32_t n, uint32_t hi, uint32_t lane_base) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(n), "r"(hi), "n"((I << 4) | (4 + I)));
  return (d & 0xffffu) | lane_base;
}

// k = 5, wgmma.cu's 128 KB table without bank conflicts: the shared address of the entry for
// byte I of the low-nibble word n, with the pair's high bits from q (bit 7 of byte I: the
// first value's, bit 0 of byte I + 1: the second's) -> hi1 << 16 | lo << 8 | hi0 << 7,
// OR-ed with lane_base (the window's high bytes | lane * 4).
template <int I>
__device__ __forceinline__ uint32_t entry_addr5w(uint32_t n, uint32_t q, uint32_t lane_base) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(n), "r"(q), "n"((4 + ((I + 1) & 3)) << 8 | I << 4 | (4 + I)));
  return (d & 0x1FF80u) | lane_base;
}

__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}
// The same at addr + OFF, OFF a compile-time shared address (the LDS's immediate offset).
template <uint32_t OFF>
__device__ __forceinline__ uint32_t lds32_at(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1+%2];" : "=r"(v) : "r"(addr), "n"(OFF));
  return v;
}

// E4M4 block scales as packed (scale, scale) pairs in T, one 4-byte entry per code (exact in
// fp16 and bf16: 4 mantissa bits, range 2^-14 .. 31): the shared-memory table scale_pair reads.
constexpr int kScalePairBytes = 256 * 4;
template <typename T>
__device__ __forceinline__ void fill_scale_pairs(uint32_t* table, int tid, int threads) {
  for (int i = tid; i < 256; i += threads) {
    const float f = e4m4_decode(uint32_t(i));
    table[i] = Pair<T>::pack(f, f);
  }
}

// The block scale as a packed pair in T (without the per-tensor power of two) from its stored
// bits in absmax format `fmt` (a compile-time constant in mma.cu): E4M4 codes index the table
// above (a plain load, which the compiler may schedule: an asm ld.shared here made mma 3-6%
// slower at M = 1, NOTES v12); fp16 and fp32 are converted.
template <typename T>
__device__ __forceinline__ uint32_t scale_pair(uint32_t bits, int fmt, const uint32_t* table) {
  if (fmt == KBIT_ABSMAX_E4M4) return table[bits];
  if (fmt == KBIT_ABSMAX_F16) {
    if constexpr (std::is_same<T, __half>::value) return bits | (bits << 16);
    const float f = __half2float(__ushort_as_half((unsigned short)bits));
    return Pair<T>::pack(f, f);
  }
  return Pair<T>::pack(__uint_as_float(bits), __uint_as_float(bits));
}

// Host: clusters of `size` CTAs of `kernel` (threads and dynamic shared memory bytes per CTA;
// the cluster along grid dimension `axis`, 0 = x .. 2 = z) that the current device runs at
// once (cudaOccupancyMaxActiveClusters), or 0 when none fit or the query fails; its error is
// cleared (not sticky: the next launch must not report it).
template <typename Kernel>
inline int clusters_at_once(Kernel kernel, unsigned threads, size_t smem, int size, int axis) {
  cudaLaunchAttribute attr[1] = {cluster_attribute(size, axis)};
  const auto& dim = attr[0].val.clusterDim;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(dim.x, dim.y, dim.z);  // one cluster
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
    (void)cudaGetLastError();
    n = 0;
  }
  return n > 0 ? n : 0;
}

// Thread-block clusters (sm_90+; wgmma.cu's split-K): a barrier over the cluster's CTAs whose
// shared-memory writes before it are visible to all of them after it, and loads from the
// shared memory of CTA `rank` at the address `addr` has in this CTA (4 or 16 bytes).
__device__ __forceinline__ void cluster_sync() {
  KBIT_BULK_ASM("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ uint32_t ld_cluster_u32(uint32_t addr, uint32_t rank) {
  uint32_t v = 0;
  KBIT_BULK_ASM("{\n .reg .b32 r;\n mapa.shared::cluster.u32 r, %1, %2;\n ld.shared::cluster.u32 %0, [r];\n}"
                : "=r"(v) : "r"(addr), "r"(rank) : "memory");
  return v;
}
__device__ __forceinline__ float4 ld_cluster_f32x4(uint32_t addr, uint32_t rank) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
  KBIT_BULK_ASM(
      "{\n .reg .b32 r;\n mapa.shared::cluster.u32 r, %4, %5;\n ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [r];\n}"
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr), "r"(rank) : "memory");
  return v;
}

}  // namespace kbit
