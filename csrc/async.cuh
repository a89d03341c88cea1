// mbarriers and bulk asynchronous copies (the TMA unit, sm_90+) shared by csrc/mma.cu and
// csrc/wgmma.cu; shared addresses as 32-bit values.
#pragma once
#include <stdint.h>

namespace kbit {

// Compiled for older targets they trap: the launchers only run kernels using them when the
// kernel's binary is sm_90+ (common.cuh: has_sm90_code, wgmma.cu: wgmma_capable).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define KBIT_BULK_ASM(...) asm volatile(__VA_ARGS__)
#else
#define KBIT_BULK_ASM(...) __trap()
#endif
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  KBIT_BULK_ASM("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_fence_init() {
  KBIT_BULK_ASM("fence.mbarrier_init.release.cluster;" ::: "memory");
  KBIT_BULK_ASM("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  KBIT_BULK_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  KBIT_BULK_ASM("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  KBIT_BULK_ASM(
      "{\n .reg .pred p;\n"
      "WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra WAIT_%=;\n}" ::"r"(bar),
      "r"(parity) : "memory");
}
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  KBIT_BULK_ASM("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// Bring a tensor map (a __grid_constant__ kernel parameter) into the descriptor cache ahead of
// its first tensor copy.
__device__ __forceinline__ void prefetch_tensormap(const void* map) {
  KBIT_BULK_ASM("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// An L2 eviction policy for bulk copies (createpolicy): evict-first for data a call reads once
// (the weights), so streaming them does not push x, the codebook or the code out of L2.
__device__ __forceinline__ uint64_t l2_policy(bool evict_first) {
  uint64_t p = 0;
  if (evict_first) KBIT_BULK_ASM("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  else KBIT_BULK_ASM("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
  return p;
}
__device__ __forceinline__ void bulk_copy_hint(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                               uint64_t policy) {
  KBIT_BULK_ASM(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy) : "memory");
}

}  // namespace kbit
