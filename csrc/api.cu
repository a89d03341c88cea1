// Library-wide entry points of the C interface (kbit.h).
#include "common.cuh"

extern "C" int kbit_abi_version(void) { return 7; }

extern "C" const char* kbit_error_string(int err) {
  return cudaGetErrorString(static_cast<cudaError_t>(err));
}

extern "C" int kbit_pdl_mode(void) { return kbit::pdl_mode(); }
