// How fast can a CTA hand an fp32 partial tile to another CTA through global memory (L2)? The
// question behind a stream-K wgmma (NOTES.md "Next session"): the cluster split-K moves its
// partials over distributed shared memory at 11-17 bytes per cycle per SM (scripts/dsmem_rate.cu);
// a persistent kernel would instead write a partial tile to a global workspace, publish a flag,
// and the tile's owner would read it back. Here every SM runs one CTA; CTA b writes its tile
// (each thread its own registers' floats, as float4 stores in a coalesced thread-major order),
// publishes it (__syncthreads, then thread 0: __threadfence + a flag store), waits for CTA
// (b + 1)'s flag and reads that CTA's tile (ld.global.cg, the same order), adding it into its
// registers. Cycles per CTA (clock64): the write + publish phase, the wait, the read phase.
// Build: nvcc -arch=sm_90a -O3 -std=c++17 -Iscripts scripts/l2_partials.cu -o l2_partials
// Run on the GPU: ./l2_partials   (tile 32, 64, 128 KB x 128, 256 threads; medians over the grid)
#include <cstdio>
#include <vector>
#include <algorithm>

#include "cuda_check.h"

template <int THREADS, int FLOATS>  // FLOATS per thread: the tile is THREADS * FLOATS * 4 bytes
__global__ void __launch_bounds__(THREADS, 1) exchange(float* work, unsigned* flags, unsigned epoch,
                                                       long long* cycles, float* sink) {
  float acc[FLOATS];
#pragma unroll
  for (int i = 0; i < FLOATS; i++) acc[i] = float(i * 7 + threadIdx.x) * 0.5f + float(blockIdx.x);
  const int b = blockIdx.x, peer = (b + 1) % gridDim.x;
  __syncthreads();
  const long long t0 = clock64();
  float4* mine = reinterpret_cast<float4*>(work + size_t(b) * THREADS * FLOATS);
#pragma unroll
  for (int i = 0; i < FLOATS / 4; i++)
    mine[i * THREADS + threadIdx.x] = make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]);
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flags + b), "r"(epoch) : "memory");
  }
  const long long t1 = clock64();
  if (threadIdx.x == 0) {
    unsigned f = 0;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(f) : "l"(flags + peer) : "memory");
    } while (f != epoch);
  }
  __syncthreads();
  const long long t2 = clock64();
  const float4* theirs = reinterpret_cast<const float4*>(work + size_t(peer) * THREADS * FLOATS);
#pragma unroll
  for (int i = 0; i < FLOATS / 4; i++) {
    const float4 v = __ldcg(theirs + i * THREADS + threadIdx.x);
    acc[4 * i] += v.x;
    acc[4 * i + 1] += v.y;
    acc[4 * i + 2] += v.z;
    acc[4 * i + 3] += v.w;
  }
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < FLOATS; i++) s += acc[i];
  asm volatile("" : "+f"(s)::"memory");
  const long long t3 = clock64();
  if (threadIdx.x == 0) {
    cycles[3 * b] = t1 - t0;
    cycles[3 * b + 1] = t2 - t1;
    cycles[3 * b + 2] = t3 - t2;
  }
  if (s == 12345.678f) sink[0] = s;
}

template <int THREADS, int FLOATS>
void run(int sms, float* work, unsigned* flags, long long* cycles, float* sink, unsigned& epoch) {
  const int kb = THREADS * FLOATS * 4 / 1024;
  std::vector<long long> c(3 * sms), w(sms), r(sms), wt(sms);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  float ms = 0.f;
  for (int rep = 0; rep < 5; rep++) {
    CK(cudaEventRecord(e0));
    exchange<THREADS, FLOATS><<<sms, THREADS>>>(work, flags, ++epoch, cycles, sink);
    CK(cudaGetLastError());
    CK(cudaEventRecord(e1));
    CK(cudaDeviceSynchronize());
    CK(cudaEventElapsedTime(&ms, e0, e1));
  }
  CK(cudaMemcpy(c.data(), cycles, c.size() * sizeof(long long), cudaMemcpyDeviceToHost));
  for (int i = 0; i < sms; i++) {
    w[i] = c[3 * i];
    wt[i] = c[3 * i + 1];
    r[i] = c[3 * i + 2];
  }
  std::sort(w.begin(), w.end());
  std::sort(wt.begin(), wt.end());
  std::sort(r.begin(), r.end());
  const double bytes = double(THREADS) * FLOATS * 4;
  printf("tile %3d KB, %3d threads: write+publish %6lld cycles (%5.1f B/cycle per SM, max %6lld), wait %6lld, "
         "read %6lld (%5.1f B/cycle, max %6lld) | kernel %.1f us\n",
         kb, THREADS, w[sms / 2], bytes / w[sms / 2], w[sms - 1], wt[sms / 2], r[sms / 2], bytes / r[sms / 2],
         r[sms - 1], ms * 1e3);
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float* work;
  unsigned* flags;
  long long* cycles;
  float* sink;
  CK(cudaMalloc(&work, size_t(sms) * 128 * 1024));
  CK(cudaMalloc(&flags, sms * sizeof(unsigned)));
  CK(cudaMemset(flags, 0, sms * sizeof(unsigned)));
  CK(cudaMalloc(&cycles, 3 * sms * sizeof(long long)));
  CK(cudaMalloc(&sink, 16));
  unsigned epoch = 0;
  run<128, 64>(sms, work, flags, cycles, sink, epoch);   // 32 KB
  run<128, 128>(sms, work, flags, cycles, sink, epoch);  // 64 KB: TN = 256, one warpgroup's accumulators
  run<256, 64>(sms, work, flags, cycles, sink, epoch);   // 64 KB
  run<256, 128>(sms, work, flags, cycles, sink, epoch);  // 128 KB
  return 0;
}
