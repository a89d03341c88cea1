// The tensor pipe's rate for back-to-back wgmma groups with nothing else in the loop: no
// decode, no copies, no barriers (session 45, NOTES.md v55). Per step each consumer warpgroup
// issues 4 wgmma m64nTNk16 (a 64-k step of csrc/wgmma.cu), commits, and waits for its previous
// group (wait_group 1), as wgmma.cu's main loop does. Variants: A from registers (RS, as
// wgmma.cu) or from shared memory (SS, as cuBLAS), 1 or 2 consumer warpgroups per CTA sharing
// one B tile, A registers rewritten every step or not. One CTA per SM, every SM busy. Zero
// data: timing only. Prints cycles per step (thread 0 of each CTA, clock64, mean over CTAs)
// against the pipe's ideal (2048 fp16 MACs per cycle per SM: m64n256k16 in 128 cycles).
// Two kinds of concurrent work can be added, to find what slows wgmma.cu's steps (887 cycles
// at gateup M = 256 k = 4 against 512 here): DEC, a decode-like pass per step that writes the A
// registers (one LDS.128 of words, 16 table lookups LDS.32 in 256-byte rows with a column per
// lane, 16 HMUL2, as wgmma.cu's k = 4 decode); COPY, a producer warp streaming 32 KB per step
// by bulk copies from an L2-resident buffer into a 3-slot shared ring (x's TMA traffic).
// Then a pipeline model (pipe_kernel): one consumer warpgroup that, like wgmma.cu's, waits
// for each step's stage (the x tile, TN x 128 bytes from an L2-resident buffer, plus WB bytes
// of "weights" streamed from a buffer past L2) in a ring of SLOTS stages, decodes (DEC) and
// runs its wgmmas on the stage's tile, and releases the stage one step later; a producer warp
// refills released stages by bulk copies. No table build, epilogue or stream-K.
// Build (sm_90a): nvcc -arch=sm_90a -O3 -std=c++17 scripts/wgmma_rate.cu -o wrate; run: ./wrate [steps]
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "cuda_check.h"

// operand lists: accumulators %0.., then RS: the 4 A registers and B's descriptor; SS: A's and
// B's descriptors
#define RATE_ACC64 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, " \
  "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, " \
  "%59, %60, %61, %62, %63"
#define RATE_ACC128 \
  RATE_ACC64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, " \
  "%78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, " \
  "%97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, " \
  "%113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define RATE_RS_LIST128 RATE_ACC64 "}, {%64, %65, %66, %67}, %68 "
#define RATE_SS_LIST128 RATE_ACC64 "}, %64, %65 "
#define RATE_RS_LIST256 RATE_ACC128 "}, {%128, %129, %130, %131}, %132 "
#define RATE_SS_LIST256 RATE_ACC128 "}, %128, %129 "

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define RATE_ASM(...) asm volatile(__VA_ARGS__)
#elif defined(__CUDA_ARCH__)
#define RATE_ASM(...) __trap()
#else
#define RATE_ASM(...)
#endif
#define RATE_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), \
                   "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define RATE_D32(i) RATE_D8(i), RATE_D8(i + 8), RATE_D8(i + 16), RATE_D8(i + 24)

template <int TN>
__device__ __forceinline__ void mma_rs(float (&d)[TN / 2], const uint32_t (&a)[4], uint64_t db) {
  if constexpr (TN == 128)
    RATE_ASM("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " RATE_RS_LIST128 ", 1, 1, 1, 0;"
             : RATE_D32(0), RATE_D32(32)
             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
  else
    RATE_ASM("wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 " RATE_RS_LIST256 ", 1, 1, 1, 0;"
             : RATE_D32(0), RATE_D32(32), RATE_D32(64), RATE_D32(96)
             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
template <int TN>
__device__ __forceinline__ void mma_ss(float (&d)[TN / 2], uint64_t da, uint64_t db) {
  if constexpr (TN == 128)
    RATE_ASM("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " RATE_SS_LIST128 ", 1, 1, 1, 0, 0;"
             : RATE_D32(0), RATE_D32(32)
             : "l"(da), "l"(db));
  else
    RATE_ASM("wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 " RATE_SS_LIST256 ", 1, 1, 1, 0, 0;"
             : RATE_D32(0), RATE_D32(32), RATE_D32(64), RATE_D32(96)
             : "l"(da), "l"(db));
}
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr) {  // K-major, 128-byte swizzle (as wgmma.cu)
  return uint64_t((addr & 0x3FFFFu) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}
template <int R>
__device__ __forceinline__ void keep(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i])::"memory");
}

__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// Shared memory: B tile (TN x 128 bytes), A tiles (SS: 8 KB per warpgroup), the table (64 KB),
// the words (2 KB), the copy ring (3 x 32 KB), the ring's mbarriers.
constexpr int kTable = 64 * 1024, kWords = 2048, kSlot = 32 * 1024, kSlots = 3;
template <int TN, int WGS>
struct Lay {
  static constexpr int b = 0, a = TN * 128, table = a + WGS * 8192, words = table + kTable, ring = words + kWords,
                       bars = ring + kSlots * kSlot, end = bars + 64;
};

__device__ __forceinline__ void mbar_wait_parity(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
}

// A consumer's registers before its timed loop: accumulators, this step's and the previous
// step's A.
template <int TN>
__device__ __forceinline__ void consumer_zero(float (&acc)[TN / 2], uint32_t (&a)[4][4], uint32_t (&a_prev)[4][4]) {
#pragma unroll
  for (int i = 0; i < TN / 2; i++) acc[i] = 0.f;
#pragma unroll
  for (int j = 0; j < 4; j++)
#pragma unroll
    for (int i = 0; i < 4; i++) a[j][i] = a_prev[j][i] = 0u;
}
// A consumer's step after its A registers exist, as wgmma.cu's: 4 wgmma on B at b (A at at for
// SS, else a[j]), commit, wait for the previous step's group; the previous step's A stays
// live until its MMAs are done.
template <int TN, bool SS>
__device__ __forceinline__ void consumer_mma(float (&acc)[TN / 2], uint32_t (&a)[4][4], uint32_t (&a_prev)[4][4],
                                             uint32_t at, uint32_t b) {
  keep(acc);
  RATE_ASM("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
  for (int j = 0; j < 4; j++) {
    if constexpr (SS) mma_ss<TN>(acc, desc_sw128(at + j * 32), desc_sw128(b + j * 32));
    else mma_rs<TN>(acc, a[j], desc_sw128(b + j * 32));
  }
  RATE_ASM("wgmma.commit_group.sync.aligned;" ::: "memory");
  keep(acc);
  RATE_ASM("wgmma.wait_group.sync.aligned 1;" ::: "memory");
#pragma unroll
  for (int j = 0; j < 4; j++)
#pragma unroll
    for (int i = 0; i < 4; i++) {
      asm volatile("" ::"r"(a_prev[j][i]));
      a_prev[j][i] = a[j][i];
    }
}
// After a consumer's timed loop: its last group, the CTA's cycles since t0 (thread 0), and a
// never-taken store that keeps the MMAs (zero data).
template <int TN>
__device__ __forceinline__ void consumer_finish(float (&acc)[TN / 2], long long t0, long long* cycles, float* sink) {
  RATE_ASM("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  keep(acc);
  const long long t1 = clock64();
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < TN / 2; i++) sum += acc[i];
  if (sum != 0.f) sink[threadIdx.x] = sum;
}

template <int TN, int WGS, bool SS, bool WRITE_A, bool DEC, bool COPY>
__global__ void __launch_bounds__(WGS * 128 + (COPY ? 32 : 0), 1) rate_kernel(int steps, long long* cycles, float* sink,
                                                                 const char* src, int src_bytes) {
  using L = Lay<TN, WGS>;
  extern __shared__ __align__(1024) char smem[];
  for (int i = threadIdx.x; i < L::bars / 16; i += blockDim.x)
    reinterpret_cast<uint4*>(smem)[i] = make_uint4(0u, 0u, 0u, 0u);
  const uint32_t base = uint32_t(__cvta_generic_to_shared(smem));
  if (threadIdx.x == 0)
    for (int i = 0; i < kSlots; i++) asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(base + L::bars + 8 * i));
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncthreads();
  if (threadIdx.x >= WGS * 128) {  // the producer warp: bulk copies only (COPY)
    if (COPY && threadIdx.x == WGS * 128) {
      for (int s = 0; s < steps; s++) {
        const int slot = s % kSlots;
        const uint32_t bar = base + L::bars + 8 * slot, dst = base + L::ring + slot * kSlot;
        if (s >= kSlots) mbar_wait_parity(bar, uint32_t((s / kSlots - 1) & 1));  // the slot's previous copy landed
        asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(bar), "r"(kSlot) : "memory");
        const char* from = src + (int64_t(blockIdx.x) * kSlot + int64_t(s) * kSlot) % src_bytes;
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"(dst), "l"(from), "r"(kSlot), "r"(bar) : "memory");
      }
    }
    return;
  }
  const int wg = threadIdx.x >> 7, lane = threadIdx.x & 31;
  const uint32_t b = base + L::b, at = base + L::a + wg * 8192;
  const uint32_t col = base + L::table + lane * 4;
  float acc[TN / 2];
  uint32_t a[4][4], a_prev[4][4];
  consumer_zero<TN>(acc, a, a_prev);
  const long long t0 = clock64();
  for (int s = 0; s < steps; s++) {
    if constexpr (DEC) {  // the words, 16 lookups in the table (byte i of word j: the row), the scale
      const uint4 w = *reinterpret_cast<const uint4*>(smem + L::words + ((s * 7 + threadIdx.x) & 127) * 16);
      const uint32_t wv[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int j = 0; j < 4; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) a[j][i] = hmul2(lds32(col + (((wv[j] >> (8 * i)) & 0xFFu) << 8)), wv[j] | 0x3C003C00u);
    } else if constexpr (WRITE_A) {  // new A registers every step (a decode's outputs; still zeros)
#pragma unroll
      for (int j = 0; j < 4; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) asm volatile("and.b32 %0, %1, 0;" : "=r"(a[j][i]) : "r"(s + j + i));
    }
    consumer_mma<TN, SS>(acc, a, a_prev, at, b);
  }
  consumer_finish<TN>(acc, t0, cycles, sink);
}

// Runs `launch` twice (warm-up, then timed by events): the timed run's ms, and its mean over the
// CTAs of the cycles thread 0 wrote to d_cycles.
template <typename Launch>
void measure(Launch&& launch, int sms, const long long* d_cycles, float& ms, double& mean_cycles) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  launch();
  CK(cudaEventRecord(e0));
  launch();
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  CK(cudaGetLastError());
  CK(cudaEventElapsedTime(&ms, e0, e1));
  long long* h = new long long[sms];
  CK(cudaMemcpy(h, d_cycles, sms * sizeof(long long), cudaMemcpyDeviceToHost));
  mean_cycles = 0;
  for (int i = 0; i < sms; i++) mean_cycles += double(h[i]) / sms;
  delete[] h;
}

template <int TN, int WGS, bool SS, bool WRITE_A, bool DEC = false, bool COPY = false>
void run(const char* name, int steps, int sms, long long* d_cycles, float* sink, const char* src, int src_bytes) {
  auto kernel = rate_kernel<TN, WGS, SS, WRITE_A, DEC, COPY>;
  const int smem = Lay<TN, WGS>::end;  // > half an SM: one CTA per SM
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int threads = WGS * 128 + (COPY ? 32 : 0);  // + the producer warp
  float ms = 0.f;
  double mean = 0;
  measure([&] { kernel<<<sms, threads, smem>>>(steps, d_cycles, sink, src, src_bytes); }, sms, d_cycles, ms, mean);
  const double per_step = mean / steps, ideal = WGS * 4.0 * TN / 2;
  const double tflops = 2.0 * sms * WGS * 64.0 * TN * 64.0 * steps / (ms * 1e-3) / 1e12;
  printf("%-36s %8.1f cycles/step  ideal %6.0f  pipe %5.1f%%  %6.1f TFLOP/s\n", name, per_step, ideal,
         100.0 * ideal / per_step, tflops);
}


template <int TN, bool DEC, int SLOTS, int WB, int PF = 0, int WE = 1, int XS = 1>
__global__ void __launch_bounds__(128 + 32, 1) pipe_kernel(int steps, long long* cycles, float* sink, const char* xsrc,
                                                           int x_bytes, const char* wsrc, int64_t w_bytes) {
  constexpr int kX = TN * 128, kStage = kX + 4096, kT = DEC ? kTable : 0;
  extern __shared__ __align__(1024) char smem[];
  const uint32_t base = uint32_t(__cvta_generic_to_shared(smem));
  const uint32_t ring = base + kT, full0 = ring + SLOTS * kStage, empty0 = full0 + 8 * SLOTS;
  for (int i = threadIdx.x; i < (kT + SLOTS * kStage) / 16; i += blockDim.x)
    reinterpret_cast<uint4*>(smem)[i] = make_uint4(0u, 0u, 0u, 0u);
  if (threadIdx.x == 0)
    for (int i = 0; i < SLOTS; i++) {
      asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(full0 + 8 * i));
      asm volatile("mbarrier.init.shared.b64 [%0], 4;" ::"r"(empty0 + 8 * i));  // one arrival per consumer warp
    }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncthreads();
  if (threadIdx.x >= 128) {  // producer warp
    if (threadIdx.x == 128) {
      for (int s = 0; s < steps; s++) {
        const int slot = s % SLOTS;
        const uint32_t full = full0 + 8 * slot, dst = ring + slot * kStage;
        if (s >= SLOTS) mbar_wait_parity(empty0 + 8 * slot, uint32_t((s / SLOTS - 1) & 1));
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        // WE > 1: the weights of WE steps in one copy every WE steps (into a spare area: no
        // decode reads them); XS > 1: x in XS copies
        const int wbytes = WB > 0 && s % WE == 0 ? WB * WE : 0;
        const uint32_t wdst = WE > 1 ? empty0 + 8 * SLOTS + 8 * 16 : dst + kX;
        asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(full), "r"(kX + wbytes) : "memory");
#pragma unroll
        for (int h = 0; h < XS; h++)
          asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                       ::"r"(dst + h * (kX / XS)), "l"(xsrc + (int64_t(s) * kX + h * (kX / XS)) % x_bytes), "r"(kX / XS),
                       "r"(full) : "memory");
        if (WB > 0 && PF > 0 && s + PF < steps)  // the weights of step s + PF asked into L2
          asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;"
                       ::"l"(wsrc + ((int64_t(blockIdx.x) * steps + s + PF) * WB) % w_bytes), "r"(WB) : "memory");
        if (wbytes > 0)
          asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                       ::"r"(wdst), "l"(wsrc + ((int64_t(blockIdx.x) * steps + s) * WB) % w_bytes), "r"(wbytes),
                       "r"(full) : "memory");
      }
    }
    return;
  }
  const int lane = threadIdx.x & 31;
  const uint32_t col = base + lane * 4;  // the table at 0 (DEC)
  float acc[TN / 2];
  uint32_t a[4][4], a_prev[4][4];
  consumer_zero<TN>(acc, a, a_prev);
  int prev = 0;
  const long long t0 = clock64();
  for (int s = 0; s < steps; s++) {
    const int slot = s % SLOTS;
    const uint32_t st = ring + slot * kStage;
    mbar_wait_parity(full0 + 8 * slot, uint32_t((s / SLOTS) & 1));
    // rate_kernel's decode pass, written out: as a shared helper ptxas reorders the address
    // arithmetic of the n256 DEC pipe kernels (scripts/sass_diff.py), whose figures (NOTES.md
    // v55 item 6) were measured on this form
    if constexpr (DEC) {
      const uint4 w = *reinterpret_cast<const uint4*>(smem + kT + slot * kStage + kX + (threadIdx.x & 127) * 16);
      const uint32_t wv[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int j = 0; j < 4; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) a[j][i] = hmul2(lds32(col + (((wv[j] >> (8 * i)) & 0xFFu) << 8)), wv[j] | 0x3C003C00u);
    } else {
#pragma unroll
      for (int j = 0; j < 4; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) asm volatile("and.b32 %0, %1, 0;" : "=r"(a[j][i]) : "r"(s + j + i));
    }
    consumer_mma<TN, false>(acc, a, a_prev, 0u, st);
    __syncwarp();
    if (s > 0 && lane == 0) asm volatile("mbarrier.arrive.shared.b64 _, [%0];" ::"r"(empty0 + 8 * prev) : "memory");
    prev = slot;
  }
  consumer_finish<TN>(acc, t0, cycles, sink);
}

template <int TN, bool DEC, int SLOTS, int WB, int PF = 0, int WE = 1, int XS = 1>
void run_pipe(const char* name, int steps, int sms, long long* d_cycles, float* sink, const char* xsrc, int x_bytes,
              const char* wsrc, int64_t w_bytes) {
  auto kernel = pipe_kernel<TN, DEC, SLOTS, WB, PF, WE, XS>;
  const int smem = (DEC ? kTable : 0) + SLOTS * (TN * 128 + 4096) + 16 * SLOTS + 128 + (WE > 1 ? WB * WE : 0);
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  float ms = 0.f;
  double mean = 0;
  measure([&] { kernel<<<sms, 160, smem>>>(steps, d_cycles, sink, xsrc, x_bytes, wsrc, w_bytes); }, sms, d_cycles, ms,
          mean);
  const double per_step = mean / steps, ideal = 4.0 * TN / 2;
  const double feed = double(sms) * (TN * 128 + WB) * steps / (ms * 1e-3) / 1e12;
  printf("%-36s %8.1f cycles/step  ideal %6.0f  pipe %5.1f%%  %6.2f TB/s into shared memory\n", name, per_step,
         ideal, 100.0 * ideal / per_step, feed);
}

int main(int argc, char** argv) {
  const int steps = argc > 1 ? atoi(argv[1]) : 4000;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  long long* d_cycles;
  float* sink;
  char* src;
  const int src_bytes = 1 << 20;  // x of gateup at M = 256: 1 MB, L2-resident
  CK(cudaMalloc(&d_cycles, sms * sizeof(long long)));
  CK(cudaMalloc(&sink, 1024 * sizeof(float)));
  CK(cudaMalloc(&src, src_bytes));
  CK(cudaMemset(src, 0, src_bytes));
  printf("%d SMs, %d steps of 4 wgmma per warpgroup\n", sms, steps);
#define RUN(name, ...) run<__VA_ARGS__>(name, steps, sms, d_cycles, sink, src, src_bytes)
  RUN("RS n256 1 WG", 256, 1, false, false);
  RUN("RS n256 1 WG, A rewritten", 256, 1, false, true);
  RUN("RS n256 1 WG + DEC", 256, 1, false, true, true, false);
  RUN("RS n256 1 WG + COPY", 256, 1, false, true, false, true);
  RUN("RS n256 1 WG + DEC + COPY", 256, 1, false, true, true, true);
  RUN("RS n256 2 WG, A rewritten", 256, 2, false, true);
  RUN("RS n256 2 WG + DEC", 256, 2, false, true, true, false);
  // (RS n256 with 2 warpgroups and a producer warp: ptxas serializes the wgmmas for want of
  // registers, C7512; wgmma.cu gives such a CTA a producer warpgroup and setmaxnreg)
  RUN("SS n256 1 WG", 256, 1, true, false);
  RUN("SS n256 1 WG + COPY", 256, 1, true, false, false, true);
  RUN("SS n256 2 WG", 256, 2, true, false);
  RUN("SS n256 2 WG + COPY", 256, 2, true, false, false, true);
  RUN("RS n128 1 WG + DEC", 128, 1, false, true, true, false);
  RUN("RS n128 1 WG + DEC + COPY", 128, 1, false, true, true, true);
  RUN("RS n128 2 WG + DEC + COPY", 128, 2, false, true, true, true);
  const int64_t w_bytes = int64_t(512) << 20;  // past L2: the weights stream from DRAM
  char* wsrc;
  CK(cudaMalloc(&wsrc, w_bytes));
  CK(cudaMemset(wsrc, 0, w_bytes));
  printf("pipeline model: 1 consumer warpgroup waiting for its stages\n");
#define PIPE(name, ...) run_pipe<__VA_ARGS__>(name, steps, sms, d_cycles, sink, src, src_bytes, wsrc, w_bytes)
  PIPE("n256 4 stages, x + 2.5 KB w, DEC", 256, true, 4, 2560);
  PIPE("n256 4 stages, x + 2.5 KB w", 256, false, 4, 2560);
  PIPE("n256 4 stages, x only, DEC", 256, true, 4, 0);
  PIPE("n256 6 stages, x + 2.5 KB w", 256, false, 6, 2560);
  PIPE("n256 2 stages, x + 2.5 KB w", 256, false, 2, 2560);
  PIPE("n128 4 stages, x + 2.5 KB w, DEC", 128, true, 4, 2560);
  PIPE("n128 6 stages, x + 2.5 KB w, DEC", 128, true, 6, 2560);
  PIPE("n256 4 stages, x + w, DEC, w to L2 8 ahead", 256, true, 4, 2560, 8);
  PIPE("n256 4 stages, x only", 256, false, 4, 0);
  PIPE("n256 4 stages, x in 2 copies", 256, false, 4, 0, 0, 1, 2);
  PIPE("n256 4 stages, x + w of 2 steps per copy", 256, false, 4, 2560, 0, 2);
  PIPE("n256 4 stages, x + w of 4 steps per copy", 256, false, 4, 2560, 0, 4);
  PIPE("n256 4 stages, x + w of 8 steps per copy", 256, false, 4, 2560, 0, 8);
  run_pipe<256, false, 4, 2560>("n256 4 stages, x + w from L2 per step", steps, sms, d_cycles, sink, src, src_bytes,
                                wsrc, int64_t(1) << 20);
  return 0;
}
