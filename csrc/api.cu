// Library-wide entry points of the C interface (kbit.h).
#include "common.cuh"

extern "C" int kbit_abi_version(void) { return 9; }

extern "C" const char* kbit_error_string(int err) {
  return cudaGetErrorString(static_cast<cudaError_t>(err));
}

extern "C" int kbit_pdl_mode(void) { return kbit::pdl_mode(); }

extern "C" unsigned long long kbit_stream_capture_id(void* stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  if (cudaStreamGetCaptureInfo(static_cast<cudaStream_t>(stream), &status, &id) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return status == cudaStreamCaptureStatusActive ? id : 0;
}
