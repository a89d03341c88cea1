// pdl_copy_probe: does a PDL-launched kernel that issues bulk copies (the TMA unit) before its
// griddepcontrol.wait slow the kernel before it? (NOTES.md v58 items 2, 6: wgmma's first
// weights by bulk copies before the wait made every call 0.3-0.9 us slower; register loads
// before it did not.) Build and run on the device:
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -Icsrc scripts/pdl_copy_probe.cu -o pcp && ./pcp
// Every call is the same copy-bound kernel, back to back in a CUDA graph (scripts/graph_timing.h,
// sources rotated past L2): one CTA per SM, each streams `steps` bulk copies of 4 KB through a
// ring of 4 stages (one mbarrier each; the consumers wait and read one word per stage). Before
// that, right after griddepcontrol.launch_dependents, the CTA takes its first `early` stages'
// data in one of three ways:
//   late : after griddepcontrol.wait, like every other step (the baseline)
//   bulk : bulk copies issued before the wait (what wgmma did in v58 item 2)
//   regs : 16-byte register loads of the same bytes before the wait (mma's early weights),
//          stored to the stage after it
// Two shared-memory sizes: "alone" (over half an SM's shared memory: the next call's CTA
// cannot share an SM with this call's, it starts where one has left) and "shared" (two fit:
// the next call's CTAs start beside this call's running ones as soon as they trigger). The
// hypothesis of v58 item 6 predicts bulk slower than late in "shared" only.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "async.cuh"
#include "common.cuh"
#include "../scripts/graph_timing.h"

using namespace kbit;

constexpr int kStages = 4, kChunk = 4096, kThreads = 128;
enum Mode { kLate = 0, kBulk = 1, kRegs = 2 };

__global__ void __launch_bounds__(kThreads) copy_kernel(const char* __restrict__ src, int steps, int early, int mode,
                                                       uint32_t* __restrict__ out) {
  extern __shared__ __align__(1024) char smem[];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t bars = base + kStages * kChunk;  // full barriers, 8 bytes each
  const char* my = src + size_t(blockIdx.x) * steps * kChunk;
  const int tid = threadIdx.x;
  pdl_trigger();
  if (tid == 0) {
    for (int s = 0; s < kStages; s++) mbar_init(bars + 8 * s, 1);
    mbar_fence_init();
  }
  __syncthreads();
  early = early < kStages ? early : kStages;
  uint4 r[kStages][kChunk / 16 / kThreads];  // regs mode: this thread's share of the early stages
  if (mode == kBulk && tid == 0) {
    for (int s = 0; s < early; s++) {
      mbar_expect_tx(bars + 8 * s, kChunk);
      bulk_copy(base + s * kChunk, my + size_t(s) * kChunk, kChunk, bars + 8 * s);
    }
  }
  if (mode == kRegs) {
#pragma unroll
    for (int s = 0; s < kStages; s++)
#pragma unroll
      for (int i = 0; i < kChunk / 16 / kThreads; i++)
        if (s < early) r[s][i] = __ldg(reinterpret_cast<const uint4*>(my + size_t(s) * kChunk) + i * kThreads + tid);
  }
  pdl_wait();
  if (mode == kRegs) {
#pragma unroll
    for (int s = 0; s < kStages; s++)
#pragma unroll
      for (int i = 0; i < kChunk / 16 / kThreads; i++)
        if (s < early) reinterpret_cast<uint4*>(smem + s * kChunk)[i * kThreads + tid] = r[s][i];
    __syncthreads();
    if (tid == 0)
      for (int s = 0; s < early; s++) mbar_arrive(bars + 8 * s);  // the stage is there: phase 0 done
  }
  const int pre = mode == kLate ? 0 : early;  // steps whose data is already asked for
  if (tid == 0) {
    for (int s = pre; s < kStages && s < steps; s++) {
      if (mode == kRegs && s < early) continue;
      mbar_expect_tx(bars + 8 * s, kChunk);
      bulk_copy(base + s * kChunk, my + size_t(s) * kChunk, kChunk, bars + 8 * s);
    }
  }
  uint32_t acc = 0;
  for (int step = 0; step < steps; step++) {
    const int s = step % kStages;
    mbar_wait(bars + 8 * s, (step / kStages) & 1);
    acc ^= reinterpret_cast<const uint32_t*>(smem + s * kChunk)[tid];
    __syncthreads();  // every thread has read stage s
    if (tid == 0 && step + kStages < steps) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // reads before the copy's writes
      mbar_expect_tx(bars + 8 * s, kChunk);
      bulk_copy(base + s * kChunk, my + size_t(step + kStages) * kChunk, kChunk, bars + 8 * s);
    }
  }
  out[blockIdx.x * kThreads + tid] = acc;
}

int main() {
  int sms, optin;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  CK(cudaFuncSetAttribute(copy_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
  const int steps = 32;  // 128 KB per CTA, ~17 MB per call
  const size_t call_bytes = size_t(sms) * steps * kChunk, pool_bytes = size_t(512) << 20;
  char* pool;
  CK(cudaMalloc(&pool, pool_bytes));
  CK(cudaMemset(pool, 1, pool_bytes));
  uint32_t* out;
  CK(cudaMalloc(&out, size_t(sms) * kThreads * 4));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  const int nv = int(pool_bytes / call_bytes);
  // alone: more than half of the SM's shared memory; shared: two CTAs fit an SM
  const struct { const char* name; int smem; } fits[] = {{"alone", optin / 2 + 4096}, {"shared", 100 * 1024}};
  printf("device: %d SMs, opt-in shared memory %d bytes; %d copies of %d bytes per CTA, one CTA per SM\n", sms, optin,
         steps, kChunk);
  printf("| fit | early stages | late us | bulk us | regs us |\n|---|---|---|---|---|\n");
  for (const auto& f : fits) {
    for (int early : {0, 2, 4}) {
      float us[3];
      for (int mode = 0; mode < 3; mode++) {
        us[mode] = graph_us([&](int i, cudaStream_t s) {
          cudaLaunchConfig_t cfg = {};
          cfg.gridDim = dim3(unsigned(sms));
          cfg.blockDim = dim3(kThreads);
          cfg.dynamicSmemBytes = unsigned(f.smem);
          cfg.stream = s;
          // common.cuh's launcher: no cluster, PDL on
          CK(launch_kernel(cfg, 1, 0, 1, copy_kernel, static_cast<const char*>(pool + size_t(i) * call_bytes), steps,
                           early, mode, out));
        }, nv, st);
      }
      printf("| %s | %d | %.2f | %.2f | %.2f |\n", f.name, early, us[0], us[1], us[2]);
    }
  }
  return 0;
}
