// Helpers of the register decode (csrc/mma.cu, csrc/wgmma.cu): private per-lane codebook
// tables addressed by one PRMT, packed multiplies, shared loads, and the cluster operations of
// their split-K epilogues.
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

// Shared address of the table entry for byte I of the index word n, in one PRMT: lane_base =
// the table's address (64 KB aligned: bytes 2, 3) | this lane's offset in a row (byte 0); the
// byte of indices becomes byte 1.
template <int I>
__device__ __forceinline__ uint32_t entry_addr(uint32_t n, uint32_t lane_base) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(n), "r"(lane_base), "n"(0x7604 | (I << 4)));
  return d;
}

// k = 5: shared address of the entry for byte I of the low-nibble word n and byte I of hi
// (its 2 high bits at bits 6-7): the low nibbles become byte 1, the high bits byte 0, OR-ed
// with lane_base (the table's 64 KB aligned address | this lane's column * 4).
template <int I>
__device__ __forceinline__ uint32_t entry_addr5(uint32_t n, uint32_t hi, uint32_t lane_base) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(n), "r"(hi), "n"((I << 4) | (4 + I)));
  return (d & 0xffffu) | lane_base;
}

__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}

// Thread-block clusters (sm_90+; the split-K variant): a barrier over the cluster's CTAs whose
// shared-memory writes before it are visible to all of them after it, and a load from the
// shared memory of CTA `rank` at the address `addr` has in this CTA (16 bytes).
__device__ __forceinline__ void cluster_sync() {
  KBIT_BULK_ASM("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ float4 ld_cluster_f32x4(uint32_t addr, uint32_t rank) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
  KBIT_BULK_ASM(
      "{\n .reg .b32 r;\n mapa.shared::cluster.u32 r, %4, %5;\n ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [r];\n}"
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr), "r"(rank) : "memory");
  return v;
}

}  // namespace kbit
