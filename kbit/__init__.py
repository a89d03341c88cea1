"""kbit: k-bit (k = 2..5) codebook-quantized weights and CUDA kernels for LLM inference.

    qw = kbit.quantize(weight, k=4)          # [N, K] fp16/bf16/fp32 -> QuantizedWeight
    w = kbit.dequantize(qw, torch.float16)   # back to [N, K]
    kbit.save("model.safetensors", {"mlp.up": qw})

docs/format.md defines the format; kbit/reference.py is its pure-PyTorch implementation.
"""

from . import ops
from ._lib import available as native_available
from ._lib import status as native_status
from .api import dequantize, quantize, repack, unrepack
from .format import KbitFormatError, QuantizedWeight, nf_codebook
from .io import load, save
from .linear import linear

__version__ = "0.1.0"

__all__ = [
    "quantize", "dequantize", "linear", "repack", "unrepack", "save", "load", "QuantizedWeight",
    "KbitFormatError", "nf_codebook", "native_available", "native_status", "ops",
]
