"""Public API over the ops: kbit.quantize / dequantize / repack / unrepack."""

from __future__ import annotations

import torch

from . import ops
from .format import (
    ABSMAX_RANGE,
    KbitFormatError,
    QuantizedWeight,
    check_absmax_format,
    check_codebook,
    check_k,
    choose_absmax_exponent,
    nf_codebook,
)
from .reference import block_absmax


def quantize(
    weight: torch.Tensor,
    k: int = 4,
    codebook: torch.Tensor | None = None,
    absmax_format: str = "e4m4",
) -> QuantizedWeight:
    """Quantize a [N, K] fp32/fp16/bf16 weight to k bits (flat layout, on weight's device).

    codebook: 2**k ascending values in [-1, 1] (default: the nf codebook for k).
    absmax_format: "e4m4" (1 byte per 32 values), "fp16" or "fp32".
    A block absmax outside the format's range is never clipped: the whole tensor gets a
    power-of-two scale (QuantizedWeight.absmax_exponent) that brings every block into range,
    or, if the tensor's range is too wide for that, a KbitFormatError. NaN/Inf raise ValueError.
    """
    check_k(k)
    check_absmax_format(absmax_format)
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
    if weight.dtype not in ops.FLOAT_DTYPES:
        raise TypeError(f"weight has dtype {weight.dtype}; expected float32, float16 or bfloat16")
    if weight.dim() != 2 or min(weight.shape) < 1:
        raise ValueError(f"weight must be 2-D [N, K] with N, K >= 1, got shape {list(weight.shape)}")
    codebook = nf_codebook(k) if codebook is None else check_codebook(codebook, k)
    codebook = codebook.to(device=weight.device, dtype=torch.float32).contiguous()

    exponent = 0
    packed, absmax, status = ops.quantize(weight, codebook, absmax_format, exponent)
    flags = status.tolist()  # quantization is a load-time op: one host sync is fine here
    if flags[2]:
        raise KbitFormatError("codebook breaks the format's rules (see kbit.format.check_codebook)")
    if flags[0]:
        raise ValueError("weight contains NaN or Inf values; cannot quantize")
    if flags[1]:
        exponent = choose_absmax_exponent(block_absmax(weight), absmax_format)
        packed, absmax, status = ops.quantize(weight, codebook, absmax_format, exponent)
        if status.tolist()[1]:  # choose_absmax_exponent guarantees the range; never expected
            raise KbitFormatError(
                f"block absmax still outside the {absmax_format} range {ABSMAX_RANGE[absmax_format]} "
                f"after a 2**{exponent} scale"
            )
    return QuantizedWeight(packed, absmax, codebook, k, tuple(weight.shape), exponent)


def dequantize(qweight: QuantizedWeight, dtype: torch.dtype | None = None, out=None) -> torch.Tensor:
    """QuantizedWeight (any layout) -> [N, K] tensor of dtype (default float16, or out's dtype)."""
    if not isinstance(qweight, QuantizedWeight):
        raise TypeError(f"qweight must be a kbit.QuantizedWeight, got {type(qweight).__name__}")
    n, kdim = qweight.shape
    args = (qweight.packed, qweight.absmax, qweight.codebook, n, kdim, qweight.layout, qweight.absmax_exponent)
    if out is not None:
        if dtype is not None and out.dtype != dtype:
            raise TypeError(f"out has dtype {out.dtype} but dtype={dtype} was asked for")
        ops.dequantize_out(*args, out)
        return out
    return ops.dequantize(*args, torch.float16 if dtype is None else dtype)


def repack(qweight: QuantizedWeight, layout: str = "tiled64") -> QuantizedWeight:
    """Flat QuantizedWeight -> the same weight in a runtime layout (load-time op)."""
    if qweight.layout != "flat":
        qweight = unrepack(qweight)
    if layout == "flat":
        return qweight
    n, kdim = qweight.shape
    packed, absmax = ops.repack(qweight.packed, qweight.absmax, n, kdim, qweight.k, layout)
    return QuantizedWeight(packed, absmax, qweight.codebook, qweight.k, qweight.shape,
                           qweight.absmax_exponent, layout)


def unrepack(qweight: QuantizedWeight) -> QuantizedWeight:
    """Any layout -> the canonical flat layout."""
    if qweight.layout == "flat":
        return qweight
    n, kdim = qweight.shape
    packed, absmax = ops.unrepack(qweight.packed, qweight.absmax, n, kdim, qweight.k, qweight.layout)
    return QuantizedWeight(packed, absmax, qweight.codebook, qweight.k, qweight.shape,
                           qweight.absmax_exponent, "flat")


__all__ = ["quantize", "dequantize", "repack", "unrepack"]
