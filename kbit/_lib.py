"""Finds and loads the native CUDA library (libkbit_cuda.so) with ctypes.

The library has a plain C interface (csrc/kbit.h) and does not link libtorch. It is optional:
a package built without nvcc has none, and every op then runs the PyTorch reference
(kbit/reference.py), which is correct on any device but slow on a GPU.
"""

from __future__ import annotations

import ctypes
import os
import warnings
from pathlib import Path

import torch

ABI_VERSION = 13
F32, F16, BF16 = 0, 1, 2
DTYPE_CODES = {torch.float32: F32, torch.float16: F16, torch.bfloat16: BF16}
ABSMAX_CODES = {"e4m4": 0, "fp16": 1, "fp32": 2}
LAYOUT_CODES = {"flat": 0, "tiled64": 1}
CALL_CODES = {"gemv": 0, "mma": 1, "wgmma": 2}  # kbit_small_m_call's kernel (kbit.h KBIT_CALL_*)
CallBlock = ctypes.c_int64 * 20  # its argument block (KBIT_CALL_ARGS)

_HERE = Path(__file__).resolve().parent
_lib: ctypes.CDLL | None = None
_load_error: str | None = None
_warned = False

_c_int, _c_i64, _c_p = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
_SIGNATURES = {
    "kbit_abi_version": ([], _c_int),
    "kbit_pdl_mode": ([], _c_int),
    "kbit_error_string": ([_c_int], ctypes.c_char_p),
    "kbit_quantize": (
        [_c_int, _c_p, _c_p, _c_int, _c_i64, _c_i64, _c_i64, _c_p, _c_int, _c_int, _c_int,
         _c_p, _c_p, _c_p],
        _c_int,
    ),
    "kbit_dequantize": (
        [_c_int, _c_p, _c_p, _c_p, _c_int, _c_p, _c_int, _c_i64, _c_i64, _c_int, _c_int, _c_p,
         _c_int],
        _c_int,
    ),
    "kbit_gemv": (
        [_c_int, _c_p, _c_p, _c_int, _c_i64, _c_i64, _c_p, _c_p, _c_int, _c_p, _c_int, _c_i64,
         _c_i64, _c_int, _c_p, _c_p, _c_i64, _c_int],
        _c_int,
    ),
    "kbit_mma": (
        [_c_int, _c_p, _c_p, _c_int, _c_i64, _c_i64, _c_p, _c_p, _c_int, _c_p, _c_int, _c_i64,
         _c_i64, _c_int, _c_p, _c_p, _c_i64, _c_p, _c_i64, _c_int],
        _c_int,
    ),
    "kbit_small_m_call": ([_c_int, ctypes.POINTER(ctypes.c_int64)], _c_int),
    "kbit_mma_workspace_bytes": ([_c_int, _c_int, _c_i64, _c_i64, _c_i64], _c_i64),
    "kbit_wgmma": (
        [_c_int, _c_p, _c_p, _c_int, _c_i64, _c_i64, _c_p, _c_p, _c_int, _c_p, _c_int, _c_i64,
         _c_i64, _c_int, _c_p, _c_p, _c_i64, _c_p, _c_i64, _c_int],
        _c_int,
    ),
    "kbit_wgmma_available": ([_c_int], _c_int),
    "kbit_wgmma_workspace_bytes": ([_c_int, _c_int, _c_i64, _c_i64, _c_i64, _c_int, _c_int], _c_i64),
    "kbit_stream_capture_id": ([_c_p], ctypes.c_ulonglong),
    "kbit_wgmma_last_streamk": ([], _c_int),
    "kbit_wgmma_force_config": ([_c_int, _c_int, _c_int, _c_int], None),
    "kbit_mma_max_x_bytes": ([], _c_int),
    "kbit_mma_smem_bytes": ([_c_int, _c_int, _c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64], ctypes.c_int64),
    "kbit_device_smem_optin": ([_c_int], _c_int),
    "kbit_mma_ksplit": ([_c_int, _c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64], _c_int),
    "kbit_mma_force_ksplit": ([_c_int], None),
    "kbit_gemv_force_rows": ([_c_int, _c_int, _c_int], None),
    "kbit_gemv_force_tc": ([_c_int], None),
    "kbit_repack": (
        [_c_int, _c_p, _c_p, _c_p, _c_int, _c_int, _c_i64, _c_i64, _c_int, _c_int, _c_p, _c_p],
        _c_int,
    ),
}


def _load() -> None:
    global _lib, _load_error
    path = Path(os.environ.get("KBIT_LIBRARY") or _HERE / "libkbit_cuda.so")
    if not path.exists():
        _load_error = f"{path} not found (kbit was installed without nvcc)"
        return
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        _load_error = f"cannot load {path}: {e}"
        return
    for name, (args, res) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    if lib.kbit_abi_version() != ABI_VERSION:
        _load_error = f"{path} has ABI {lib.kbit_abi_version()}, this package needs {ABI_VERSION}"
        return
    _lib = lib


_load()


def available() -> bool:
    """True when the native CUDA library is loaded."""
    return _lib is not None


def status() -> str:
    if _lib is not None:
        if os.environ.get("KBIT_LIBRARY"):
            return f"native CUDA library loaded (KBIT_LIBRARY={os.environ['KBIT_LIBRARY']})"
        info = _HERE / "kbit_build_info.txt"
        archs = info.read_text().strip() if info.exists() else "archs=?"
        return f"native CUDA library loaded ({archs})"
    return f"native CUDA library not available: {_load_error}"


def native(tensor: torch.Tensor) -> ctypes.CDLL | None:
    """The library when `tensor` is on a CUDA device and the library is loaded, else None.

    Warns once when a CUDA tensor has to fall back to the PyTorch reference.
    """
    global _warned
    if tensor.device.type != "cuda":
        return None
    if _lib is None and not _warned:
        _warned = True
        warnings.warn(
            f"kbit: {_load_error}; CUDA tensors use the slow PyTorch reference ops",
            RuntimeWarning,
            stacklevel=3,
        )
    return _lib


def stream_of(tensor: torch.Tensor) -> tuple[int, int]:
    """(device index, current stream handle) for a CUDA tensor."""
    index = tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
    return index, torch.cuda.current_stream(index).cuda_stream


def check(rc: int, op: str) -> None:
    if rc != 0:
        msg = _lib.kbit_error_string(rc).decode() if _lib is not None else str(rc)
        raise RuntimeError(f"kbit.{op}: CUDA error {rc}: {msg}")
