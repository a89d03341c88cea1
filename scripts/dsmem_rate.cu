// How fast can the CTAs of a cluster exchange an fp32 tile through distributed shared memory
// (DSMEM)? The split-K epilogue of csrc/wgmma.cu (CTA z of a cluster of CS adds tokens owned by
// z from every CTA's tile) spent ~8700 of ~38000 cycles of a gateup M = 256 call pulling 64 KB
// (NOTES.md v19); batching more loads per thread did not help. This harness times the same
// traffic in four ways, every SM busy (one cluster CTA per SM, as in the kernel):
//   0 pull: every slice, this CTA's included, by ld.shared::cluster.v4 (the kernel's loop;
//     B items in flight per thread)
//   1 pull: this CTA's slice by ld.shared, the others' by ld.shared::cluster.v4
//   2 push: st.async.v4 of the other CTAs' slices into their receive buffers (mbarrier
//     complete_tx), then wait for the own buffer
//   3 push: the same by bulk copies (cp.async.bulk.shared::cluster.shared::cta), one per
//     destination
// Build: nvcc -arch=sm_90a -O3 -std=c++17 -Icsrc scripts/dsmem_rate.cu -o dsmem_rate
// Run on the GPU: ./dsmem_rate [tile KB ...]   (prints cycles per CTA, median over the grid, and
// remote bytes per cycle per SM; CS = 2, 3, 4)
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>

#include "tc.cuh"  // cluster_sync, ld_cluster_f32x4, mbarriers (async.cuh)
#include "cuda_check.h"

using namespace kbit;

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_size() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t map_to(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ float4 ld_local(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr) : "memory");
  return v;
}

constexpr int kThreads = 256, kB = 4;

// smem: tile [bytes] | receive buffers [(CS - 1) * bytes / CS] | mbarrier
template <int MODE>
__global__ void __launch_bounds__(kThreads, 1) exchange(int bytes, long long* cycles, float* sink) {
  extern __shared__ __align__(1024) char smem[];
  const uint32_t cs = cluster_size(), z = cluster_rank(), tid = threadIdx.x;
  const uint32_t slice = uint32_t(bytes) / cs;  // a multiple of 16 (host)
  const uint32_t tile = smem_addr(smem), recv = tile + bytes, bar = recv + (cs - 1) * slice;
  float* t = reinterpret_cast<float*>(smem);
  for (int i = tid; i < bytes / 4; i += kThreads) t[i] = float(i % 97) + float(z);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the tile, for the bulk copies (mode 3)
  if (tid == 0) {
    mbar_init(bar, 1);
    mbar_fence_init();
    if (MODE >= 2) mbar_expect_tx(bar, (cs - 1) * slice);
  }
  cluster_sync();
  const long long t0 = clock64();
  float acc = 0.f;
  if (MODE <= 1) {
    // this CTA's slice of every rank's tile
    for (uint32_t off = tid * 16; off < slice; off += kThreads * 16 * kB) {
      float4 v[kB][4];
#pragma unroll
      for (int b = 0; b < kB; b++) {
        const uint32_t o = off + b * kThreads * 16;
        if (o >= slice) continue;
#pragma unroll
        for (uint32_t r = 0; r < 4; r++) {
          const uint32_t a = tile + z * slice + o;
          if (r < cs) v[b][r] = (MODE == 1 && r == z) ? ld_local(a) : ld_cluster_f32x4(a, r);
        }
      }
#pragma unroll
      for (int b = 0; b < kB; b++) {
        const uint32_t o = off + b * kThreads * 16;
        if (o >= slice) continue;
#pragma unroll
        for (uint32_t r = 0; r < 4; r++)
          if (r < cs) acc += v[b][r].x + v[b][r].y + v[b][r].z + v[b][r].w;
      }
    }
  } else {
    // slot of source s in destination d's receive buffers: (s - d - 1) mod cs
    for (uint32_t d = 0; d < cs; d++) {
      if (d == z) continue;
      const uint32_t src = tile + d * slice, dst = map_to(recv + ((z + cs - d - 1) % cs) * slice, d);
      const uint32_t rbar = map_to(bar, d);
      if (MODE == 2) {
        for (uint32_t off = tid * 16; off < slice; off += kThreads * 16) {
          const float4 v = ld_local(src + off);
          asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
                       ::"r"(dst + off), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(rbar) : "memory");
        }
      } else if (tid == d) {
        asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"(dst), "r"(src), "r"(slice), "r"(rbar) : "memory");
      }
    }
    mbar_wait(bar, 0);
    acc = reinterpret_cast<const float*>(smem + bytes)[tid];
  }
  asm volatile("" : "+f"(acc)::"memory");  // the sums (and so the loads) before the clock
  const long long t1 = clock64();
  cluster_sync();  // no CTA leaves while others read its tile
  if (tid == 0) cycles[blockIdx.x] = t1 - t0;
  if (acc == 12345.678f) sink[0] = acc;
}

int main(int argc, char** argv) {
  std::vector<int> kbs;
  for (int i = 1; i < argc; i++) kbs.push_back(atoi(argv[i]));
  if (kbs.empty()) kbs = {32, 64, 128};
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  long long* cycles;
  float* sink;
  CK(cudaMalloc(&cycles, 1024 * sizeof(long long)));
  CK(cudaMalloc(&sink, 16));
  const void* kernels[4] = {(const void*)exchange<0>, (const void*)exchange<1>, (const void*)exchange<2>,
                            (const void*)exchange<3>};
  const char* names[4] = {"pull (all by DSMEM)", "pull (own slice local)", "push st.async", "push bulk copy"};
  for (int k = 0; k < 4; k++)
    CK(cudaFuncSetAttribute(kernels[k], cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
  for (int kb : kbs)
    for (int cs = 2; cs <= 4; cs++) {
      const int bytes = kb * 1024 / (16 * cs) * (16 * cs);
      const size_t smem = std::max<size_t>(bytes + (cs - 1) * (bytes / cs) + 64, 120 * 1024);  // 1 CTA per SM
      if (smem > 227 * 1024) continue;
      const int grid = sms / cs * cs;
      for (int k = 0; k < 4; k++) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(grid);
        cfg.blockDim = dim3(kThreads);
        cfg.dynamicSmemBytes = smem;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = cs;
        attr[0].val.clusterDim.y = attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        std::vector<long long> c(grid);
        float ms = 0.f;
        for (int rep = 0; rep < 3; rep++) {
          CK(cudaEventRecord(e0));
          if (k == 0) CK(cudaLaunchKernelEx(&cfg, exchange<0>, bytes, cycles, sink));
          if (k == 1) CK(cudaLaunchKernelEx(&cfg, exchange<1>, bytes, cycles, sink));
          if (k == 2) CK(cudaLaunchKernelEx(&cfg, exchange<2>, bytes, cycles, sink));
          if (k == 3) CK(cudaLaunchKernelEx(&cfg, exchange<3>, bytes, cycles, sink));
          CK(cudaEventRecord(e1));
          CK(cudaDeviceSynchronize());
          CK(cudaEventElapsedTime(&ms, e0, e1));
        }
        CK(cudaMemcpy(c.data(), cycles, grid * sizeof(long long), cudaMemcpyDeviceToHost));
        std::sort(c.begin(), c.end());
        const double remote = double(bytes) / cs * (cs - 1);  // bytes each CTA receives from peers
        printf("tile %3d KB CS %d %-24s: median %6lld cycles (max %6lld), %5.1f remote B/cycle per SM | kernel %.1f us\n",
               kb, cs, names[k], c[grid / 2], c[grid - 1], remote / double(c[grid / 2]), ms * 1e3);
        CK(cudaEventDestroy(e0));
        CK(cudaEventDestroy(e1));
      }
    }
  return 0;
}
