// Device helpers shared by every kbit kernel: dtype conversion, absmax decode, layout indexing,
// and the device guard used by the C launchers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

#include <type_traits>

#include "kbit.h"

namespace kbit {

constexpr int kBlock = 32;       // values per quantization block
constexpr int kTileBlocks = 2;   // blocks per k-tile of the tiled64 layout

template <typename T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Two values rounded to T (fp16 / bf16) and packed into one 32-bit word (lo in the low half),
// as the tensor-core operands and paired stores take them.
template <typename T> struct Pair;
template <> struct Pair<__half> {
  using type = __half2;
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};
template <> struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};

// E4M4: byte = e << 4 | m; e == 0: m * 2^-14; else (16 + m) * 2^(e - 15). Built from bits,
// no branch on the data path besides a select.
__device__ __forceinline__ float e4m4_decode(uint32_t code) {
  uint32_t e = code >> 4, m = code & 15u;
  float normal = __uint_as_float(((e + 116u) << 23) | (m << 19));  // (1 + m/16) * 2^(e-11)
  float sub = float(m) * 0x1p-14f;
  return e ? normal : sub;
}

// Round v in [0, 31] to the nearest E4M4 code, ties to even (see kbit/format.py: e4m4_encode).
__device__ __forceinline__ uint32_t e4m4_encode(float v) {
  if (v < 0x1p-10f) return uint32_t(rintf(v * 0x1p14f));  // subnormal; 16 means 2^-10 = code 16
  int E;
  float f = frexpf(v, &E);                      // v = f * 2^E, f in [0.5, 1)
  uint32_t m = uint32_t(rintf((2.f * f - 1.f) * 16.f));  // ties to even mantissa
  uint32_t e = uint32_t(E + 10);
  return (e << 4) + m;                          // m == 16 carries into the exponent
}

// A read-only load: STREAM = true marks the line evict-first in L1 and L2 (ld.global.cs, for
// data a call reads once), else the non-coherent cached path (ld.global.nc).
template <bool STREAM, typename V>
__device__ __forceinline__ V load_ro(const V* p) {
  if constexpr (STREAM) return __ldcs(p);
  else return __ldg(p);
}

// A kernel's absmax format as a template argument: kRuntimeFmt reads it from the kernel's
// argument (one kernel for every format); a KBIT_ABSMAX_* value fixes it at compile time, so
// the format's branches around every scale load and decode vanish. wgmma.cu compiles E4M4
// (the format quantize writes by default) and kRuntimeFmt; mma.cu every format. The GEMV keeps
// kRuntimeFmt: E4M4 kernels there measured 0.1-1 us faster or slower per (k, M) as ptxas
// scheduled each instantiation differently (NOTES.md v54).
constexpr int kRuntimeFmt = -1;

// Bytes of one stored absmax element in `format` (E4M4 1, fp16 2, fp32 4).
__host__ __device__ constexpr int absmax_bytes(int format) {
  return format == KBIT_ABSMAX_E4M4 ? 1 : format == KBIT_ABSMAX_F16 ? 2 : 4;
}

// A stored absmax element in two halves, so that the load can be issued long before its value
// is used: the stored bits (zero-extended), then their scale (without the per-tensor power of
// two).
template <bool STREAM = false>
__device__ __forceinline__ uint32_t load_absmax_bits(const void* absmax, int format, int64_t i) {
  if (format == KBIT_ABSMAX_E4M4) return load_ro<STREAM>(static_cast<const uint8_t*>(absmax) + i);
  if (format == KBIT_ABSMAX_F16) return load_ro<STREAM>(static_cast<const unsigned short*>(absmax) + i);
  return __float_as_uint(load_ro<STREAM>(static_cast<const float*>(absmax) + i));
}
// The same, or 0 when !valid (scale 0: the block decodes to zeros whatever its words). The load
// is predicated, not followed by a select: `valid ? bits : 0` right after the load made the
// warp wait for the load there, because ptxas does not sink the select out of its basic block
// (ncu source counters, NOTES.md v31: mma's ring items each paid their full latency before the
// table build or the next decode).
template <bool STREAM = false>
__device__ __forceinline__ uint32_t load_absmax_bits_if(const void* absmax, int format, int64_t i, bool valid) {
  uint32_t bits = 0u;
  if (valid) bits = load_absmax_bits<STREAM>(absmax, format, i);
  return bits;
}
__device__ __forceinline__ float absmax_of_bits(uint32_t bits, int format) {
  if (format == KBIT_ABSMAX_E4M4) return e4m4_decode(bits);
  if (format == KBIT_ABSMAX_F16) return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  return __uint_as_float(bits);
}
// Stored absmax element -> float scale (without the per-tensor power of two).
__device__ __forceinline__ float load_absmax(const void* absmax, int format, int64_t i) {
  return absmax_of_bits(load_absmax_bits(absmax, format, i), format);
}

// Index of block (n, kb) of an [N, KB] weight in a layout, counted in blocks.
__device__ __forceinline__ int64_t block_index(int layout, int64_t n, int64_t kb, int64_t N,
                                               int64_t KB) {
  if (layout == KBIT_LAYOUT_FLAT) return n * KB + kb;
  return ((kb / kTileBlocks) * N + n) * kTileBlocks + (kb % kTileBlocks);
}

// The codebook of a dequantizing kernel in shared memory, and the 16-entry "spread" table that
// turns bit-planes into codebook offsets (codebook_offsets). Threads 0 .. 2^k - 1 and 0 .. 15
// write; the caller synchronizes.
template <int K_BITS>
__device__ __forceinline__ void fill_codebook_tables(float* cb, uint32_t* spread, const float* __restrict__ codebook) {
  if (threadIdx.x < (1 << K_BITS)) cb[threadIdx.x] = codebook[threadIdx.x];
  if (threadIdx.x < 16) {
    uint32_t v = threadIdx.x, s = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) s |= ((v >> j) & 1u) << (8 * j + 2);
    spread[threadIdx.x] = s;
  }
}

// Byte offsets into the float codebook of 8 values: bytes[b] holds plane b's bits of the 8
// values in its low byte. spread[v] for a 4-bit v holds bit j of v at bit 8j + 2, so OR-ing
// spread[nibble of plane b] << b over the planes gives, in byte j of lo (hi), 4 * the index
// of value j (j + 4). Two shared loads per plane replace 4 bit extractions per plane and value
// (the dequantizer was issue-bound on them).
template <int K_BITS>
__device__ __forceinline__ void codebook_offsets(const uint32_t (&bytes)[K_BITS], const uint32_t* spread,
                                                 uint32_t& lo, uint32_t& hi) {
  lo = 0;
  hi = 0;
#pragma unroll
  for (int b = 0; b < K_BITS; b++) {
    lo |= spread[bytes[b] & 15u] << b;
    hi |= spread[(bytes[b] >> 4) & 15u] << b;
  }
}

// Swap the bits of a at positions (mask << d) with the bits of b at positions mask.
__device__ __forceinline__ void delta_swap(uint32_t& a, uint32_t& b, int d, uint32_t mask) {
  const uint32_t t = ((a >> d) ^ b) & mask;
  b ^= t;
  a ^= t << d;
}

// The 4x4 bit transpose within every nibble of 4 words (k = 3 passes w3 = 0): afterwards
// nibble j of word r holds the index of value 4j + r.
__device__ __forceinline__ void nibble_transpose(uint32_t& n0, uint32_t& n1, uint32_t& n2, uint32_t& n3) {
  delta_swap(n0, n2, 2, 0x33333333u); delta_swap(n1, n3, 2, 0x33333333u);
  delta_swap(n0, n1, 1, 0x55555555u); delta_swap(n2, n3, 1, 0x55555555u);
}

// Makes `device` current for the launcher's scope and restores the caller's device after.
struct DeviceGuard {
  int previous = -1;
  cudaError_t err = cudaSuccess;
  explicit DeviceGuard(int device) {
    err = cudaGetDevice(&previous);
    if (err == cudaSuccess && previous != device) err = cudaSetDevice(device);
    else previous = -1;
  }
  ~DeviceGuard() {
    if (previous >= 0) cudaSetDevice(previous);
  }
};

// The extern "C" entry of a small-M kernel (kbit_gemv, kbit_mma): make `device` current,
// return at once for an empty problem, reject M > max_m, then call launch(T{}) with T the
// activation type of `dtype` (fp16 or bf16).
template <typename Launch>
int small_m_entry(int device, int dtype, int64_t M, int64_t N, int64_t max_m, Launch&& launch) {
  DeviceGuard guard(device);
  if (guard.err != cudaSuccess) return guard.err;
  if (M == 0 || N == 0) return cudaSuccess;
  if (M > max_m) return cudaErrorInvalidValue;
  switch (dtype) {
    case KBIT_F16: return launch(__half());
    case KBIT_BF16: return launch(__nv_bfloat16());
  }
  return cudaErrorInvalidValue;
}

// A split kernel's global workspace (wgmma's stream-K, mma's split-K): from the caller, one
// per stream or captured graph, zeroed before its first use; every call leaves it zeroed as
// far as the next call relies on it. `need` (a query, kbit_*_workspace_bytes): launch
// nothing, set *need to the bytes the call would use (0: it would not split).
struct Workspace {
  void* ptr;
  int64_t bytes;
  int64_t* need;
  int64_t* cost = nullptr;  // wgmma: dry query of the split model's cost (launch_bits' TN = 32 rule)
  // mma: the caller's KBIT_MMA_WEIGHTS_STABLE (no kernel still in flight wrote the weights:
  // the first ones may be requested before the PDL wait)
  bool weights_stable = false;
};

// Once per kernel and device (the attribute belongs to the current device's context): allow
// Kernel `bytes` of dynamic shared memory (the first call's bytes; callers pass a per-device
// constant).
template <auto Kernel>
cudaError_t smem_optin(int device, int bytes) {
  static cudaError_t err[64];
  static bool done[64] = {};
  if (device < 0 || device >= 64) return cudaErrorInvalidDevice;
  if (!done[device]) {
    err[device] = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    done[device] = true;
  }
  return err[device];
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// n / d and n % d for a fixed d >= 1 and n < 2^32 with a multiply-high instead of a division
// (an integer division is ~20 instructions; the persistent kernels do one per work item).
struct FastDivmod {
  uint32_t d, magic, shift;
  explicit FastDivmod(uint32_t divisor) : d(divisor) {
    shift = 0;
    while ((uint64_t(1) << shift) < divisor) shift++;
    magic = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << shift) - divisor)) / divisor + 1);
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const {
    return uint32_t((uint64_t(__umulhi(n, magic)) + n) >> shift);
  }
};

// CTAs of `kernel` (with `threads` threads, no dynamic shared memory) that fit on one SM.
template <typename Kernel>
inline int ctas_per_sm(Kernel kernel, int threads) {
  int blocks = 1;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, 0);
  return blocks > 0 ? blocks : 1;
}

// The k plane words of one block, loaded with the widest aligned vector load: blocks start at
// multiples of k words, so k = 4 is one 16-byte load and k = 2 one 8-byte load.
template <int K_BITS, bool STREAM = false>
__device__ __forceinline__ void load_words(uint32_t (&w)[K_BITS], const int32_t* src) {
  if constexpr (K_BITS == 4) {
    const int4 v = load_ro<STREAM>(reinterpret_cast<const int4*>(src));
    w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
  } else if constexpr (K_BITS == 2) {
    const int2 v = load_ro<STREAM>(reinterpret_cast<const int2*>(src));
    w[0] = v.x; w[1] = v.y;
  } else {
#pragma unroll
    for (int b = 0; b < K_BITS; b++) w[b] = uint32_t(load_ro<STREAM>(src + b));
  }
}

// Persistent grid: one wave of `per_sm` CTAs on every SM of the current device, at most
// `ctas_needed` (and at least 1).
inline unsigned persistent_grid(int per_sm, int64_t ctas_needed) {
  int device = 0, sms = 1;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const int64_t cap = int64_t(sms) * per_sm;
  return unsigned(ctas_needed < cap ? (ctas_needed > 0 ? ctas_needed : 1) : cap);
}

// Programmatic dependent launch (PDL, sm_90+). A kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may start while the previous kernel of
// its stream is still running, as soon as every CTA of that kernel has called pdl_trigger
// (or exited). Until pdl_wait returns (the previous grid has completed and its writes are
// visible) such a kernel must not read memory another kernel may write (x, bias, even the
// weights and codebook: a repack may have just written them) nor write any output; it may
// set up shared memory. Launched
// without the attribute, both are no-ops. Compiled for pre-sm_90 targets they are empty, so
// the launchers set the attribute only for kernels whose binary is sm_90+ (has_sm90_code).
// scripts/pdl_floor.cu and NOTES.md (v16) have what it buys.
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// KBIT_PDL (read once per process): 0 launches the kernels without PDL; 1 (default, and any
// other value) with PDL (wait before the first global access; mma and wgmma trigger at entry,
// gemv after its main loop). H100, M = 1, k = 4, dense TOTAL vs fp16 (NOTES.md v16):
// back-to-back kbit calls 1.53x (off) / 1.82x (on); each call after a kernel launched without
// PDL 1.54x / 1.51x. (Mode 2, L2 prefetches of the first weights before the wait, was no
// faster back-to-back on the v46 kernels and 6-12% slower after a plain kernel: removed, v47.)
// An integer from the environment (experiment and mode switches), `fallback` when unset or empty.
inline int env_int(const char* name, int fallback) {
  const char* e = getenv(name);
  return e != nullptr && *e != '\0' ? atoi(e) : fallback;
}
inline int pdl_mode() {
  static const int mode = env_int("KBIT_PDL", 1) != 0 ? 1 : 0;
  return mode;
}

// Once per kernel and device: whether the code the device runs was compiled for sm_90+ (bulk
// copies, PDL), not JIT-compiled from an older target's PTX (binaryVersion would report the
// device's arch then; ptxVersion reports the target the code was written for).
template <auto Kernel>
bool has_sm90_code(int device) {
  static signed char known[64] = {};  // 0 unknown, 1 yes, -1 no (per device)
  if (device < 0 || device >= 64) return false;
  if (known[device] == 0) {
    cudaFuncAttributes attr;
    known[device] = cudaFuncGetAttributes(&attr, Kernel) == cudaSuccess && attr.ptxVersion >= 90 ? 1 : -1;
  }
  return known[device] == 1;
}

// The PDL mode a launch of `Kernel` on `device` takes (pdl_mode, or 0 without sm_90 code).
template <auto Kernel>
int pdl_for(int device) {
  const int mode = pdl_mode();
  return mode > 0 && has_sm90_code<Kernel>(device) ? mode : 0;
}

// The launch attribute for clusters of `size` CTAs along grid dimension `axis` (0 = x .. 2 = z).
inline cudaLaunchAttribute cluster_attribute(int size, int axis) {
  cudaLaunchAttribute a;
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = axis == 0 ? unsigned(size) : 1u;
  a.val.clusterDim.y = axis == 1 ? unsigned(size) : 1u;
  a.val.clusterDim.z = axis == 2 ? unsigned(size) : 1u;
  return a;
}

// cudaLaunchKernelEx of `kernel` with cfg's grid, block, shared memory and stream, plus the
// attributes kbit launches with: clusters of `cluster` CTAs along grid dimension `axis` when
// cluster > 1 (the split-K variants) and PDL when pdl > 0 (pdl_for). A driver that refuses a
// combination fails the launch with its error; there is no silent fallback (the H100 takes
// clusters and PDL together: NOTES.md v17).
template <typename... Params, typename... Args>
cudaError_t launch_kernel(cudaLaunchConfig_t cfg, int cluster, int axis, int pdl, void (*kernel)(Params...),
                          Args&&... args) {
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cluster > 1) attr[n++] = cluster_attribute(cluster, axis);
  if (pdl > 0) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    n++;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Args&&>(args)...);
}

// Per-device limits the launchers need on every call, read once per device (a few
// cudaDeviceGetAttribute calls cost microseconds of host time at M = 1).
struct DeviceInfo {
  int sms = 1, smem_per_sm = 0, smem_optin = 48 * 1024, smem_reserved = 0;
};
inline const DeviceInfo& device_info(int device) {
  static DeviceInfo info[64];
  static bool ready[64] = {};
  if (device < 0 || device >= 64) device = 0;
  if (!ready[device]) {
    DeviceInfo d;
    cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, device);
    cudaDeviceGetAttribute(&d.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
    cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    cudaDeviceGetAttribute(&d.smem_reserved, cudaDevAttrReservedSharedMemoryPerBlock, device);
    info[device] = d;
    ready[device] = true;
  }
  return info[device];
}

}  // namespace kbit
