// pdl_resident: what a second resident CTA per SM would buy mma at M = 1 under PDL (NOTES.md,
// next session item (a) of session 27). A model of mma's register-ring kernel, back-to-back in
// the `kbit bench` graph harness (weights rotated past L2):
//   - 512 threads, one CTA per SM of the grid (128 or 107 CTAs), triggers its dependents at entry;
//   - a prologue: a 64 KB shared table built from a codebook read from global memory
//     (4 x 16-byte stores per thread), then a barrier;
//   - each thread streams its share of the CTA's weight range with 16-byte loads, 2 in flight
//     (mma's ring depth at k = 4), and "decodes" each load with 8 table lookups;
//   - one word per thread written at the end.
// Variants: the CTA's dynamic shared memory (150 KB: one CTA per SM, as mma's 64 KB-aligned
// table forces; 100 KB: two fit, so the next call's CTA can be resident while this one runs)
// x where the prologue runs (after the PDL wait, or before it, the table built from values
// known without reading memory, as KBIT_MMA_SPEC_TABLE does) x what is asked of the weights
// before the wait (session 42): nothing; the CTA's whole range asked into L2 with per-line
// prefetches spread over all threads (safe: L2 is coherent with the previous kernel's writes);
// the first two loads of each thread straight into registers (timing only: unsafe where the
// previous kernel may write the weights). Timed back-to-back and after a 1-thread kernel
// launched without PDL (its time alone subtracted).
// Build and run on the device:
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -Icsrc scripts/pdl_resident.cu -o pr && ./pr
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "../scripts/graph_timing.h"

constexpr int kThreads = 512;
constexpr int kTableBytes = 64 * 1024;

__global__ void __launch_bounds__(kThreads) model_kernel(const uint4* __restrict__ w, size_t vec_per_cta,
                                                         const float* __restrict__ codebook, bool early,
                                                         int pre, uint32_t* __restrict__ out) {
  extern __shared__ __align__(16) char smem[];
  uint4* table = reinterpret_cast<uint4*>(smem);
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  auto build = [&](float cb) {
    const uint32_t v = __float_as_uint(cb) ^ threadIdx.x;
    for (int i = threadIdx.x; i < kTableBytes / 16; i += kThreads) table[i] = make_uint4(v, v + 1, v + 2, v + 3);
  };
  const uint4* p = w + blockIdx.x * vec_per_cta;
  size_t i = threadIdx.x;
  uint4 r0 = make_uint4(0, 0, 0, 0), r1 = r0;
  if (pre == 1)  // the CTA's range into L2, one 128-byte line per prefetch, all threads
    for (size_t l = threadIdx.x * 8; l < vec_per_cta; l += kThreads * 8)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(p + l));
  if (pre == 2) {  // the first two loads (below) before the wait
    if (i < vec_per_cta) r0 = __ldcs(p + i);
    if (i + kThreads < vec_per_cta) r1 = __ldcs(p + i + kThreads);
  }
  if (early) build(1.f);
  asm volatile("griddepcontrol.wait;" ::: "memory");
  // the first two loads before the table (mma's upfront item)
  if (pre != 2) {
    if (i < vec_per_cta) r0 = __ldcs(p + i);
    if (i + kThreads < vec_per_cta) r1 = __ldcs(p + i + kThreads);
  }
  if (!early) build(codebook[threadIdx.x & 15]);
  __syncthreads();
  const uint32_t* t32 = reinterpret_cast<const uint32_t*>(smem);
  uint32_t acc = 0;
  auto decode = [&](const uint4& v) {
    const uint32_t wv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
      acc += t32[((wv[j] & 0xff) << 6 | (threadIdx.x & 63))];
      acc ^= t32[(((wv[j] >> 8) & 0xff) << 6 | (threadIdx.x & 63))];
    }
  };
  for (; i < vec_per_cta; i += 2 * kThreads) {
    const uint4 a = r0, b = r1;
    const size_t n0 = i + 2 * kThreads, n1 = n0 + kThreads;
    r0 = n0 < vec_per_cta ? __ldcs(p + n0) : make_uint4(0, 0, 0, 0);
    r1 = n1 < vec_per_cta ? __ldcs(p + n1) : make_uint4(0, 0, 0, 0);
    decode(a);
    if (i + kThreads < vec_per_cta) decode(b);
  }
  out[blockIdx.x * kThreads + threadIdx.x] = acc;
}

__global__ void fill_kernel(uint32_t* out) { out[0] = 1u; }

void launch(cudaStream_t s, int ctas, const char* w, size_t per_cta, const float* cb, bool early, int pre,
            int smem, uint32_t* out) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(ctas));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = size_t(smem);
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CK(cudaLaunchKernelEx(&cfg, model_kernel, reinterpret_cast<const uint4*>(w), per_cta / 16, cb, early, pre, out));
}

int main() {
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaFuncSetAttribute(model_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 150 * 1024));
  const size_t pool_bytes = size_t(512) << 20;
  char* pool;
  CK(cudaMalloc(&pool, pool_bytes));
  CK(cudaMemset(pool, 1, pool_bytes));
  float* cb;
  CK(cudaMalloc(&cb, 64 * sizeof(float)));
  CK(cudaMemset(cb, 0, 64 * sizeof(float)));
  uint32_t* out;
  CK(cudaMalloc(&out, size_t(sms) * kThreads * 4));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  for (int smem : {150 * 1024, 100 * 1024}) {
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, model_kernel, kThreads, size_t(smem)));
    printf("dynamic shared memory %d KB: %d CTAs per SM can be resident\n", smem / 1024, per_sm);
  }
  // bytes: KV, Q, gateup at k = 4; CTAs: mma's grids (Q / O / down 128, gateup 107)
  const double mbs[] = {0.557, 4.46, 5.57};
  const char* pres[] = {"-", "L2 lines", "2 loads"};
  const float fill = graph_us([&](int, cudaStream_t s) { fill_kernel<<<1, 1, 0, s>>>(out); }, 1, st);
  printf("1-thread fill kernel alone: %.2f us\n", fill);
  printf("| MB | ctas | smem KB | prologue | before the wait | us back-to-back | GB/s | us after a fill |\n"
         "|---|---|---|---|---|---|---|---|\n");
  for (int rep = 0; rep < 2; rep++)
    for (double mb : mbs)
      for (int ctas : {128, 107}) {
        const size_t per_cta = (size_t(mb * 1e6 / ctas) + 511) / 512 * 512;
        const size_t bytes = per_cta * ctas;
        const int nv = 200;
        auto addr = [&](int i) { return pool + (size_t(i) * bytes) % (pool_bytes - bytes) / 256 * 256; };
        for (int smem : {150 * 1024, 100 * 1024})
          for (bool early : {false, true})
            for (int pre = 0; pre < 3; pre++) {
              const float us = graph_us(
                  [&](int i, cudaStream_t s) { launch(s, ctas, addr(i), per_cta, cb, early, pre, smem, out); }, nv, st);
              const float af = graph_us(
                  [&](int i, cudaStream_t s) {
                    fill_kernel<<<1, 1, 0, s>>>(out + 1);
                    launch(s, ctas, addr(i), per_cta, cb, early, pre, smem, out);
                  },
                  nv, st);
              printf("| %.2f | %d | %d | %s | %s | %.2f | %.0f | %.2f |\n", bytes / 1e6, ctas, smem / 1024,
                     early ? "before the wait" : "after the wait", pres[pre], us, bytes / (us * 1e3), af - fill);
            }
      }
  return 0;
}
