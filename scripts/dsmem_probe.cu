// How fast can a CTA get B bytes that every CTA of the grid needs (mma's staged x, NOTES.md
// v46)? One CTA per SM (132 on the H100), clusters of 2, 512 threads; per CTA, the
// nanoseconds (globaltimer) from a cluster barrier to all bytes in shared memory:
//   l2     every CTA reads all B bytes of one global buffer (hot in L2) with 16-byte loads,
//          each thread load, store, load, store, ... (a chain);
//   half   every CTA reads half (rank r: half r) of it from L2 and stores it locally (the bound
//          of a free exchange);
//   st     half from L2 as `half`, each 16-byte piece also stored into the partner's shared
//          memory by st.async (8-byte pieces, completing the partner's mbarrier);
//   bulk   half from L2 as `half`, then one thread sends that half to the partner with one
//          cp.async.bulk shared::cta -> shared::cluster (completing the partner's mbarrier);
//   tma    every CTA copies all B bytes from global by bulk copies (16 KB each, one per thread);
//   mcast  every CTA copies its half by bulk copies multicast to both CTAs of the pair (L2
//          reads each byte once per pair);
//   l2x    as l2, each thread's loads (8 at a time) all in flight before its stores.
// Prints the median and the maximum over the CTAs per mode and size.
// Build and run (device, repo root; sm_90a for the multicast):
//   nvcc -gencode arch=compute_90a,code=sm_90a -O3 -I csrc -o /tmp/dsmem scripts/dsmem_probe.cu && /tmp/dsmem
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "tc.cuh"  // mbarriers, bulk copies (async.cuh), cluster_sync

using namespace kbit;

enum Mode { kL2, kHalf, kSt, kBulk, kTma, kMcast, kL2x, kModes };

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ uint32_t mapa(uint32_t a, uint32_t r) {
  uint32_t d;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(r));
  return d;
}

template <int MODE>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(512, 1) probe(const uint4* src, int bytes, uint64_t* out) {
  extern __shared__ __align__(128) char sm[];
  __shared__ __align__(8) uint64_t bar;
  uint32_t rank;
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  const uint32_t bar_sh = smem_addr(&bar), peer = rank ^ 1u;
  // the bytes this CTA brings from global itself, and whether its mbarrier waits for bytes
  constexpr bool kAll = MODE == kL2 || MODE == kTma || MODE == kL2x;
  constexpr bool kBar = MODE == kSt || MODE == kBulk || MODE == kTma || MODE == kMcast;
  const int half = bytes / 2, mine0 = kAll ? 0 : int(rank) * half, mine = kAll ? bytes : half;
  if (threadIdx.x == 0) {
    mbar_init(bar_sh, 1);
    mbar_expect_tx(bar_sh, MODE == kTma || MODE == kMcast ? bytes : kBar ? half : 0);
    mbar_fence_init();
  }
  cluster_sync();
  const uint64_t t0 = now_ns();
  const uint32_t peer_base = mapa(smem_addr(sm), peer), peer_bar = mapa(bar_sh, peer);
  if (MODE == kTma || MODE == kMcast) {
    const int chunk = 16384, n = (mine + chunk - 1) / chunk;
    if (int(threadIdx.x) < n) {
      const int off = mine0 + int(threadIdx.x) * chunk, len = min(chunk, mine0 + mine - off);
      const char* g = reinterpret_cast<const char*>(src) + off;
      if (MODE == kTma)
        bulk_copy(smem_addr(sm) + off, g, len, bar_sh);
      else
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], %4;" ::"r"(
                         smem_addr(sm) + off), "l"(g), "r"(len), "r"(bar_sh), "h"((unsigned short)3) : "memory");
    }
  }
  if (MODE == kL2x) {
    for (int i0 = threadIdx.x; i0 < mine / 16; i0 += 8 * blockDim.x) {
      uint4 v[8];
#pragma unroll
      for (int j = 0; j < 8; j++) {
        const int i = i0 + j * int(blockDim.x);
        if (i < mine / 16) v[j] = __ldcg(src + i);
      }
#pragma unroll
      for (int j = 0; j < 8; j++) {
        const int i = i0 + j * int(blockDim.x);
        if (i < mine / 16) reinterpret_cast<uint4*>(sm)[i] = v[j];
      }
    }
  }
  for (int i = threadIdx.x; (MODE == kL2 || MODE == kHalf || MODE == kSt || MODE == kBulk) && i < mine / 16;
       i += blockDim.x) {
    const int off = mine0 + 16 * i;
    const uint4 v = __ldcg(src + off / 16);
    *reinterpret_cast<uint4*>(sm + off) = v;
    if (MODE == kSt) {
      asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];" ::"r"(peer_base + off),
                   "r"(v.x), "r"(v.y), "r"(peer_bar) : "memory");
      asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];" ::"r"(peer_base + off + 8),
                   "r"(v.z), "r"(v.w), "r"(peer_bar) : "memory");
    }
  }
  if (MODE == kBulk) {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0)
      asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                       peer_base + mine0),
                   "r"(smem_addr(sm) + mine0), "r"(half), "r"(peer_bar) : "memory");
  }
  __syncthreads();
  if (kBar) mbar_wait(bar_sh, 0u);  // (a multicast lands in both CTAs: all bytes expected in each)
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = now_ns() - t0;
  cluster_sync();  // no CTA leaves while its partner may still write into it
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int grid = sms / 2 * 2;
  uint4* src;
  uint64_t* out;
  cudaMalloc(&src, 1 << 20);
  cudaMemset(src, 1, 1 << 20);
  cudaMalloc(&out, grid * sizeof(uint64_t));
  const char* names[kModes] = {"l2", "half", "st", "bulk", "tma", "mcast", "l2x"};
  void (*kernels[kModes])(const uint4*, int, uint64_t*) = {probe<kL2>,  probe<kHalf>,  probe<kSt>, probe<kBulk>,
                                                           probe<kTma>, probe<kMcast>, probe<kL2x>};
  for (int m = 0; m < kModes; m++) cudaFuncSetAttribute(kernels[m], cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  std::printf("grid %d CTAs (clusters of 2), ns from the cluster barrier to all bytes in shared memory: median / max over CTAs\n", grid);
  for (int bytes : {8192, 16384, 32768, 65536, 131072}) {
    std::printf("%7d B:", bytes);
    for (int m = 0; m < kModes; m++) {
      std::vector<uint64_t> best(grid, ~0ull), h(grid);
      for (int rep = 0; rep < 20; rep++) {
        kernels[m]<<<grid, 512, bytes>>>(src, bytes, out);
        cudaMemcpy(h.data(), out, grid * sizeof(uint64_t), cudaMemcpyDeviceToHost);
        std::sort(h.begin(), h.end());
        if (rep >= 2 && h[grid - 1] < best[grid - 1]) best = h;  // the repetition with the best max
      }
      std::printf("  %s %5llu / %5llu", names[m], (unsigned long long)best[grid / 2], (unsigned long long)best[grid - 1]);
    }
    std::printf("\n");
  }
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("%s\n", cudaGetErrorString(e));
  return e != cudaSuccess;
}
