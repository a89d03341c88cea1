// Standalone timing + per-CTA timeline of csrc/mma.cu (no Python, no torch): where does a
// small-M call spend its time? Build (any machine with nvcc; variants via -D...):
//   nvcc -arch=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -Icsrc scripts/mma_timeline.cu -o tl
// Run on the GPU:  ./tl [k M]     (k = 4, M = 1 by default; the built-in shapes)
// Prints, per shape: the time per call in CUDA-graph replays with the weights rotated past L2
// (cold: weights, x and codebook rotated past L2), the weight bytes per second, and the mean
// over CTAs of when their warps reach each point of the kernel, in ns after the earliest CTA
// started (%globaltimer): first weight loads issued, prologue done, first weights in
// registers, main loop done (first/last warp), C written (first/last warp), the last CTA's
// end; then x0/1, cur0/1, iss0: first/last warp done issuing its x loads, done with its load
// cursor, first warp done issuing its weight loads; split-K calls: part1 = last warp done storing
// the partial sums other slices own (every slice passes that point); S: the plan's K slices.
// TL_WARM=1: the timed call follows a call on another weight copy (the kernel's code and
// parameters warm, its data cold). Random weights (timing only; correctness is the test
// suite's job). Each point costs its warp a timer read and two global atomics (~0.1-0.2 us
// for the first one: NOTES.md v37), so the early points run late.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

constexpr int kPoints = 10;  // KBIT_MMA_MARK points

__device__ unsigned long long kbit_tl[2048][kPoints][2];  // [CTA][point][first warp, last warp]
__device__ __forceinline__ void kbit_tl_mark(int i, unsigned dep) {
  if (dep == 0x9e3779b9u) return;  // makes the timer read wait for `dep`
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  if ((threadIdx.x & 31) == 0) {
    atomicMin(&kbit_tl[blockIdx.x][i][0], t);
    atomicMax(&kbit_tl[blockIdx.x][i][1], t);
  }
}
#define KBIT_MMA_MARK(i, dep) kbit_tl_mark(i, dep)
#include "mma.cu"

#include "cuda_check.h"

__global__ void fill_random(uint32_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
    p[i] = h;
  }
}
__global__ void empty_kernel() {}

int main(int argc, char** argv) {
  const int k = argc > 1 ? atoi(argv[1]) : 4;
  const int M = argc > 2 ? atoi(argv[2]) : 1;
  struct Shape { const char* name; int N, K; };
  const Shape shapes[] = {{"gateup", 5120, 2048}, {"down", 2048, 5120}, {"Q", 4096, 2048},
                          {"O", 2048, 4096}, {"KV", 512, 2048}, {"big", 28672, 8192},
                          // one CTA (weights hot in L2): the latency chain of the kernel itself
                          {"tiny", 16, 2048}, {"tiny5", 16, 5120}};
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const size_t rotate = size_t(4) * prop.l2CacheSize;  // bytes of weights cycled through
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  printf("%s, k=%d, M=%d; us per call (graph, cold), timeline ns after the first CTA starts\n", prop.name, k, M);
  printf("%-7s %7s %7s %6s | %5s %6s %6s %6s %6s %6s %6s %6s %6s %11s %11s %6s %6s %2s\n", "shape", "us", "GB/s", "CTAs",
         "start", "issued", "prolog", "data", "loop0", "loop1", "end0", "end1", "span", "x0/1", "cur0/1", "iss0", "part1", "S");
  {  // the per-call floor in this harness
    cudaGraph_t g; cudaGraphExec_t ge; cudaEvent_t a, b;
    CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < 100; i++) empty_kernel<<<1, 32, 0, s>>>();
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(a, s));
    for (int r = 0; r < 10; r++) CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms; CK(cudaEventElapsedTime(&ms, a, b));
    printf("%-7s %7.2f\n", "empty", ms * 1e3f / 1000);
  }
  for (const Shape& sh : shapes) {
    const int64_t KB = (sh.K + 31) / 32, KT = (KB + 1) / 2;
    const size_t words = size_t(KT) * 2 * sh.N * k, scales = size_t(KT) * 2 * sh.N;
    const size_t bytes = words * 4 + scales;
    const int copies = int(std::max<size_t>(2, std::min<size_t>(512, rotate / bytes + 1)));
    uint32_t* packed; uint8_t* absmax; float* cb; __half* x; __half* out;
    CK(cudaMalloc(&packed, words * 4 * copies));
    CK(cudaMalloc(&absmax, scales * copies));
    CK(cudaMalloc(&cb, 32 * 4 * copies));
    CK(cudaMalloc(&x, size_t(M) * sh.K * 2 * copies));
    CK(cudaMalloc(&out, size_t(M) * sh.N * 2 * copies));
    fill_random<<<1024, 256, 0, s>>>(packed, words * copies, 1);
    // absmax codes 0x60..0x7f (E4M4: about 2^-5 .. 2^-4), x halves of small magnitude
    std::vector<uint8_t> hs(scales * copies);
    for (size_t i = 0; i < hs.size(); i++) hs[i] = uint8_t(0x60 + (i * 7919 % 32));
    CK(cudaMemcpy(absmax, hs.data(), hs.size(), cudaMemcpyHostToDevice));
    std::vector<float> hcb(32);
    for (int i = 0; i < 32; i++) hcb[i] = -1.f + 2.f * i / 31.f;
    for (int c = 0; c < copies; c++) CK(cudaMemcpy(cb + 32 * c, hcb.data(), 128, cudaMemcpyHostToDevice));
    std::vector<__half> hx(size_t(M) * sh.K * copies);  // x and codebook per copy: cold like the weights
    for (size_t i = 0; i < hx.size(); i++) hx[i] = __float2half(float(int(i * 37 % 17) - 8) / 16.f);
    CK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    // the split-K workspace (zeroed once; every call leaves it zeroed)
    const int64_t ws_bytes = kbit_mma_workspace_bytes(0, k, M, sh.N, sh.K);
    void* ws = nullptr;
    if (ws_bytes > 0) {
      CK(cudaMalloc(&ws, ws_bytes));
      CK(cudaMemset(ws, 0, ws_bytes));
    }
    auto call = [&](int c) {
      int e = kbit_mma(0, s, x + size_t(M) * sh.K * c, KBIT_F16, M, sh.K,
                       reinterpret_cast<const int32_t*>(packed + words * c), absmax + scales * c,
                       KBIT_ABSMAX_E4M4, cb + 32 * c, k, sh.N, sh.K, 0, nullptr,
                       out + size_t(M) * sh.N * c, sh.N, ws, ws_bytes);
      if (e != 0) { fprintf(stderr, "kbit_mma: %s\n", cudaGetErrorString(cudaError_t(e))); exit(1); }
    };
    // graph of `copies` calls (each on its own weight copy), replayed
    const int per_graph = std::max(copies, 64);
    cudaGraph_t g; cudaGraphExec_t ge; cudaEvent_t a, b;
    CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < per_graph; i++) call(i % copies);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int r = 0; r < 3; r++) CK(cudaGraphLaunch(ge, s));
    std::vector<float> t;
    for (int r = 0; r < 15; r++) {
      CK(cudaEventRecord(a, s));
      CK(cudaGraphLaunch(ge, s));
      CK(cudaEventRecord(b, s));
      CK(cudaEventSynchronize(b));
      float ms; CK(cudaEventElapsedTime(&ms, a, b));
      t.push_back(ms * 1e3f / per_graph);
    }
    std::sort(t.begin(), t.end());
    const float us = t[t.size() / 2];
    // timeline of one more call, after the graph's calls evicted its copy from L2
    std::vector<unsigned long long> init(2048 * kPoints * 2);
    for (size_t i = 0; i < init.size(); i++) init[i] = (i & 1) ? 0ull : ~0ull;
    CK(cudaGraphLaunch(ge, s));
    // TL_WARM=1: a call on another copy first (the kernel's code warm, this copy's data cold)
    if (getenv("TL_WARM") && atoi(getenv("TL_WARM")) == 1) call(1);
    CK(cudaMemcpyToSymbolAsync(kbit_tl, init.data(), init.size() * 8, 0, cudaMemcpyHostToDevice, s));
    call(0);
    CK(cudaStreamSynchronize(s));
    std::vector<unsigned long long> tl(init.size());
    CK(cudaMemcpyFromSymbol(tl.data(), kbit_tl, tl.size() * 8));
    int ctas = 0;
    unsigned long long t0 = ~0ull;
    for (int c = 0; c < 2048; c++)
      if (tl[(c * kPoints + 0) * 2 + 1] != 0) { ctas++; t0 = std::min(t0, tl[(c * kPoints + 0) * 2]); }
    double mean[kPoints][2] = {};
    unsigned long long last = 0;
    for (int c = 0; c < ctas; c++) last = std::max(last, tl[(c * kPoints + 5) * 2 + 1] - t0);
    for (int c = 0; c < ctas; c++)
      for (int p = 0; p < kPoints; p++)
        for (int w = 0; w < 2; w++) {
          const unsigned long long v = tl[(c * kPoints + p) * 2 + w];
          mean[p][w] += double(v == 0 || v == ~0ull ? 0 : v - t0) / ctas;  // points a variant never reaches: 0
        }
    printf("%-7s %7.2f %7.0f %6d | %5.0f %6.0f %6.0f %6.0f %6.0f %6.0f %6.0f %6.0f %6llu %5.0f/%5.0f %5.0f/%5.0f %6.0f %6.0f %2d\n", sh.name, us,
           bytes / (us * 1e3), ctas, mean[0][0], mean[1][1], mean[2][1], mean[3][1], mean[4][0],
           mean[4][1], mean[5][0], mean[5][1], last, mean[6][0], mean[6][1], mean[7][0], mean[7][1], mean[1][0], mean[8][1], kbit_mma_ksplit(0, k, M, sh.N, sh.K));
    CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g));
    CK(cudaFree(packed)); CK(cudaFree(absmax)); CK(cudaFree(cb)); CK(cudaFree(x)); CK(cudaFree(out)); CK(cudaFree(ws));
  }
  return 0;
}
