// kbit native library: plain C interface, loaded from Python with ctypes (kbit/_lib.py).
// No torch headers: one build serves any torch version. Every function launches on the given
// stream of the given device, never synchronises, and returns a cudaError_t value (0 = success);
// kbit_error_string turns it into text. Argument validation happens in Python (kbit/ops.py);
// these functions trust their arguments.
#pragma once
#include <stdint.h>

#define KBIT_API __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

// dtype codes shared with kbit/_lib.py
enum { KBIT_F32 = 0, KBIT_F16 = 1, KBIT_BF16 = 2 };
// absmax storage formats
enum { KBIT_ABSMAX_E4M4 = 0, KBIT_ABSMAX_F16 = 1, KBIT_ABSMAX_F32 = 2 };
// packed layouts (docs/format.md, kbit/reference.py: repack)
enum { KBIT_LAYOUT_FLAT = 0, KBIT_LAYOUT_TILED64 = 1 };

KBIT_API int kbit_abi_version(void);
KBIT_API const char* kbit_error_string(int err);
// Programmatic dependent launch mode of gemv, mma and wgmma (environment variable KBIT_PDL,
// read once per process; default 1): 0 off, 1 on (any other value is read as 1; the L2 prefetch
// modes 2 and 3 were removed, NOTES.md v47).
KBIT_API int kbit_pdl_mode(void);

// weight [N, K] (row stride ld elements, unit column stride) -> packed int32 [N, KB, k] and
// absmax [N, KB] in absmax_format. status int32[3] must be zeroed by the caller; the kernel
// ORs 1 into status[0] on a NaN/Inf, into status[1] on a block absmax out of range and into
// status[2] when the codebook breaks the rules (ascending, >= 2^-20 apart, within [-1, 1]).
KBIT_API int kbit_quantize(int device, void* stream, const void* weight, int weight_dtype, int64_t N,
                  int64_t K, int64_t ld, const float* codebook, int k, int absmax_format,
                  int absmax_exponent, int32_t* packed, void* absmax, int32_t* status);

// packed + absmax (layout) -> out [N, K] row-major contiguous, out_dtype.
KBIT_API int kbit_dequantize(int device, void* stream, const int32_t* packed, const void* absmax,
                    int absmax_format, const float* codebook, int k, int64_t N, int64_t K,
                    int layout, int absmax_exponent, void* out, int out_dtype);

// flat <-> layout. to_layout = 1: flat -> layout; 0: layout -> flat. absmax_bytes = 1, 2 or 4.
KBIT_API int kbit_repack(int device, void* stream, const int32_t* packed_in, const void* absmax_in,
                int absmax_bytes, int k, int64_t N, int64_t K, int layout, int to_layout,
                int32_t* packed_out, void* absmax_out);

// C[M, N] = x[M, K] @ W^T (+ bias[N]) for 1 <= M <= 4; W in the tiled64 layout; x rows ldx
// elements apart (unit column stride), out rows ldo apart; dtype fp16 or bf16 for x, bias
// (may be NULL) and out. flags: as kbit_mma's (KBIT_WEIGHTS_STABLE, below: the codebook and
// the first weights are requested before the PDL wait).
KBIT_API int kbit_gemv(int device, void* stream, const void* x, int dtype, int64_t M, int64_t ldx,
                       const int32_t* packed, const void* absmax, int absmax_format,
                       const float* codebook, int k, int64_t N, int64_t K, int absmax_exponent,
                       const void* bias, void* out, int64_t ldo, int flags);

// Same contract as kbit_gemv for 1 <= M <= 64, on tensor cores (mma.sync, sm_80+). x is
// staged in shared memory, whole (M * (128 * ceil(K / 128) + 16) * 2 bytes at most
// kbit_mma_max_x_bytes()) or split over K between 2, 4 or 8 CTAs that add their partial sums
// through `workspace` (kbit_mma_ksplit: the split a call gets). workspace: at least
// kbit_mma_workspace_bytes(...) bytes for this call (0: the call does not split; NULL is
// fine), 16-byte aligned, zeroed once before its first use and then used by one stream (or
// one CUDA graph) at a time: every call leaves it zeroed. Without one the call does not split
// K. When no plan fits the device's opt-in shared memory (kbit_mma_smem_bytes returns 0), or
// the workspace is too small or misaligned, the call returns cudaErrorInvalidValue without
// launching.
// flags: KBIT_WEIGHTS_STABLE promises that no kernel which may still be running (or
// flushing its writes) when this call is launched wrote packed, absmax or codebook; under PDL
// the kernel then requests its first weights before it waits for the previous kernel (wrong
// results if the promise is broken). 0 waits before every read.
#define KBIT_WEIGHTS_STABLE 1
#define KBIT_MMA_WEIGHTS_STABLE KBIT_WEIGHTS_STABLE
KBIT_API int kbit_mma(int device, void* stream, const void* x, int dtype, int64_t M, int64_t ldx,
                      const int32_t* packed, const void* absmax, int absmax_format,
                      const float* codebook, int k, int64_t N, int64_t K, int absmax_exponent,
                      const void* bias, void* out, int64_t ldo, void* workspace, int64_t workspace_bytes,
                      int flags);
// The workspace bytes kbit_mma would use for this call (0: none; it would not split K).
KBIT_API int64_t kbit_mma_workspace_bytes(int device, int k, int64_t M, int64_t N, int64_t K);
KBIT_API int kbit_mma_max_x_bytes(void);
// Shared memory a kbit_mma call with these sizes (and a workspace) needs on `device` (dtype:
// KBIT_F16/KBIT_BF16), or 0 when the kernel cannot take it (M outside 1..64, x too large to
// stage).
KBIT_API int64_t kbit_mma_smem_bytes(int device, int dtype, int k, int64_t M, int64_t N, int64_t K);
// K-slices of that call's plan: 1 (no split), 2, 4 or 8; 0 when the kernel cannot take it.
KBIT_API int kbit_mma_ksplit(int device, int k, int64_t M, int64_t N, int64_t K);
// Forces that count (1, 2, 4, 8) for the whole process, 0 = automatic (tests, experiments).
KBIT_API void kbit_mma_force_ksplit(int S);
// The M = 1 scalar GEMV's coalesced variant with `rows` rows (8, 16, 32) and `warps` warps
// (1..8) per CTA wherever it can run, for the whole process; 0 = automatic, -1 = never (tests,
// experiments; starts from the environment variable KBIT_GEMV_ROWS="rows,warps[,groups]").
// groups > 1 (M = 1 only): `groups` groups of `rows` rows per CTA, warps / groups warps each;
// instantiated for 8 rows x 5 groups on 10 or 20 warps (ABI 12).
KBIT_API void kbit_gemv_force_rows(int rows, int warps, int groups);
// The M = 1, k = 2..4 GEMV on tensor cores (gemv_tc_kernel; E4M4 scales) where it applies: 1 = on,
// 0 = off (the coalesced variant above), -1 = the environment variable KBIT_GEMV_TC if set, else
// the build's default; for the whole process (tests, experiments) (ABI 13).
KBIT_API void kbit_gemv_force_tc(int on);
KBIT_API int kbit_device_smem_optin(int device);

// Same contract as kbit_gemv for any M >= 1 on Hopper's warpgroup MMA (csrc/wgmma.cu): needs a
// compute capability 9.0 device and sm_90a code (kbit_wgmma_available), N % 8 == 0, K % 8 == 0,
// x, packed and absmax 16-byte aligned, ldx % 8 == 0 (otherwise cudaErrorNotSupported / cudaErrorInvalidValue without launching).
// workspace (may be null): at least kbit_wgmma_workspace_bytes(...) bytes for this call,
// zeroed once before its first use and then used by one stream (or one CUDA graph) at a time:
// every call leaves it as it found it. With it the kernel may split K stream-K style (partial
// tiles through global memory); without it, it does not. flags: as kbit_mma's
// (KBIT_WEIGHTS_STABLE: the codebook is requested before the PDL wait).
KBIT_API int kbit_wgmma(int device, void* stream, const void* x, int dtype, int64_t M, int64_t ldx,
                        const int32_t* packed, const void* absmax, int absmax_format,
                        const float* codebook, int k, int64_t N, int64_t K, int absmax_exponent,
                        const void* bias, void* out, int64_t ldo, void* workspace, int64_t workspace_bytes,
                        int flags);
// One call of kbit_gemv, kbit_mma or kbit_wgmma (kernel: KBIT_CALL_*) with its arguments in one
// block of KBIT_CALL_ARGS int64 values, in kbit_mma's order (pointers as integers, 0 for NULL;
// kbit_gemv ignores args[17] and args[18], the workspace). For callers where converting 20
// arguments per call costs more than the call (Python ctypes: ~2-4 us of an eager call's host
// time, NOTES.md v59).
enum { KBIT_CALL_GEMV = 0, KBIT_CALL_MMA = 1, KBIT_CALL_WGMMA = 2 };
#define KBIT_CALL_ARGS 20
KBIT_API int kbit_small_m_call(int kernel, const int64_t* args);
// The workspace bytes kbit_wgmma would use for this call (0: none; it would not run stream-K).
KBIT_API int64_t kbit_wgmma_workspace_bytes(int device, int dtype, int64_t M, int64_t K, int64_t N, int k,
                                            int absmax_format);
// The id of the CUDA-graph capture under way on `stream` (0: none).
KBIT_API unsigned long long kbit_stream_capture_id(void* stream);
// 1 when the last kbit_wgmma launch of the process ran stream-K (tests).
KBIT_API int kbit_wgmma_last_streamk(void);
KBIT_API int kbit_wgmma_available(int device);
// Forces the configuration of every kbit_wgmma launch: tn tokens per CTA (32, 64, 128, 256),
// wg warpgroups of 64 weight rows (1, 2), K split over a cluster of `splits` CTAs (1..8),
// k = 5's codebook table (1: the 64 KB one, 2: the 128 KB conflict-free one, one CTA per SM);
// 0 = automatic (tests, experiments).
KBIT_API void kbit_wgmma_force_config(int tn, int wg, int splits, int table);

#ifdef __cplusplus
}
#endif
