"""kbit.linear: C = x @ W^T (+ bias) for a k-bit W, any leading dims of x, fp16/bf16.

Dispatch (tiled64 weights): `kernel_for` looks the (N, K, k) of the weight up in
kbit/dispatch_table.py's table for the GPU family of x's device (H100, H200; others take the
H100's), the fastest of the scalar GEMV (M <= 4), mma, wgmma and dequantize +
cuBLAS per range of M measured by `kbit bench --suite linear` (the table's header has the
command that regenerates it); other shapes use its DEFAULT (the tensor-core kernel for M <=
32). "wgmma" (Hopper only) falls back to "mma" where the device or shape cannot take it
(wgmma_supports); "mma" falls back to the scalar GEMV (M <= 4) when x is too large to stage
in shared memory (mma_supports), then to dequantize. "gemv", "mma" and "wgmma" calls skip
the torch.library dispatch in eager mode (`_fast_small`). A flat weight, or an M past the table,
takes dequantize into a reused per-(device, stream, dtype) buffer +
torch.nn.functional.linear (cuBLAS); in eager mode the dequantize is a direct call too
(`_fast_dequantize`). With `out` given (contiguous [M, N], x's dtype) the
small-M kernels write into it directly.
"""

from __future__ import annotations

import threading
import weakref

import torch

from . import _lib, dispatch_table, ops
from .format import QuantizedWeight

_dequant_buffers: dict = {}


def kernel_for(m: int, n: int, kdim: int, k: int, family: str | None = None) -> str:
    """"gemv", "mma", "wgmma" or "dq": the kernel of the dispatch table for an [m, kdim] x and
    an [n, kdim] k-bit weight (before the device checks of "mma" and "wgmma"), from the table
    of GPU family `family` (ops.device_family; other families and None: DEFAULT_FAMILY's)."""
    tables = dispatch_table.TABLES
    table = tables.get(family) or tables[dispatch_table.DEFAULT_FAMILY]
    for top, name in table.get((n, kdim, k), dispatch_table.DEFAULT):
        if m <= top:
            return name
    return "dq"


def _dequant_buffer(qweight: QuantizedWeight, dtype: torch.dtype) -> torch.Tensor:
    device = qweight.device
    # torch.cuda.current_stream, not _stream_handle: torch.compile traces this function
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device, stream, dtype)
    need = qweight.shape[0] * qweight.shape[1]
    buf = _dequant_buffers.get(key)
    if buf is None or buf.numel() < need:
        buf = torch.empty(need, dtype=dtype, device=device)
        _dequant_buffers[key] = buf
    return buf[:need].view(qweight.shape)


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream_handle(index: int) -> int:
    """The current stream of CUDA device `index` as the handle the C entry points take (the raw
    lookup where torch has it: ~2 us less than torch.cuda.current_stream, NOTES.md)."""
    return _raw_stream(index) if _raw_stream is not None else torch.cuda.current_stream(index).cuda_stream

# id(qweight) -> (weakref to it, its launch arguments); and (kernel, m, K, N, k, device, dtype)
# -> (whether the kernel takes the call, mma's workspace bytes); ops.force_mma_ksplit clears it
_weight_args: dict = {}
_supported: dict = {}


def _launch_args(qweight: QuantizedWeight, dev: torch.device):
    """(packed, absmax, absmax code, codebook pointers, k, exponent, layout code, whether any
    of its tensors is an inference tensor, _fast_small's argument blocks) of a weight on `dev`
    whose tensors are contiguous and 16-byte aligned, else None; cached per weight (its fields
    are frozen; the cache entry is checked against the packed pointer and dropped with the
    weight, blocks included)."""
    hit = _weight_args.get(id(qweight))
    if hit is not None and hit[0]() is qweight and hit[1][0] == qweight.packed.data_ptr():
        return hit[1]
    if (qweight.device != dev
            or not (qweight.packed.is_contiguous() and qweight.absmax.is_contiguous()
                    and qweight.codebook.is_contiguous())
            or qweight.packed.data_ptr() % 16 or qweight.absmax.data_ptr() % 16):
        return None  # the op path checks everything and copies misaligned weights
    args = (qweight.packed.data_ptr(), qweight.absmax.data_ptr(),
            _lib.ABSMAX_CODES[qweight.absmax_format], qweight.codebook.data_ptr(), qweight.k,
            qweight.absmax_exponent, _lib.LAYOUT_CODES[qweight.layout],
            qweight.packed.is_inference() or qweight.absmax.is_inference() or qweight.codebook.is_inference(),
            {})
    key = id(qweight)
    _weight_args[key] = (weakref.ref(qweight, lambda _: _weight_args.pop(key, None)), args)
    return args


def _fast_small(kernel, x2, qweight, bias, out, out2, m, n, kdim):
    """Eager CUDA call of the gemv, mma or wgmma kernel (the same C signature, plus the split
    workspace of mma and wgmma) without the torch.library dispatch (51 -> 18 us of host time per
    call at M = 1, NOTES.md), or None when any
    precondition fails (the caller then takes the op path, which checks everything and raises
    the errors). qweight's fields were validated when it was built (frozen dataclass). out2:
    `out` as [m, n] where the kernel can write it, else None."""
    lib = _lib._lib
    dev = x2.device
    strides = x2.stride()
    if lib is None or dev.type != "cuda" or strides[1] != 1:
        return None
    wargs = _launch_args(qweight, dev)
    if wargs is None or qweight.layout != "tiled64":
        return None
    index, dtype = dev.index, x2.dtype
    key = (kernel, m, kdim, n, wargs[4], index, dtype)
    hit = _supported.get(key)
    if hit is None:
        # the kernel that runs: as in linear's op path, "wgmma" falls back to "mma" where the
        # device or shape cannot take it
        run, need = kernel, 0
        if kernel == "wgmma" and not ops.wgmma_supports(m, kdim, n, wargs[4], dev):
            run = "mma"
        if run == "wgmma":
            ok = True
        elif run == "mma":
            ok = ops.mma_supports(m, kdim, n, wargs[4], dev)
        else:  # the GEMV takes any K (x from global memory when it does not fit shared memory)
            ok = 1 <= m <= ops.GEMV_MAX_M
        if ok and run != "gemv":  # the split workspace bytes (kbit/ops.py _workspace_need)
            need = ops._workspace_need(lib, run, index, dtype, m, kdim, n, wargs[4], wargs[2])
        hit = _supported[key] = (ok, run, need)
    ok, run, need = hit
    if not ok:
        return None
    xp = x2.data_ptr()
    if run == "wgmma" and (xp % 16 or strides[0] % 8):
        return None  # its TMA reads 16-byte aligned x rows; the op path copies x
    if bias is not None and (bias.dtype != dtype or bias.shape != (n,) or bias.device != dev
                             or not bias.is_contiguous()):
        return None
    if out is not None and out2 is None:
        return None
    y = out2 if out2 is not None else torch.empty((m, n), dtype=dtype, device=dev)
    stream = _stream_handle(index)
    # The call goes through kbit_small_m_call with this thread's argument block for (m, dtype)
    # on this weight: the weight's and the shape's fields are written once, the call's below
    # (two ctypes arguments instead of 20: ~2-4 us less host time, NOTES.md v59). ctypes
    # releases the GIL during the call, so a block must never be shared between threads.
    blocks = wargs[8]
    bkey = (threading.get_ident(), m, dtype)
    blk = blocks.get(bkey)
    if blk is None:
        blk = blocks[bkey] = _lib.CallBlock(index, 0, 0, _lib.DTYPE_CODES[dtype], m, 0, wargs[0], wargs[1],
                                            wargs[2], wargs[3], wargs[4], n, kdim, wargs[5], 0, 0, n, 0, 0, 0)
    blk[1] = stream
    blk[2] = xp
    blk[5] = strides[0]
    blk[14] = bias.data_ptr() if bias is not None else 0
    blk[15] = y.data_ptr()
    if run != "gemv":
        ws = ops._workspace(lib, run, x2, index, stream, need)
        blk[17], blk[18] = (ws.data_ptr(), ws.numel()) if ws is not None else (0, 0)
    rc = ops._call_stable(_block_call, (lib, _lib.CALL_CODES[run], blk), qweight.packed, qweight.absmax,
                          qweight.codebook, wargs[7])
    if rc:
        _lib.check(rc, run)
    return y


def _block_call(lib, code: int, blk, flags: int) -> int:
    """kbit_small_m_call(code, blk) with the flags (the block's last value) of ops._call_stable."""
    blk[19] = flags
    return lib.kbit_small_m_call(code, blk)


def _fast_dequantize(qweight: QuantizedWeight, w: torch.Tensor) -> bool:
    """Eager CUDA dequantize of qweight into `w` (the per-stream buffer of _dequant_buffer:
    contiguous [N, K], qweight's device) without the torch.library dispatch (16 us less host
    time per call on the H200 machine, NOTES.md v51); False when it does not apply (the caller
    then takes the op)."""
    lib = _lib._lib
    dev = w.device
    n, kdim = qweight.shape
    if lib is None or dev.type != "cuda" or n == 0 or kdim == 0 or torch.compiler.is_compiling():
        return False
    wargs = _launch_args(qweight, dev)
    if wargs is None:
        return False
    index = dev.index
    rc = lib.kbit_dequantize(index, _stream_handle(index), wargs[0], wargs[1], wargs[2], wargs[3], wargs[4], n, kdim, wargs[6],
                             wargs[5], w.data_ptr(), _lib.DTYPE_CODES[w.dtype])
    _lib.check(rc, "dequantize")
    return True


def linear(x: torch.Tensor, qweight: QuantizedWeight, bias: torch.Tensor | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    if not isinstance(qweight, QuantizedWeight):
        raise TypeError(f"qweight must be a kbit.QuantizedWeight, got {type(qweight).__name__}")
    if not isinstance(x, torch.Tensor) or x.dtype not in ops.ACT_DTYPES:
        raise TypeError(f"x must be a float16 or bfloat16 tensor, got {getattr(x, 'dtype', type(x))}")
    n, kdim = qweight.shape
    if x.dim() < 1 or x.shape[-1] != kdim:
        raise ValueError(f"x must have last dim K={kdim}, got shape {list(x.shape)}")
    x2 = x if x.dim() == 2 else x.reshape(-1, kdim)  # (reshape costs ~1 us of host time)
    m = x2.shape[0]
    family = ops.device_family(x.device.index) if x.is_cuda else None  # a CUDA tensor's index is set
    kernel = kernel_for(m, n, kdim, qweight.k, family)
    # `out` as [m, n] where the kernels (or the matmul) can write into it directly
    out2 = None
    if out is not None and out.is_contiguous() and out.dtype == x.dtype and out.device == x.device \
            and out.numel() == m * n:
        out2 = out if out.shape == (m, n) else out.view(m, n)
    if x2.is_cuda and m > 0 and kernel != "dq" and not torch.compiler.is_compiling():
        y = _fast_small(kernel, x2, qweight, bias, out, out2, m, n, kdim)
        if y is not None:
            return out if y is out2 else y if x2 is x else y.view(*x.shape[:-1], n)
    small = None
    if qweight.layout == "tiled64" and m > 0 and kernel != "dq":
        if kernel == "wgmma" and ops.wgmma_supports(m, kdim, n, qweight.k, x.device):
            small = (ops.wgmma, ops.wgmma_out)
        elif kernel in ("mma", "wgmma") and ops.mma_supports(m, kdim, n, qweight.k, x.device):
            small = (ops.mma, ops.mma_out)
        elif m <= ops.GEMV_MAX_M:
            small = (ops.gemv, ops.gemv_out)
    if small is not None:
        args = (x2, qweight.packed, qweight.absmax, qweight.codebook, n, kdim, qweight.absmax_exponent)
        if out2 is not None:
            small[1](*args, bias, out2)
            return out
        y = small[0](*args, bias)
    else:
        w = _dequant_buffer(qweight, x.dtype)
        if not _fast_dequantize(qweight, w):
            ops.dequantize_out(qweight.packed, qweight.absmax, qweight.codebook, n, kdim,
                               qweight.layout, qweight.absmax_exponent, w)
        if out2 is not None and not torch.compiler.is_compiling():
            # the product straight into `out` (no temporary and copy: 10 MB at M = 1024 here)
            if bias is None:
                torch.matmul(x2, w.T, out=out2)
            else:
                torch.addmm(bias, x2, w.T, out=out2)
            return out
        y = torch.nn.functional.linear(x2, w, bias)
    if x2 is not x:
        y = y.view(*x.shape[:-1], n)
    if out is not None:
        out.copy_(y)
        return out
    return y
