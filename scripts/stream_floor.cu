// stream_floor: how fast can one kernel call read S bytes of weights (cold L2) and write a
// little, in the same CUDA-graph harness as `kbit bench`? The latency floor of any M = 1
// kernel on this GPU, without decode work. Build and run on the device:
//   nvcc -arch=sm_90a -O3 -std=c++17 -Icsrc scripts/stream_floor.cu -o sf && ./sf
// Modes (each CTA owns bytes [cta * S / ctas, (cta + 1) * S / ctas)):
//   ldg   : every thread loads 16-byte words of the CTA's range, all loads of a thread issued
//           before any is used (U in flight per thread, then the next U)
//   ldg U8 max carveout: the same with U = 8 from a kernel holding 0 / 64 / 128 / 200 KB of
//           unused dynamic shared memory (the piece column) at the largest shared carveout
//   bulk  : thread 0 issues bulk copies of `piece` bytes into shared memory at entry (the
//           whole range must fit), all threads wait on one mbarrier, then read shared memory
//   strided: as bulk, but the range is `pieces` pieces of S / ctas / pieces bytes spread over
//           the buffer with stride S / pieces (the tiled64 layout read by row groups: one piece
//           per k-tile)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "../scripts/graph_timing.h"
#include "async.cuh"

using namespace kbit;

template <int U>
__device__ __forceinline__ void ldg_stream_body(const uint4* __restrict__ w, size_t vec_per_cta,
                                                uint32_t* __restrict__ out) {
  const uint4* p = w + blockIdx.x * vec_per_cta;
  uint32_t acc = 0;
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
template <int U>
__global__ void __launch_bounds__(512) ldg_stream(const uint4* __restrict__ w, size_t vec_per_cta,
                                                  uint32_t* __restrict__ out) {
  ldg_stream_body<U>(w, vec_per_cta, out);
}
// The same loads from a kernel launched with a large unused dynamic shared-memory allocation
// and the largest shared carveout: L1 keeps only what shared memory leaves (256 KB - carveout),
// as in mma / wgmma, whose loads return through that L1. If the bytes a SM can have in flight
// are bounded by it, this mode is slower than "ldg U8" (the session-22 hypothesis for why mma's
// first weights arrive ~2 us after issue: NOTES.md v27).
__global__ void __launch_bounds__(512) ldg_stream_smem(const uint4* __restrict__ w, size_t vec_per_cta,
                                                       uint32_t* __restrict__ out) {
  ldg_stream_body<8>(w, vec_per_cta, out);
}

// piece j of CTA c at c * cta_stride + j * stride.
__global__ void __launch_bounds__(512) bulk_stream(const char* __restrict__ w, uint32_t piece, int pieces,
                                                   size_t cta_stride, size_t stride,
                                                   uint32_t* __restrict__ out) {
  extern __shared__ __align__(128) char smem[];
  __shared__ __align__(8) uint64_t bar;
  const uint32_t bar_sh = uint32_t(__cvta_generic_to_shared(&bar));
  const uint32_t dst = uint32_t(__cvta_generic_to_shared(smem));
  const char* base = w + size_t(blockIdx.x) * cta_stride;
  if (threadIdx.x == 0) {
    mbar_init(bar_sh, 1);
    mbar_fence_init();
    mbar_expect_tx(bar_sh, piece * uint32_t(pieces));
    for (int j = 0; j < pieces; j++) bulk_copy(dst + j * piece, base + j * stride, piece, bar_sh);
  }
  __syncthreads();
  mbar_wait(bar_sh, 0);
  uint32_t acc = 0;
  const uint4* s = reinterpret_cast<const uint4*>(smem);
  for (uint32_t i = threadIdx.x; i < piece * uint32_t(pieces) / 16; i += blockDim.x) {
    const uint4 v = s[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

__global__ void tiny(uint32_t* out) { out[blockIdx.x * blockDim.x + threadIdx.x] = threadIdx.x; }

int main() {
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t pool_bytes = size_t(512) << 20;
  char* pool;
  CK(cudaMalloc(&pool, pool_bytes));
  CK(cudaMemset(pool, 1, pool_bytes));
  uint32_t* out;
  CK(cudaMalloc(&out, size_t(sms) * 4 * 1024 * 4));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  CK(cudaFuncSetAttribute(bulk_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  CK(cudaFuncSetAttribute(ldg_stream_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  CK(cudaFuncSetAttribute(ldg_stream_smem, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  printf("tiny kernel (1 block x 32): %.2f us\n",
         graph_us([&](int, cudaStream_t s) { tiny<<<1, 32, 0, s>>>(out); }, 1, st));
  printf("tiny kernel (%d blocks x 512): %.2f us\n", sms,
         graph_us([&](int, cudaStream_t s) { tiny<<<sms, 512, 0, s>>>(out); }, 1, st));
  // bytes: KV k=4, gateup k=2, Q k=4, gateup k=4, big/8, gateup fp16
  const double mbs[] = {0.557, 2.95, 4.46, 5.57, 15.6, 21.0};
  printf("| MB | mode | ctas | threads | piece B | us | GB/s |\n|---|---|---|---|---|---|---|\n");
  for (double mb : mbs) {
    // per-CTA bytes a multiple of 512 (so every piece count below divides it in 16-byte units)
    const size_t per_cta = (size_t(mb * 1e6 / sms) + 511) / 512 * 512;
    const size_t bytes = per_cta * sms;
    const int nv = int(std::min<size_t>(200, std::max<size_t>(20, (300u << 20) / bytes)));
    auto addr = [&](int i) { return pool + (size_t(i) * bytes) % (pool_bytes - bytes) / 256 * 256; };
    auto report = [&](const char* mode, int ctas, int threads, size_t piece, float us) {
      printf("| %.2f | %s | %d | %d | %zu | %.2f | %.0f |\n", bytes / 1e6, mode, ctas, threads, piece, us,
             bytes / (us * 1e3));
    };
    for (int threads : {256, 512}) {
      float us = graph_us([&](int i, cudaStream_t s) {
        ldg_stream<4><<<sms, threads, 0, s>>>(reinterpret_cast<const uint4*>(addr(i)), per_cta / 16, out);
      }, nv, st);
      report("ldg U4", sms, threads, 0, us);
      us = graph_us([&](int i, cudaStream_t s) {
        ldg_stream<8><<<sms, threads, 0, s>>>(reinterpret_cast<const uint4*>(addr(i)), per_cta / 16, out);
      }, nv, st);
      report("ldg U8", sms, threads, 0, us);
    }
    for (int smem_kb : {0, 64, 128, 200}) {  // piece column: the unused shared bytes per CTA
      float us = graph_us([&](int i, cudaStream_t s) {
        ldg_stream_smem<<<sms, 512, size_t(smem_kb) * 1024, s>>>(reinterpret_cast<const uint4*>(addr(i)),
                                                                per_cta / 16, out);
      }, nv, st);
      report("ldg U8 max carveout", sms, 512, size_t(smem_kb) * 1024, us);
    }
    if (per_cta <= 190 * 1024) {
      for (int pieces : {1, 4, 16, 32}) {
        const uint32_t piece = uint32_t(per_cta / pieces);
        float us = graph_us([&](int i, cudaStream_t s) {
          bulk_stream<<<sms, 512, per_cta, s>>>(addr(i), piece, pieces, per_cta, piece, out);
        }, nv, st);
        report("bulk contiguous", sms, 512, piece, us);
        // strided: piece j of CTA c at c * piece + j * (sms * piece): a k-tile-major layout
        us = graph_us([&](int i, cudaStream_t s) {
          bulk_stream<<<sms, 512, per_cta, s>>>(addr(i), piece, pieces, piece, size_t(sms) * piece, out);
        }, nv, st);
        report("bulk strided", sms, 512, piece, us);
      }
    }
  }
  return 0;
}
