// pdl_floor: what programmatic dependent launch (PDL) buys a small weight-streaming kernel in
// the `kbit bench` graph harness (back-to-back calls, weights rotated past L2). Build and run
// on the device:
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -Icsrc scripts/pdl_floor.cu -o pf && ./pf
// Each call streams S bytes (one range per CTA, 16-byte loads, 4 in flight per thread) and
// writes one word per thread. Modes:
//   plain   : launched as usual (the next call starts after this grid completes)
//   pdl     : launched with programmatic stream serialization; each CTA calls
//             griddepcontrol.launch_dependents first, then griddepcontrol.wait, then streams
//   pdl+pf  : as pdl, but the CTA first asks for its range in L2 (cp.async.bulk.prefetch.L2),
//             which is safe before the wait: L2 is the point of coherence, so a later load
//             after the wait still sees what the previous grid wrote
//   pdl+pf-notrig: as pdl+pf without launch_dependents (the trigger is then each CTA's exit)
// "after tiny": the same, with a plain 1-block kernel (a stand-in for a norm / activation
// kernel that knows nothing of PDL) before every call; the tiny kernel's own time is subtracted.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "../scripts/graph_timing.h"

enum Mode { kPlain = 0, kPdl = 1, kPdlPrefetch = 2, kPdlPrefetchNoTrigger = 3 };

__global__ void __launch_bounds__(512) stream_kernel(const uint4* __restrict__ w, size_t vec_per_cta, int mode,
                                                     uint32_t* __restrict__ out) {
  const uint4* p = w + blockIdx.x * vec_per_cta;
  if (mode >= kPdlPrefetch && threadIdx.x < 8) {
    // 8 lanes each ask for 1/8 of the range (16-byte multiples)
    const size_t bytes = vec_per_cta * 16, part = (bytes / 8 + 15) / 16 * 16;
    const size_t lo = threadIdx.x * part, n = lo < bytes ? (part < bytes - lo ? part : bytes - lo) : 0;
    if (n > 0)
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(reinterpret_cast<const char*>(p) + lo),
                   "r"(uint32_t(n))
                   : "memory");
  }
  if (mode == kPdl || mode == kPdlPrefetch) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (mode != kPlain) asm volatile("griddepcontrol.wait;" ::: "memory");
  uint32_t acc = 0;
  constexpr int U = 4;
  for (size_t i = threadIdx.x; i < vec_per_cta; i += size_t(blockDim.x) * U) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const size_t j = i + size_t(u) * blockDim.x;
      v[u] = j < vec_per_cta ? __ldcs(p + j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

__global__ void tiny(uint32_t* out) { out[threadIdx.x] = threadIdx.x; }

void launch_stream(cudaStream_t s, int ctas, const char* w, size_t per_cta, int mode, uint32_t* out) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(ctas));
  cfg.blockDim = dim3(512);
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = mode == kPlain ? 0 : 1;
  CK(cudaLaunchKernelEx(&cfg, stream_kernel, reinterpret_cast<const uint4*>(w), per_cta / 16, mode, out));
}

int main() {
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t pool_bytes = size_t(512) << 20;
  char* pool;
  CK(cudaMalloc(&pool, pool_bytes));
  CK(cudaMemset(pool, 1, pool_bytes));
  uint32_t *out, *out_tiny;
  CK(cudaMalloc(&out, size_t(sms) * 512 * 4));
  CK(cudaMalloc(&out_tiny, 1024 * 4));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  const float tiny_us = graph_us([&](int, cudaStream_t s) { tiny<<<1, 32, 0, s>>>(out_tiny); }, 1, st);
  printf("tiny kernel alone: %.2f us\n", tiny_us);
  const char* names[] = {"plain", "pdl", "pdl+pf", "pdl+pf-notrig"};
  // bytes: KV k=4, gateup k=2, Q k=4, gateup k=4, gateup fp16; CTAs: all SMs and 107 (gateup's)
  const double mbs[] = {0.557, 2.95, 4.46, 5.57, 21.0};
  printf("| MB | ctas | mode | us | GB/s | us after tiny (minus tiny) |\n|---|---|---|---|---|---|\n");
  for (double mb : mbs) {
    for (int ctas : {sms, 107}) {
      const size_t per_cta = (size_t(mb * 1e6 / ctas) + 511) / 512 * 512;
      const size_t bytes = per_cta * ctas;
      const int nv = int(std::min<size_t>(200, std::max<size_t>(20, (300u << 20) / bytes)));
      auto addr = [&](int i) { return pool + (size_t(i) * bytes) % (pool_bytes - bytes) / 256 * 256; };
      for (int mode = 0; mode < 4; mode++) {
        const float us = graph_us([&](int i, cudaStream_t s) { launch_stream(s, ctas, addr(i), per_cta, mode, out); },
                                  nv, st);
        const float pair = graph_us([&](int i, cudaStream_t s) {
          tiny<<<1, 32, 0, s>>>(out_tiny);
          launch_stream(s, ctas, addr(i), per_cta, mode, out);
        }, nv, st);
        printf("| %.2f | %d | %s | %.2f | %.0f | %.2f |\n", bytes / 1e6, ctas, names[mode], us, bytes / (us * 1e3),
               pair - tiny_us);
      }
    }
  }
  return 0;
}
