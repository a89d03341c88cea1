"""The kbit ops, declared once with torch.library.

Each op has a functional form (`kbit::dequantize`) and an `out=` form (`kbit::dequantize_out`,
which writes into caller-provided tensors), a fake implementation for torch.compile, a
reference implementation (kbit/reference.py, any device) and a CUDA implementation (the native
library). CUDA kernels launch on the current stream of the input's device and never
synchronise with the host. Arguments are checked here, with errors naming the argument; the
native library trusts what it is given.
"""

from __future__ import annotations

import os
import weakref

import torch
from torch import Tensor

from . import _lib
from . import reference as ref
from .format import (
    ABSMAX_DTYPES,
    BLOCK_SIZE,
    LAYOUTS,
    MAX_ABSMAX_EXPONENT,
    absmax_format_of,
    check_absmax_format,
    layout_shapes,
    num_blocks,
)

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# ----------------------------------------------------------------------------- checks


def _check_tensor(name: str, t, dtypes, shape=None, device=None) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} has dtype {t.dtype}; expected one of {list(dtypes)}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {list(t.shape)}; expected {list(shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}; expected {device} (same device as the weight)")


def _check_k_from_codebook(codebook: Tensor, device) -> int:
    _check_tensor("codebook", codebook, (torch.float32,), device=device)
    n = codebook.numel()
    k = n.bit_length() - 1
    if codebook.dim() != 1 or k not in (2, 3, 4, 5) or n != 2**k:
        raise ValueError(f"codebook must have shape [2**k] for k in 2..5, got {list(codebook.shape)}")
    return k


def _check_exponent(absmax_exponent: int) -> None:
    if not isinstance(absmax_exponent, int) or abs(absmax_exponent) > MAX_ABSMAX_EXPONENT:
        raise ValueError(
            f"absmax_exponent must be an int in [-{MAX_ABSMAX_EXPONENT}, {MAX_ABSMAX_EXPONENT}], "
            f"got {absmax_exponent!r}"
        )


def _check_quantize(weight, codebook, absmax_format, absmax_exponent) -> int:
    _check_tensor("weight", weight, FLOAT_DTYPES)
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D [N, K], got shape {list(weight.shape)}")
    k = _check_k_from_codebook(codebook, weight.device)
    check_absmax_format(absmax_format)
    _check_exponent(absmax_exponent)
    return k


def _check_packed(packed, absmax, codebook, n, kdim, layout) -> int:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if n < 0 or kdim < 0:
        raise ValueError(f"N and K must be >= 0, got N={n}, K={kdim}")
    _check_tensor("packed", packed, (torch.int32,))
    k = _check_k_from_codebook(codebook, packed.device)
    packed_shape, absmax_shape = layout_shapes(layout, n, kdim, k)
    _check_tensor("packed", packed, (torch.int32,), packed_shape)
    _check_tensor("absmax", absmax, tuple(ABSMAX_DTYPES.values()), absmax_shape, packed.device)
    if not (packed.is_contiguous() and absmax.is_contiguous()):
        raise ValueError("packed and absmax must be contiguous")
    return k


def _check_out(name: str, out: Tensor, dtypes, shape, device) -> None:
    _check_tensor(name, out, dtypes, shape, device)
    if not out.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


# ----------------------------------------------------------------------------- quantize


def _quantize_cuda_into(weight, codebook, absmax_format, absmax_exponent, packed, absmax, status):
    lib = _lib.native(weight)
    if lib is None:
        return _quantize_ref_into(weight, codebook, absmax_format, absmax_exponent, packed, absmax, status)
    if weight.stride(-1) != 1 and weight.numel() > 0:
        weight = weight.contiguous()
    n, kdim = weight.shape
    dev, stream = _lib.stream_of(weight)
    rc = lib.kbit_quantize(
        dev, stream, weight.data_ptr(), _lib.DTYPE_CODES[weight.dtype], n, kdim,
        weight.stride(0) if n > 1 else kdim, codebook.data_ptr(), codebook.numel().bit_length() - 1,
        _lib.ABSMAX_CODES[absmax_format], absmax_exponent, packed.data_ptr(), absmax.data_ptr(),
        status.data_ptr(),
    )
    _lib.check(rc, "quantize")


def _quantize_ref_into(weight, codebook, absmax_format, absmax_exponent, packed, absmax, status):
    if weight.numel() == 0:
        return
    p, a, s = ref.quantize(weight, codebook, absmax_format, absmax_exponent)
    packed.copy_(p)
    absmax.copy_(a)
    status.copy_(torch.maximum(status, s))


def _quantize_shapes(weight, codebook, absmax_format):
    n, kdim = weight.shape
    k = codebook.numel().bit_length() - 1
    kb = num_blocks(kdim)
    return (n, kb, k), (n, kb), ABSMAX_DTYPES[absmax_format]


@torch.library.custom_op("kbit::quantize", mutates_args=())
def quantize(
    weight: Tensor, codebook: Tensor, absmax_format: str, absmax_exponent: int
) -> tuple[Tensor, Tensor, Tensor]:
    """weight [N, K] -> (packed int32 [N, KB, k], absmax [N, KB], status int32 [3]).

    status[0] != 0: the weight has NaN/Inf; status[1] != 0: a block absmax * 2**-exponent is
    outside the absmax format's range; status[2] != 0: the codebook breaks the format's rules
    (not ascending, entries < 2**-20 apart, outside [-1, 1]). Checked on the device, so the op
    never syncs; the caller must check status (kbit.quantize does).
    """
    _check_quantize(weight, codebook, absmax_format, absmax_exponent)
    ps, as_, adt = _quantize_shapes(weight, codebook, absmax_format)
    packed = torch.empty(ps, dtype=torch.int32, device=weight.device)
    absmax = torch.empty(as_, dtype=adt, device=weight.device)
    status = torch.zeros(3, dtype=torch.int32, device=weight.device)
    _quantize_ref_into(weight, codebook, absmax_format, absmax_exponent, packed, absmax, status)
    return packed, absmax, status


@quantize.register_kernel("cuda")
def _(weight, codebook, absmax_format, absmax_exponent):
    _check_quantize(weight, codebook, absmax_format, absmax_exponent)
    ps, as_, adt = _quantize_shapes(weight, codebook, absmax_format)
    packed = torch.empty(ps, dtype=torch.int32, device=weight.device)
    absmax = torch.empty(as_, dtype=adt, device=weight.device)
    status = torch.zeros(3, dtype=torch.int32, device=weight.device)
    _quantize_cuda_into(weight, codebook, absmax_format, absmax_exponent, packed, absmax, status)
    return packed, absmax, status


@quantize.register_fake
def _(weight, codebook, absmax_format, absmax_exponent):
    ps, as_, adt = _quantize_shapes(weight, codebook, absmax_format)
    return (
        weight.new_empty(ps, dtype=torch.int32),
        weight.new_empty(as_, dtype=adt),
        weight.new_empty(3, dtype=torch.int32),
    )


def _check_quantize_out(weight, codebook, absmax_format, absmax_exponent, packed, absmax, status):
    _check_quantize(weight, codebook, absmax_format, absmax_exponent)
    ps, as_, adt = _quantize_shapes(weight, codebook, absmax_format)
    _check_out("packed", packed, (torch.int32,), ps, weight.device)
    _check_out("absmax", absmax, (adt,), as_, weight.device)
    _check_out("status", status, (torch.int32,), (3,), weight.device)


@torch.library.custom_op("kbit::quantize_out", mutates_args=("packed", "absmax", "status"))
def quantize_out(
    weight: Tensor, codebook: Tensor, absmax_format: str, absmax_exponent: int,
    packed: Tensor, absmax: Tensor, status: Tensor,
) -> None:
    """`quantize` into caller-provided tensors. status is ORed into, not cleared."""
    _check_quantize_out(weight, codebook, absmax_format, absmax_exponent, packed, absmax, status)
    _quantize_ref_into(weight, codebook, absmax_format, absmax_exponent, packed, absmax, status)


@quantize_out.register_kernel("cuda")
def _(weight, codebook, absmax_format, absmax_exponent, packed, absmax, status):
    _check_quantize_out(weight, codebook, absmax_format, absmax_exponent, packed, absmax, status)
    _quantize_cuda_into(weight, codebook, absmax_format, absmax_exponent, packed, absmax, status)


# ----------------------------------------------------------------------------- dequantize


def _dequantize_ref_into(packed, absmax, codebook, n, kdim, layout, absmax_exponent, out):
    if n == 0 or kdim == 0:
        return
    out.copy_(ref.dequantize(packed, absmax, codebook, (n, kdim), layout, absmax_exponent, out.dtype))


def _dequantize_cuda_into(packed, absmax, codebook, n, kdim, layout, absmax_exponent, out):
    lib = _lib.native(packed)
    if lib is None:
        return _dequantize_ref_into(packed, absmax, codebook, n, kdim, layout, absmax_exponent, out)
    dev, stream = _lib.stream_of(packed)
    rc = lib.kbit_dequantize(
        dev, stream, packed.data_ptr(), absmax.data_ptr(), _lib.ABSMAX_CODES[absmax_format_of(absmax)],
        codebook.data_ptr(), codebook.numel().bit_length() - 1, n, kdim, _lib.LAYOUT_CODES[layout],
        absmax_exponent, out.data_ptr(), _lib.DTYPE_CODES[out.dtype],
    )
    _lib.check(rc, "dequantize")


def _check_dequantize(packed, absmax, codebook, n, kdim, layout, absmax_exponent, dtype):
    _check_packed(packed, absmax, codebook, n, kdim, layout)
    _check_exponent(absmax_exponent)
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be one of {list(FLOAT_DTYPES)}, got {dtype}")


@torch.library.custom_op("kbit::dequantize", mutates_args=())
def dequantize(
    packed: Tensor, absmax: Tensor, codebook: Tensor, n: int, kdim: int, layout: str,
    absmax_exponent: int, dtype: torch.dtype,
) -> Tensor:
    """Packed weight (flat or a runtime layout) -> [n, kdim] in dtype."""
    _check_dequantize(packed, absmax, codebook, n, kdim, layout, absmax_exponent, dtype)
    out = torch.empty(n, kdim, dtype=dtype, device=packed.device)
    _dequantize_ref_into(packed, absmax, codebook, n, kdim, layout, absmax_exponent, out)
    return out


@dequantize.register_kernel("cuda")
def _(packed, absmax, codebook, n, kdim, layout, absmax_exponent, dtype):
    _check_dequantize(packed, absmax, codebook, n, kdim, layout, absmax_exponent, dtype)
    out = torch.empty(n, kdim, dtype=dtype, device=packed.device)
    _dequantize_cuda_into(packed, absmax, codebook, n, kdim, layout, absmax_exponent, out)
    return out


@dequantize.register_fake
def _(packed, absmax, codebook, n, kdim, layout, absmax_exponent, dtype):
    return packed.new_empty((n, kdim), dtype=dtype)


def _check_dequantize_out(packed, absmax, codebook, n, kdim, layout, absmax_exponent, out):
    _check_tensor("out", out, FLOAT_DTYPES)
    _check_dequantize(packed, absmax, codebook, n, kdim, layout, absmax_exponent, out.dtype)
    _check_out("out", out, FLOAT_DTYPES, (n, kdim), packed.device)


@torch.library.custom_op("kbit::dequantize_out", mutates_args=("out",))
def dequantize_out(
    packed: Tensor, absmax: Tensor, codebook: Tensor, n: int, kdim: int, layout: str,
    absmax_exponent: int, out: Tensor,
) -> None:
    _check_dequantize_out(packed, absmax, codebook, n, kdim, layout, absmax_exponent, out)
    _dequantize_ref_into(packed, absmax, codebook, n, kdim, layout, absmax_exponent, out)


@dequantize_out.register_kernel("cuda")
def _(packed, absmax, codebook, n, kdim, layout, absmax_exponent, out):
    _check_dequantize_out(packed, absmax, codebook, n, kdim, layout, absmax_exponent, out)
    _dequantize_cuda_into(packed, absmax, codebook, n, kdim, layout, absmax_exponent, out)


# ----------------------------------------------------------------------------- repack


def _repack_cuda_into(packed, absmax, n, kdim, k, layout, to_layout, packed_out, absmax_out):
    lib = _lib.native(packed)
    if lib is None:
        return _repack_ref_into(packed, absmax, n, kdim, k, layout, to_layout, packed_out, absmax_out)
    if layout == "flat":
        packed_out.copy_(packed)
        absmax_out.copy_(absmax)
        return
    dev, stream = _lib.stream_of(packed)
    rc = lib.kbit_repack(
        dev, stream, packed.data_ptr(), absmax.data_ptr(), absmax.element_size(), k, n, kdim,
        _lib.LAYOUT_CODES[layout], int(to_layout), packed_out.data_ptr(), absmax_out.data_ptr(),
    )
    _lib.check(rc, "repack" if to_layout else "unrepack")


def _repack_ref_into(packed, absmax, n, kdim, k, layout, to_layout, packed_out, absmax_out):
    if n == 0 or kdim == 0:
        return
    fn = ref.repack if to_layout else ref.unrepack
    p, a = fn(packed, absmax, (n, kdim), k, layout)
    packed_out.copy_(p)
    absmax_out.copy_(a)


def _check_repack(packed, absmax, n, kdim, k, layout, to_layout):
    if k not in (2, 3, 4, 5):
        raise ValueError(f"k must be one of (2, 3, 4, 5), got {k}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    src_layout = "flat" if to_layout else layout
    ps, as_ = layout_shapes(src_layout, n, kdim, k)
    _check_tensor("packed", packed, (torch.int32,), ps)
    _check_tensor("absmax", absmax, tuple(ABSMAX_DTYPES.values()), as_, packed.device)
    if not (packed.is_contiguous() and absmax.is_contiguous()):
        raise ValueError("packed and absmax must be contiguous")
    return layout_shapes(layout if to_layout else "flat", n, kdim, k)


def _def_repack(name: str, to_layout: bool):
    doc = (
        "Flat bit-planes/absmax -> runtime `layout` (docs/format.md)."
        if to_layout
        else "Runtime `layout` -> flat bit-planes/absmax (inverse of repack)."
    )

    @torch.library.custom_op(f"kbit::{name}", mutates_args=())
    def op(packed: Tensor, absmax: Tensor, n: int, kdim: int, k: int, layout: str) -> tuple[Tensor, Tensor]:
        ps, as_ = _check_repack(packed, absmax, n, kdim, k, layout, to_layout)
        po, ao = packed.new_empty(ps), absmax.new_empty(as_)
        _repack_ref_into(packed, absmax, n, kdim, k, layout, to_layout, po, ao)
        return po, ao

    @op.register_kernel("cuda")
    def _(packed, absmax, n, kdim, k, layout):
        ps, as_ = _check_repack(packed, absmax, n, kdim, k, layout, to_layout)
        po, ao = packed.new_empty(ps), absmax.new_empty(as_)
        _repack_cuda_into(packed, absmax, n, kdim, k, layout, to_layout, po, ao)
        return po, ao

    @op.register_fake
    def _(packed, absmax, n, kdim, k, layout):
        ps, as_ = layout_shapes(layout if to_layout else "flat", n, kdim, k)
        return packed.new_empty(ps), absmax.new_empty(as_)

    @torch.library.custom_op(f"kbit::{name}_out", mutates_args=("packed_out", "absmax_out"))
    def op_out(
        packed: Tensor, absmax: Tensor, n: int, kdim: int, k: int, layout: str,
        packed_out: Tensor, absmax_out: Tensor,
    ) -> None:
        ps, as_ = _check_repack(packed, absmax, n, kdim, k, layout, to_layout)
        _check_out("packed_out", packed_out, (torch.int32,), ps, packed.device)
        _check_out("absmax_out", absmax_out, (absmax.dtype,), as_, packed.device)
        _repack_ref_into(packed, absmax, n, kdim, k, layout, to_layout, packed_out, absmax_out)

    @op_out.register_kernel("cuda")
    def _(packed, absmax, n, kdim, k, layout, packed_out, absmax_out):
        ps, as_ = _check_repack(packed, absmax, n, kdim, k, layout, to_layout)
        _check_out("packed_out", packed_out, (torch.int32,), ps, packed.device)
        _check_out("absmax_out", absmax_out, (absmax.dtype,), as_, packed.device)
        _repack_cuda_into(packed, absmax, n, kdim, k, layout, to_layout, packed_out, absmax_out)

    op.__doc__ = op_out.__doc__ = doc
    return op, op_out


repack, repack_out = _def_repack("repack", True)
unrepack, unrepack_out = _def_repack("unrepack", False)

__all__ = [
    "quantize", "quantize_out", "dequantize", "dequantize_out",
    "repack", "repack_out", "unrepack", "unrepack_out", "BLOCK_SIZE",
]


# ----------------------------------------------------------------------------- small-M matmul
# Three kernels compute out[M, N] = x[M, K] @ W^T (+ bias) for a tiled64 weight:
#   gemv:  scalar FMA kernel, M <= 4;
#   mma:   tensor-core kernel (mma.sync, weights decoded into registers), M <= 64, with x
#          staged in shared memory: whole, or split over K between 2, 4 or 8 CTAs that add
#          their partial sums through a workspace (mma_supports(), mma_ksplit());
#   wgmma: tiled GEMM on Hopper's warpgroup MMA (compute capability 9.0 only), any M, the
#          weights decoded into the wgmma's A registers, x read by TMA (wgmma_supports()).
# Each has a functional form and an `_out` form writing into a caller-provided [M, N] tensor.

GEMV_MAX_M = 4
MMA_MAX_M = 64
WGMMA_MAX_M = 2**31 - 1
MMA_MAX_KSPLIT = 8  # csrc/mma.cu kMaxKSlices: K-slices per row-group set at most
# csrc/mma.cu kMaxXSmem (staged x per CTA), read from the library when it is loaded
MMA_MAX_X_BYTES = _lib._lib.kbit_mma_max_x_bytes() if _lib.available() else 136 * 1024
ACT_DTYPES = (torch.float16, torch.bfloat16)



def mma_supports(m: int, kdim: int, n: int | None = None, k: int | None = None, device=None) -> bool:
    """Whether the tensor-core kernel takes x [m, kdim]. Given n, k and a CUDA device: the
    library's own rule (its launch plan fits the device's shared memory). Otherwise the
    loosest rule: a K-slice of x (K split MMA_MAX_KSPLIT ways at most) within
    MMA_MAX_X_BYTES."""
    steps = -(-kdim // 128)
    x_bytes = m * (-(-steps // MMA_MAX_KSPLIT) * 128 + 16) * 2
    if not (1 <= m <= MMA_MAX_M and x_bytes <= MMA_MAX_X_BYTES):
        return False
    if n is None or k is None or device is None or torch.device(device).type != "cuda":
        return True
    if not _lib.available():
        return False
    return m <= _mma_max_m(_device_index(device), k, n, kdim)  # m may be symbolic (torch.compile)


_wgmma_ok: dict = {}


def wgmma_supports(m: int, kdim: int, n: int, k: int | None = None, device=None) -> bool:
    """Whether the wgmma kernel takes x [m, kdim] @ W[n, kdim]^T: N and K multiples of 8 and,
    for a CUDA device, compute capability 9.0 with a library built for it (sm_90a). Without a
    device only the shape rule is checked. k is taken for symmetry with mma_supports: every
    k = 2..5 runs."""
    if not (m >= 1 and n % 8 == 0 and kdim % 8 == 0):
        return False
    if device is None or torch.device(device).type != "cuda":
        return True
    if not _lib.available():
        return False
    return _wgmma_available(_device_index(device))


@torch.compiler.assume_constant_result
def _wgmma_available(index: int) -> bool:
    if index not in _wgmma_ok:
        _wgmma_ok[index] = bool(_lib._lib.kbit_wgmma_available(index))
    return _wgmma_ok[index]


_K5_TABLES = {"auto": 0, "narrow": 1, "wide": 2}


def force_wgmma_config(tn: int = 0, wg: int = 0, splits: int = 0, k5_table: str = "auto") -> None:
    """Tests and experiments: make every wgmma launch use TN tokens (32, 64, 128, 256) and WG
    warpgroups of 64 weight rows (1, 2) per CTA, and split K over a
    cluster of `splits` CTAs (1..8; -1: stream-K, one CTA per SM, where the tiles are fewer than
    the SMs and N a multiple of the CTA's rows, else automatic); 0 = automatic. k5_table: k = 5's codebook table, "narrow"
    (64 KB, lanes share columns: 2 CTAs may share an SM), "wide" (128 KB, no bank conflicts,
    one CTA per SM) or "auto" (wide where a CTA runs alone on its SM)."""
    from .linear import _supported as fast_path_cache  # here: kbit.linear imports this module

    if k5_table not in _K5_TABLES:
        raise ValueError(f"k5_table must be one of {sorted(_K5_TABLES)}, got {k5_table!r}")
    if _lib.available():
        _lib._lib.kbit_wgmma_force_config(int(tn), int(wg), int(splits), _K5_TABLES[k5_table])
    # the stream-K decision follows the forced configuration: the workspace sizes and
    # kbit.linear's fast path (which caches them) start again
    _ws_need.clear()
    fast_path_cache.clear()


def _device_index(device) -> int:
    device = torch.device(device)
    return device.index if device.index is not None else torch.cuda.current_device()


def family_of(name: str) -> str:
    """The GPU family a dispatch table is keyed by: the device name's first word after
    "NVIDIA" ("NVIDIA H100 80GB HBM3" -> "H100", "NVIDIA H200" -> "H200")."""
    words = name.replace("NVIDIA", " ").split()
    return words[0] if words else ""


_families: dict = {}


@torch.compiler.assume_constant_result
def device_family(index: int) -> str:
    """family_of the name of CUDA device `index` (cached; a constant for torch.compile)."""
    if index not in _families:
        _families[index] = family_of(torch.cuda.get_device_name(index))
    return _families[index]


_max_m: dict = {}


# A pure function of its (constant) arguments, so torch.compile evaluates it while tracing and
# keeps the result (it cannot trace the ctypes calls); M stays out of it since it may be
# symbolic.
@torch.compiler.assume_constant_result
def _mma_max_m(index: int, k: int, n: int, kdim: int) -> int:
    """The largest M <= MMA_MAX_M whose mma call fits the device's shared memory (0: none)."""
    key = (index, k, n, kdim)
    if key not in _max_m:
        optin = _lib._lib.kbit_device_smem_optin(index)
        _max_m[key] = max([0] + [m for m in range(1, MMA_MAX_M + 1)
                                 if 0 < _lib._lib.kbit_mma_smem_bytes(index, 1, k, m, n, kdim) <= optin])
    return _max_m[key]


def mma_ksplit(m: int, kdim: int, n: int, k: int, device) -> int:
    """K-slices of the mma launch plan for this call on a CUDA device: 1 = x staged whole,
    2, 4, 8 = K split over that many CTAs per row-group set, 0 = not handled by mma."""
    if not _lib.available():
        return 0
    return _lib._lib.kbit_mma_ksplit(_device_index(device), k, m, n, kdim)


def force_mma_ksplit(S: int) -> None:
    """Tests and experiments: make every mma launch use S K-slices (1, 2, 4, 8; 0 = automatic
    again); calls that S cannot take are refused. Clears the caches that follow the plan:
    mma_supports', the workspace sizes and kbit.linear's fast path."""
    from .linear import _supported as fast_path_cache  # here: kbit.linear imports this module

    if _lib.available():
        _lib._lib.kbit_mma_force_ksplit(int(S))
    _max_m.clear()
    _ws_need.clear()
    fast_path_cache.clear()


def force_gemv_rows(rows: int, warps: int = 0, groups: int = 1) -> None:
    """Tests and experiments: the scalar GEMV's coalesced variant (gemv_rows_kernel) with `rows`
    rows (8, 16, 32; 32 at M = 1 only) and `warps` warps (1..8) per CTA for every call it can
    take; 0 = automatic again, -1 = never (the lane-per-k-tile kernel). groups > 1 (M = 1 only;
    other M fall back to the lane-per-k-tile kernel): `groups` groups of `rows` rows per CTA on
    warps / groups warps each, built for rows = 8, groups = 5, warps = 10 or 20."""
    if _lib.available():
        _lib._lib.kbit_gemv_force_rows(int(rows), int(warps), int(groups))


def force_gemv_tc(on: int) -> None:
    """Tests and experiments: the M = 1, k = 2..4 GEMV on tensor cores (gemv_tc_kernel,
    csrc/gemv.cu; E4M4 scales) wherever it applies (1), never (0: the coalesced rows kernel), for
    the k whose bit is set (other values: bit k, e.g. 12 = k = 2 and 3), or the library's default
    (-1: KBIT_GEMV_TC if set, else the build's default, 12)."""
    if _lib.available():
        _lib._lib.kbit_gemv_force_tc(int(on))


def _check_small_m(name, max_m, x, packed, absmax, codebook, n, kdim, absmax_exponent, bias):
    _check_tensor("x", x, ACT_DTYPES)
    if x.dim() != 2 or x.shape[1] != kdim:
        raise ValueError(f"x must be [M, K={kdim}], got {list(x.shape)}")
    if x.shape[0] > max_m:
        raise ValueError(f"{name} takes M <= {max_m} rows, got {x.shape[0]}")
    if name == "mma" and x.shape[0] > 0 and not mma_supports(
            x.shape[0], kdim, n, codebook.numel().bit_length() - 1, x.device):
        raise ValueError(f"mma: x [{x.shape[0]}, {kdim}] is too large to stage in shared memory")
    if name == "wgmma" and x.shape[0] > 0 and not wgmma_supports(x.shape[0], kdim, n, None, x.device):
        raise ValueError(f"wgmma needs N and K multiples of 8 and, on CUDA, a compute capability "
                         f"9.0 device with an sm_90a build; got N={n}, K={kdim} on {x.device}")
    _check_packed(packed, absmax, codebook, n, kdim, "tiled64")
    if x.device != packed.device:
        raise ValueError(f"x is on {x.device}; the weight is on {packed.device}")
    _check_exponent(absmax_exponent)
    if bias is not None:
        _check_tensor("bias", bias, (x.dtype,), (n,), x.device)


def _small_m_ref_into(x, packed, absmax, codebook, n, kdim, absmax_exponent, bias, out):
    w = ref.dequantize(packed, absmax, codebook, (n, kdim), "tiled64", absmax_exponent, torch.float32)
    y = x.float() @ w.T
    if bias is not None:
        y = y + bias.float()
    out.copy_(y.to(x.dtype))


# Workspaces of the split kernels (wgmma's stream-K, mma's split-K), one set per kernel:
_ws_need: dict = {}  # (kernel, device, dtype, M, K, N, k, absmax format) -> bytes (0: none)
_workspaces: dict = {}  # (kernel, device, stream) -> zeroed workspace of eager calls
_graph_workspaces: dict = {}  # (kernel, device, stream) -> (capture id, workspace of that capture)
_graph_kept: list = []  # every captured workspace, never freed (see _workspace)
_wgmma_shared_workspace = None
# KBIT_STREAMK=0: no wgmma call gets a workspace, so none runs stream-K (A/B experiments).
_wgmma_streamk = os.environ.get("KBIT_STREAMK", "1") != "0"
_FLAG_BYTES = 4096  # wgmma's flags (csrc/wgmma.cu kFlagBytes): zero between calls
# The bytes zeroed at a capture's first use: wgmma's flags; all of mma's (each word is a flag)
_ZERO_BYTES = {"wgmma": _FLAG_BYTES, "mma": None}


def use_wgmma_workspace(ws: Tensor | None) -> None:
    """Experiments (scripts/wgmma_sweep.py): every wgmma call that runs stream-K takes this
    zeroed uint8 CUDA tensor as its workspace, captured or not; the calls must then run one
    after another on one stream (two stream-K grids on one workspace at once can hang: one's
    owner may consume and clear the other's flag). None: back to the per-stream / per-graph
    cache."""
    global _wgmma_shared_workspace
    _wgmma_shared_workspace = ws


def _workspace_need(lib, kernel: str, dev: int, dtype, m: int, kdim: int, n: int, k: int, fmt: int) -> int:
    """The workspace bytes of a wgmma / mma call (0: it would not split K; every wgmma call
    under KBIT_STREAMK=0), asked once per shape."""
    if kernel == "wgmma" and not _wgmma_streamk:
        return 0
    key = (kernel, dev, dtype, m, kdim, n, k, fmt)
    need = _ws_need.get(key)
    if need is None:
        if kernel == "wgmma":
            need = int(lib.kbit_wgmma_workspace_bytes(dev, _lib.DTYPE_CODES[dtype], m, kdim, n, k, fmt))
        else:
            need = int(lib.kbit_mma_workspace_bytes(dev, k, m, n, kdim))
        _ws_need[key] = need
    return need


def _workspace(lib, kernel: str, x: Tensor, dev: int, stream: int, need: int):
    """The workspace of a split wgmma (stream-K) or mma (split-K) call of `need` bytes, or None
    for need == 0. A workspace must be zero before a call (wgmma: its first 4 KB of flags;
    mma: all of it), and every call leaves it so, so calls that run one after another share
    one: eager calls one per (kernel, device, stream); a CUDA-graph capture one per (kernel,
    device, stream) of that capture, allocated from the graph's memory pool and zeroed by a
    memset node captured before its first use (so every replay starts with it zero; two
    graphs do not share one). A captured workspace is never freed: freed, its block could go
    to a later capture that shares the pool (torch.compile's CUDA-graph trees, `pool=`), whose
    tensors the first graph's replays would then overwrite. That keeps, per captured graph that
    splits, up to ~9 MB for wgmma (4.4 MB on an H100 for its automatic configurations) and S x N
    x M x 4 bytes for mma (0.1-5 MB for the model's dense shapes, NOTES.md v36)."""
    if need == 0:
        return None
    if kernel == "wgmma" and _wgmma_shared_workspace is not None:
        return _wgmma_shared_workspace
    capture = int(lib.kbit_stream_capture_id(stream))  # x's stream (not the current device's)
    key = (kernel, dev, stream)
    if capture:
        held = _graph_workspaces.get(key)
        if held is not None and held[0] == capture and held[1].numel() >= need:
            return held[1]
        ws = torch.empty(need, dtype=torch.uint8, device=x.device)
        ws[:_ZERO_BYTES[kernel]].zero_()  # captured: runs at every replay, before the first call
        _graph_workspaces[key] = (capture, ws)
        _graph_kept.append(ws)
        return ws
    ws = _workspaces.pop(key, None)  # re-inserted last: least recently used first
    if ws is None or ws.numel() < need:
        mine = [held for held in _workspaces if held[0] == kernel]
        if ws is None and len(mine) >= 8:  # streams come and go: keep the latest few per kernel
            _workspaces.pop(mine[0])
        ws = torch.zeros(need, dtype=torch.uint8, device=x.device)
    _workspaces[key] = ws
    return ws


def wgmma_last_streamk() -> bool:
    """Tests: whether the process's last wgmma launch ran stream-K."""
    return bool(_lib.available() and _lib._lib.kbit_wgmma_last_streamk())


def _small_m_cuda_into(cfn, x, packed, absmax, codebook, n, kdim, absmax_exponent, bias, out):
    lib = _lib.native(x)
    if lib is None:
        return _small_m_ref_into(x, packed, absmax, codebook, n, kdim, absmax_exponent, bias, out)
    if x.shape[0] == 0 or n == 0:
        return None
    if x.stride(-1) != 1:
        x = x.contiguous()
    if cfn == "kbit_wgmma":  # 16-byte aligned x rows (TMA); any output alignment
        if x.data_ptr() % 16 or x.stride(0) % 8:
            x = x.clone(memory_format=torch.contiguous_format)
    # The kernels read the plane words with 8- / 16-byte loads (k = 2 / 4) and mma's and
    # wgmma's bulk copies need 16-byte aligned weights: a misaligned view (kbit never makes
    # one) is copied rather than faulting the device.
    if packed.data_ptr() % 16:
        packed = packed.clone()
    if absmax.data_ptr() % 16:
        absmax = absmax.clone()
    dev, stream = _lib.stream_of(x)
    fmt = _lib.ABSMAX_CODES[absmax_format_of(absmax)]
    k = codebook.numel().bit_length() - 1
    extra = ()
    if cfn in ("kbit_wgmma", "kbit_mma"):
        kernel = cfn[5:]
        need = _workspace_need(lib, kernel, dev, x.dtype, x.shape[0], kdim, n, k, fmt)
        ws = _workspace(lib, kernel, x, dev, stream, need)
        extra = (ws.data_ptr(), ws.numel()) if ws is not None else (None, 0)
    args = (dev, stream, x.data_ptr(), _lib.DTYPE_CODES[x.dtype], x.shape[0], x.stride(0),
            packed.data_ptr(), absmax.data_ptr(), fmt, codebook.data_ptr(), k, n, kdim, absmax_exponent,
            bias.data_ptr() if bias is not None else None, out.data_ptr(), out.stride(0), *extra)
    rc = _call_stable(getattr(lib, cfn), args, packed, absmax, codebook)
    _lib.check(rc, cfn[5:])
    return None


# Weights asked for before the PDL wait (kbit_gemv's, kbit_mma's and kbit_wgmma's
# KBIT_WEIGHTS_STABLE, kbit.h; mma, H100, NOTES.md v52: M = 1 k = 4 dense TOTAL -1.3..-1.8 us
# back-to-back, -0.2..-0.5 after a plain kernel; wgmma: NOTES.md v58; gemv: v61): only where they
# cannot have been written by the kernel that runs just before the call. id(packed) -> (weak
# references to the packed, absmax and codebook tensors of kbit's last gemv, mma or wgmma launch
# on them, their version counters then).
# KBIT_EARLY_WEIGHTS=0 turns it off.
_launch_seen: dict = {}
EARLY_WEIGHTS = os.environ.get("KBIT_EARLY_WEIGHTS", "1").strip() != "0"
_WEIGHTS_STABLE = 1  # kbit.h KBIT_WEIGHTS_STABLE


def _stable_flag(packed: Tensor, absmax: Tensor, codebook: Tensor, inference: bool | None = None):
    """(kbit_gemv's / kbit_mma's / kbit_wgmma's flags, the version counters read) for a launch on
    these weight tensors: KBIT_WEIGHTS_STABLE where kbit launched gemv, mma or wgmma on these same
    three tensors before and no torch operation has written any of them since (their version
    counters are unchanged), so that no kernel still in flight can have written them; else 0,
    and the first call after such a write waits for the previous kernel before it reads them.
    Inference tensors (torch.inference_mode) have no version counter: always 0. Writes that
    bypass torch (a raw pointer handed to a foreign kernel) are not seen: after one,
    synchronize before the next kbit call, or set KBIT_EARLY_WEIGHTS=0. `inference`: whether
    any of the three is an inference tensor, where the caller has it cached (it never changes
    for a tensor); None: asked here."""
    if inference is None:
        inference = packed.is_inference() or absmax.is_inference() or codebook.is_inference()
    if not EARLY_WEIGHTS or inference:
        return 0, None
    versions = (packed._version, absmax._version, codebook._version)
    seen = _seen_for(packed, absmax, codebook)
    return (_WEIGHTS_STABLE if seen is not None and seen[3] == versions else 0), versions


def _seen_for(packed: Tensor, absmax: Tensor, codebook: Tensor):
    """The _launch_seen record of exactly these three tensors, or None."""
    seen = _launch_seen.get(id(packed))
    if seen is not None and seen[0]() is packed and seen[1]() is absmax and seen[2]() is codebook:
        return seen
    return None


def _launched(packed: Tensor, absmax: Tensor, codebook: Tensor, versions) -> None:
    """Records the version counters _stable_flag read, once the call they were read for has
    launched (a refused call leaves the previous record)."""
    key = id(packed)
    seen = _seen_for(packed, absmax, codebook)
    if seen is not None:
        _launch_seen[key] = (*seen[:3], versions)
    else:
        _launch_seen[key] = (weakref.ref(packed, lambda _: _launch_seen.pop(key, None)), weakref.ref(absmax),
                          weakref.ref(codebook), versions)


def _call_stable(fn, args, packed: Tensor, absmax: Tensor, codebook: Tensor, inference: bool | None = None) -> int:
    """fn(*args, flags) (lib.kbit_gemv, lib.kbit_mma or lib.kbit_wgmma) with _stable_flag's flags
    for these weights; their versions are recorded once the call launched (a stable call's record
    already holds them). The return code is the caller's to check. `inference`: see
    _stable_flag."""
    flags, versions = _stable_flag(packed, absmax, codebook, inference)
    rc = fn(*args, flags)
    if not rc and not flags and versions is not None:
        _launched(packed, absmax, codebook, versions)
    return rc


def _def_small_m(name: str, max_m: int):
    cfn = f"kbit_{name}"
    rows = "M" if max_m >= WGMMA_MAX_M else f"M <= {max_m}"
    doc = f"x [{rows}, K] @ W^T (+ bias) with W (n x kdim) in the tiled64 layout ({name} kernel)."

    @torch.library.custom_op(f"kbit::{name}", mutates_args=())
    def op(x: Tensor, packed: Tensor, absmax: Tensor, codebook: Tensor, n: int, kdim: int,
           absmax_exponent: int, bias: Tensor | None = None) -> Tensor:
        _check_small_m(name, max_m, x, packed, absmax, codebook, n, kdim, absmax_exponent, bias)
        out = x.new_empty((x.shape[0], n))
        _small_m_ref_into(x, packed, absmax, codebook, n, kdim, absmax_exponent, bias, out)
        return out

    @op.register_kernel("cuda")
    def _(x, packed, absmax, codebook, n, kdim, absmax_exponent, bias=None):
        _check_small_m(name, max_m, x, packed, absmax, codebook, n, kdim, absmax_exponent, bias)
        out = x.new_empty((x.shape[0], n))
        _small_m_cuda_into(cfn, x, packed, absmax, codebook, n, kdim, absmax_exponent, bias, out)
        return out

    @op.register_fake
    def _(x, packed, absmax, codebook, n, kdim, absmax_exponent, bias=None):
        return x.new_empty((x.shape[0], n))

    @torch.library.custom_op(f"kbit::{name}_out", mutates_args=("out",))
    def op_out(x: Tensor, packed: Tensor, absmax: Tensor, codebook: Tensor, n: int, kdim: int,
               absmax_exponent: int, bias: Tensor | None, out: Tensor) -> None:
        _check_small_m(name, max_m, x, packed, absmax, codebook, n, kdim, absmax_exponent, bias)
        _check_out("out", out, (x.dtype,), (x.shape[0], n), x.device)
        _small_m_ref_into(x, packed, absmax, codebook, n, kdim, absmax_exponent, bias, out)

    @op_out.register_kernel("cuda")
    def _(x, packed, absmax, codebook, n, kdim, absmax_exponent, bias, out):
        _check_small_m(name, max_m, x, packed, absmax, codebook, n, kdim, absmax_exponent, bias)
        _check_out("out", out, (x.dtype,), (x.shape[0], n), x.device)
        _small_m_cuda_into(cfn, x, packed, absmax, codebook, n, kdim, absmax_exponent, bias, out)

    op.__doc__ = op_out.__doc__ = doc
    return op, op_out


gemv, gemv_out = _def_small_m("gemv", GEMV_MAX_M)
mma, mma_out = _def_small_m("mma", MMA_MAX_M)
wgmma, wgmma_out = _def_small_m("wgmma", WGMMA_MAX_M)

__all__ += ["gemv", "gemv_out", "mma", "mma_out", "mma_supports", "mma_ksplit",
            "wgmma", "wgmma_out", "wgmma_supports"]
