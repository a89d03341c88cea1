// Library-wide entry points of the C interface (kbit.h).
#include "common.cuh"

extern "C" int kbit_abi_version(void) { return 13; }

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

extern "C" int kbit_small_m_call(int kernel, const int64_t* a) {
  const auto ptr = [&](int i) { return reinterpret_cast<void*>(static_cast<intptr_t>(a[i])); };
  const auto x = static_cast<const void*>(ptr(2));
  const auto packed = static_cast<const int32_t*>(ptr(6));
  const auto codebook = static_cast<const float*>(ptr(9));
  switch (kernel) {
    case KBIT_CALL_GEMV:
      return kbit_gemv(int(a[0]), ptr(1), x, int(a[3]), a[4], a[5], packed, ptr(7), int(a[8]), codebook, int(a[10]),
                       a[11], a[12], int(a[13]), ptr(14), ptr(15), a[16], int(a[19]));
    case KBIT_CALL_MMA:
      return kbit_mma(int(a[0]), ptr(1), x, int(a[3]), a[4], a[5], packed, ptr(7), int(a[8]), codebook, int(a[10]),
                      a[11], a[12], int(a[13]), ptr(14), ptr(15), a[16], ptr(17), a[18], int(a[19]));
    case KBIT_CALL_WGMMA:
      return kbit_wgmma(int(a[0]), ptr(1), x, int(a[3]), a[4], a[5], packed, ptr(7), int(a[8]), codebook, int(a[10]),
                        a[11], a[12], int(a[13]), ptr(14), ptr(15), a[16], ptr(17), a[18], int(a[19]));
  }
  return cudaErrorInvalidValue;
}
