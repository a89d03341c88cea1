// graph_us(launch, n_variants, stream): median us per call of launch(i, stream), i cycling over
// n_variants (weight copies rotated past L2), from 15 replays of a CUDA graph of at least 20
// back-to-back calls: the timing of `kbit bench` (kbit/bench/timing.py) for the standalone
// harnesses in scripts/ (stream_floor.cu, pdl_floor.cu).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "cuda_check.h"

template <typename F>
float graph_us(F launch, int n_variants, cudaStream_t st) {
  const int calls = std::max(n_variants, 20);
  for (int i = 0; i < n_variants; i++) launch(i, st);
  CK(cudaStreamSynchronize(st));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int j = 0; j < calls; j++) launch(j % n_variants, st);
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int r = 0; r < 2; r++) CK(cudaGraphLaunch(ge, st));
  std::vector<float> t;
  for (int r = 0; r < 15; r++) {
    CK(cudaEventRecord(a, st));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.f / calls);
  }
  std::sort(t.begin(), t.end());
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  CK(cudaGetLastError());
  return t[t.size() / 2];
}
