// Per-step timeline of one CTA of csrc/wgmma.cu (no Python): where does a 64-k step go?
// Build: nvcc -arch=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -Icsrc -DKBIT_HAS_SM90A scripts/wgmma_timeline.cu -o wtl
// Run on the GPU: ./wtl k M N K [TN WG splits (-1: stream-K) [k5 table: 1 narrow, 2 wide]]   (thread 0 of CTA (0, 0, 0), a consumer; clock64
// cycles, mean over steps 2 .. KT - 3 of the time from the step's start (its copies landed) to
// each point: 1 = A fragments decoded, 2 = the previous step's MMAs done, 4 = (negative) the
// wait for the step's copies began; then the mean step
// length; points never marked are left out; then the phases of the call from kernel entry:
// setup done (the first block-wide barrier, after the PDL wait), tables built, first step's
// copies landed, main loop done, split-K partials written, end;
// and the call's time from events). TN WG splits force the configuration (0 = automatic).
// Hashed weights, zero codebook and x: timing only.
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <vector>

constexpr int kMaxSteps = 512;
__device__ long long kbit_wtl[kMaxSteps][8];
#define KBIT_WG_MARK(s, p)                                                              \
  do {                                                                                 \
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && (s) < kMaxSteps)     \
      kbit_wtl[(s)][(p)] = clock64();                                                  \
  } while (0)
__device__ long long kbit_phase[8];
#define KBIT_WG_PHASE(p)                                                                           \
  do {                                                                                              \
    if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && (threadIdx.x == 0 || (p) >= 6))  \
      kbit_phase[(p)] = clock64();                                                                 \
  } while (0)
__device__ unsigned long long kbit_cta_t[4096][4];
#define KBIT_WG_CTA(p)                                                                                  \
  do {                                                                                                 \
    unsigned long long t_;                                                                             \
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));                                             \
    const unsigned b_ = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);                \
    if (b_ < 4096) kbit_cta_t[b_][(p)] = t_;                                                           \
  } while (0)
#define KBIT_WG_FIRST_COPY_PROBE
#include "wgmma.cu"

#include "cuda_check.h"

__global__ void fill_hash(int32_t* p, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9E3779B9u;
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    p[i] = int32_t(h);
  }
}

int main(int argc, char** argv) {
  const int k = argc > 1 ? atoi(argv[1]) : 4, M = argc > 2 ? atoi(argv[2]) : 16;
  const int64_t N = argc > 3 ? atoll(argv[3]) : 512, K = argc > 4 ? atoll(argv[4]) : 2048;
  const int64_t KT = (K + 63) / 64;
  if (argc > 7) kbit_wgmma_force_config(atoi(argv[5]), atoi(argv[6]), atoi(argv[7]), argc > 8 ? atoi(argv[8]) : 0);
  int32_t* packed; uint8_t* absmax; float* cb; __half *x, *y;
  CK(cudaMalloc(&packed, KT * N * 2 * k * 4));
  CK(cudaMalloc(&absmax, KT * N * 2));
  CK(cudaMalloc(&cb, 32 * 4));
  CK(cudaMalloc(&x, size_t(M) * K * 2));
  CK(cudaMalloc(&y, size_t(M) * N * 2));
  fill_hash<<<256, 256>>>(packed, KT * N * 2 * k);  // random words: the table lookups' bank conflicts as in use
  CK(cudaGetLastError());
  CK(cudaMemset(absmax, 0x70, KT * N * 2));  // E4M4 code 0x70: 1.0
  CK(cudaMemset(cb, 0, 32 * 4));
  CK(cudaMemset(x, 0, size_t(M) * K * 2));
  // stream-K's workspace (0 when the call does not run it); one byte at least
  const int64_t ws_bytes = kbit_wgmma_workspace_bytes(0, KBIT_F16, M, K, N, k, KBIT_ABSMAX_E4M4) + 1;
  void* ws;
  CK(cudaMalloc(&ws, ws_bytes));
  CK(cudaMemset(ws, 0, ws_bytes));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  float ms = 0.f;
  for (int rep = 0; rep < 3; rep++) {
    CK(cudaEventRecord(e0));
    CK(cudaError_t(kbit_wgmma(0, nullptr, x, KBIT_F16, M, K, packed, absmax, KBIT_ABSMAX_E4M4, cb, k, N, K, 0,
                              nullptr, y, N, ws, ws_bytes, 0)));
    CK(cudaEventRecord(e1));
    CK(cudaDeviceSynchronize());
    CK(cudaEventElapsedTime(&ms, e0, e1));
  }
  static long long t[kMaxSteps][8];
  CK(cudaMemcpyFromSymbol(t, kbit_wtl, sizeof(t)));
  int steps = 0;  // of CTA (0, 0, 0): a K split gives it fewer than KT
  while (steps < kMaxSteps && steps < KT && t[steps][0] != 0) steps++;
  double sum[8] = {}, len = 0;
  int n = 0;
  for (int s = 2; s < steps - 3; s++, n++) {
    for (int p = 1; p <= 6; p++) sum[p] += t[s][p] != 0 ? double(t[s][p] - t[s][0]) : 0.;
    len += double(t[s + 1][0] - t[s][0]);
  }
  printf("k=%d M=%d N=%lld K=%lld: cycles from step start (mean of %d steps):", k, M, (long long)N, (long long)K, n);
  for (int p = 1; p <= 6; p++)
    if (t[2][p] != 0) printf(" p%d %.0f", p, sum[p] / n);
  printf(" | step %.0f cycles\n", len / n);
  static long long ph[8];
  CK(cudaMemcpyFromSymbol(ph, kbit_phase, sizeof(ph)));
  printf("  phases (cycles from entry): setup done %lld, tables %lld, first copies landed %lld (TN 256 WG 2 only), first step %lld, loop done %lld, partials %lld, reduced %lld, end %lld"
         " | %d steps | call %.1f us\n",
         ph[7] - ph[0], ph[1] - ph[0], ph[6] ? ph[6] - ph[0] : 0, t[0][0] - ph[0], ph[2] - ph[0], ph[3] ? ph[3] - ph[0] : 0, ph[4] ? ph[4] - ph[0] : 0,
         ph[5] - ph[0], steps, ms * 1e3);
  // every CTA (that writes C or a partial): ns from the first CTA's entry to its end
  static unsigned long long ct[4096][4];
  CK(cudaMemcpyFromSymbol(ct, kbit_cta_t, sizeof(ct)));
  std::vector<long long> ends;
  unsigned long long t0 = ~0ull;
  for (int b = 0; b < 4096; b++)
    if (ct[b][0] != 0 && ct[b][0] < t0) t0 = ct[b][0];
  for (int b = 0; b < 4096; b++)
    if (ct[b][1] != 0 && ct[b][1] > t0) ends.push_back(static_cast<long long>(ct[b][1] - t0));
  std::sort(ends.begin(), ends.end());
  if (!ends.empty())
    printf("  CTA ends (ns from the first entry, %zu CTAs): min %lld, p25 %lld, median %lld, p75 %lld, max %lld\n",
           ends.size(), ends[0], ends[ends.size() / 4], ends[ends.size() / 2], ends[3 * ends.size() / 4], ends.back());
  // per CTA (stream-K: owners write C, contributors only publish): entry, last MMAs done,
  // partials added, end, ns from the first entry
  if (getenv("WTL_CTAS") != nullptr)
    for (int b = 0; b < 4096; b++)
      if (ct[b][0] != 0 && ct[b][1] > t0)
        printf("  cta %d: entry %lld mma_done %lld adds_done %lld end %lld\n", b, (long long)(ct[b][0] - t0),
               ct[b][2] > t0 ? (long long)(ct[b][2] - t0) : -1, ct[b][3] > t0 ? (long long)(ct[b][3] - t0) : -1,
               (long long)(ct[b][1] - t0));
  return 0;
}
