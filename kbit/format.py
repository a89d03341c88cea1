"""The kbit weight format: codebooks, absmax scales (E4M4), bit-planes, QuantizedWeight.

docs/format.md is the written definition; this module is its executable form. Everything here
is pure PyTorch and runs on any device.

Summary. A weight W [N, K] is cut into blocks of 32 consecutive values along K (the last block
of a row zero-padded). Each block stores its absmax (max |w|) as a scale in one of three formats
and 32 k-bit indices into a codebook of 2**k ascending float32 values in [-1, 1], as k uint32
bit-planes (bit i of word b = bit b of element i's index). The dequantised value is
codebook[idx] * scale, computed in float32, where scale = decoded stored absmax * 2**absmax_exponent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

BLOCK_SIZE = 32
K_VALUES = (2, 3, 4, 5)
FORMAT_VERSION = 1
#: bound on the per-tensor power-of-two absmax scale (keeps 2**e a normal float32)
MAX_ABSMAX_EXPONENT = 120

#: absmax storage format name -> torch dtype of the stored tensor
ABSMAX_DTYPES = {"e4m4": torch.uint8, "fp16": torch.float16, "fp32": torch.float32}
#: runtime layouts produced by `repack`; "flat" is the canonical (saved) one
LAYOUTS = ("flat", "tiled64")
#: blocks per k-tile of the tiled64 layout (TILE_K = 64 values)
TILE_BLOCKS = 2

# Representable range of each absmax format, as (smallest positive, largest finite). A block
# absmax outside it (after the per-tensor power-of-two shift) is never stored silently.
E4M4_MIN = 2.0**-14
E4M4_MAX = 31.0
ABSMAX_RANGE = {
    "e4m4": (E4M4_MIN, E4M4_MAX),
    "fp16": (2.0**-24, 65504.0),
    "fp32": (2.0**-149, float(torch.finfo(torch.float32).max)),
}


class KbitFormatError(ValueError):
    """A tensor, file or argument does not match the kbit format."""


def check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k not in K_VALUES:
        raise ValueError(f"k must be one of {K_VALUES}, got {k!r}")
    return k


def absmax_format_of(absmax: torch.Tensor) -> str:
    for name, dtype in ABSMAX_DTYPES.items():
        if absmax.dtype == dtype:
            return name
    raise KbitFormatError(
        f"absmax has dtype {absmax.dtype}; expected uint8 (e4m4), float16 or float32"
    )


def check_absmax_format(absmax_format: str) -> str:
    if absmax_format not in ABSMAX_DTYPES:
        raise ValueError(
            f"absmax_format must be one of {tuple(ABSMAX_DTYPES)}, got {absmax_format!r}"
        )
    return absmax_format


# ----------------------------------------------------------------------------- codebooks


def nf_codebook(k: int) -> torch.Tensor:
    """The default codebook: v_i = Phi^-1((i + 0.5) / 2**k), scaled so max |v| = 1.

    Computed in float64 and rounded once to float32.
    """
    check_k(k)
    n = 2**k
    p = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    v = torch.special.ndtri(p)
    return (v / v.abs().max()).to(torch.float32)


CODEBOOK_MIN_GAP = 2.0**-20


def check_codebook(codebook: torch.Tensor, k: int) -> torch.Tensor:
    """Validate a codebook for k bits: 2**k ascending finite float32 values in [-1, 1], adjacent
    entries at least 2**-20 apart. Returns it as float32; raises KbitFormatError naming what is
    wrong."""
    check_k(k)
    if not isinstance(codebook, torch.Tensor):
        raise KbitFormatError(f"codebook must be a tensor, got {type(codebook).__name__}")
    if not codebook.is_floating_point():
        raise KbitFormatError(f"codebook must be floating point, got {codebook.dtype}")
    if codebook.dim() != 1 or codebook.numel() != 2**k:
        raise KbitFormatError(
            f"codebook for k={k} must have shape [{2**k}], got {list(codebook.shape)}"
        )
    cb = codebook.to(torch.float32)
    if cb.dtype != codebook.dtype and not torch.equal(cb.to(codebook.dtype), codebook):
        raise KbitFormatError("codebook values are not exactly representable in float32")
    cpu = cb.detach().cpu()
    if not torch.isfinite(cpu).all():
        raise KbitFormatError("codebook contains NaN or Inf")
    if cpu.abs().max() > 1:
        raise KbitFormatError("codebook values must lie in [-1, 1]")
    if not (cpu[1:] > cpu[:-1]).all():
        raise KbitFormatError("codebook values must be strictly ascending")
    if not ((cpu[1:] - cpu[:-1]) >= CODEBOOK_MIN_GAP).all():
        raise KbitFormatError(
            "codebook entries must be at least 2**-20 apart (float32 distances to entries closer "
            "than that can round equal, and the nearest-entry rule stops being a step function)"
        )
    return cb


# ----------------------------------------------------------------------------- E4M4


def e4m4_table() -> torch.Tensor:
    """The 256 E4M4 values, indexed by code, float32 (ascending in the code)."""
    code = torch.arange(256)
    e, m = code >> 4, (code & 15).to(torch.float64)
    sub = m / 16 * 2.0**-10
    norm = (1 + m / 16) * torch.pow(2.0, (e - 11).to(torch.float64))
    return torch.where(e == 0, sub, norm).to(torch.float32)


def e4m4_decode(codes: torch.Tensor) -> torch.Tensor:
    if codes.dtype != torch.uint8:
        raise KbitFormatError(f"E4M4 codes must be uint8, got {codes.dtype}")
    return e4m4_table().to(codes.device)[codes.long()]


def e4m4_encode(values: torch.Tensor) -> torch.Tensor:
    """Round float32 values in [0, 31] to the nearest E4M4 code, ties to the even code
    (the same rule as an IEEE cast). Values outside [0, 31] raise: callers shift first."""
    v = values.to(torch.float32)
    if (v < 0).any() or (v > E4M4_MAX).any() or not torch.isfinite(v).all():
        raise KbitFormatError("e4m4_encode: values must be finite and within [0, 31]")
    table = e4m4_table().to(v.device).double()
    mid = (table[1:] + table[:-1]) / 2  # exact in float64
    code = torch.bucketize(v.double(), mid, right=False)  # number of midpoints < v
    tie = (code < 255) & (mid[code.clamp(max=254)] == v.double()) & (code % 2 == 1)
    return (code + tie.long()).to(torch.uint8)


def encode_absmax(values: torch.Tensor, absmax_format: str) -> torch.Tensor:
    """Round float32 block absmax values (already shifted into range) to the stored format."""
    if absmax_format == "e4m4":
        return e4m4_encode(values)
    return values.to(ABSMAX_DTYPES[check_absmax_format(absmax_format)])


def decode_absmax(stored: torch.Tensor) -> torch.Tensor:
    """Stored absmax (any format) -> float32."""
    if absmax_format_of(stored) == "e4m4":
        return e4m4_decode(stored)
    return stored.to(torch.float32)


def choose_absmax_exponent(absmax: torch.Tensor, absmax_format: str) -> int:
    """The per-tensor power-of-two shift t for block absmax values (float32, >= 0).

    t = 0 when every nonzero absmax lies in the format's range [min, max]. Otherwise t is the
    smallest integer with max(absmax) * 2**-t <= max; if the smallest nonzero absmax then falls
    below min, the tensor's dynamic range is too wide for the format and this raises.
    """
    lo, hi = ABSMAX_RANGE[check_absmax_format(absmax_format)]
    a = absmax.detach().to(torch.float32)
    nz = a[a > 0]
    if nz.numel() == 0:
        return 0
    amax, amin = float(nz.max()), float(nz.min())
    if lo <= amin and amax <= hi:
        return 0
    t = math.ceil(math.log2(amax / hi))
    while amax * 2.0**-t > hi:  # guard log2 rounding
        t += 1
    while t > -MAX_ABSMAX_EXPONENT and amax * 2.0 ** -(t - 1) <= hi:
        t -= 1
    if amin * 2.0**-t < lo or t > MAX_ABSMAX_EXPONENT:
        raise KbitFormatError(
            f"block absmax values span [{amin:.3e}, {amax:.3e}], wider than the "
            f"{absmax_format} range [{lo:.3e}, {hi:.3e}] allows even with a per-tensor "
            f"power-of-two scale; use absmax_format='fp16' or 'fp32'"
        )
    return t


# ----------------------------------------------------------------------------- bit-planes


def pack_bitplanes(indices: torch.Tensor, k: int) -> torch.Tensor:
    """[..., 32] integer indices in [0, 2**k) -> [..., k] int32 bit-planes."""
    check_k(k)
    if indices.shape[-1] != BLOCK_SIZE:
        raise KbitFormatError(f"last dim must be {BLOCK_SIZE}, got {indices.shape[-1]}")
    idx = indices.to(torch.int64)
    shifts = torch.arange(BLOCK_SIZE, device=idx.device, dtype=torch.int64)
    planes = [(((idx >> b) & 1) << shifts).sum(-1) for b in range(k)]
    words = torch.stack(planes, -1)
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32)


def unpack_bitplanes(words: torch.Tensor, k: int) -> torch.Tensor:
    """[..., k] int32 bit-planes -> [..., 32] int64 indices."""
    check_k(k)
    if words.shape[-1] != k:
        raise KbitFormatError(f"last dim must be k={k}, got {words.shape[-1]}")
    w = words.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(BLOCK_SIZE, device=w.device, dtype=torch.int64)
    idx = torch.zeros(*w.shape[:-1], BLOCK_SIZE, dtype=torch.int64, device=w.device)
    for b in range(k):
        idx |= ((w[..., b, None] >> shifts) & 1) << b
    return idx


# ----------------------------------------------------------------------------- container


def num_blocks(K: int) -> int:
    return -(-K // BLOCK_SIZE)


def layout_shapes(layout: str, N: int, K: int, k: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(packed shape, absmax shape) of a layout."""
    kb = num_blocks(K)
    if layout == "flat":
        return (N, kb, k), (N, kb)
    if layout == "tiled64":
        kt = -(-kb // TILE_BLOCKS)
        return (kt, N, TILE_BLOCKS, k), (kt, N, TILE_BLOCKS)
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


@dataclass(frozen=True)
class QuantizedWeight:
    """A k-bit quantized weight of shape (N, K) = (out_features, in_features).

    packed   int32 bit-planes, [N, KB, k] in the flat layout (see `layout_shapes`)
    absmax   stored block scales: uint8 (E4M4), float16 or float32, [N, KB] when flat
    codebook float32 [2**k]
    absmax_exponent  per-tensor power-of-two scale: scale = decoded absmax * 2**absmax_exponent
    layout   "flat" (canonical, what is saved) or a runtime layout produced by `kbit.repack`
    """

    packed: torch.Tensor
    absmax: torch.Tensor
    codebook: torch.Tensor
    k: int
    shape: tuple[int, int]
    absmax_exponent: int = 0
    layout: str = "flat"

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        self.validate()

    @property
    def absmax_format(self) -> str:
        return absmax_format_of(self.absmax)

    @property
    def device(self) -> torch.device:
        return self.packed.device

    @property
    def bits_per_weight(self) -> float:
        return self.k + self.absmax.element_size() * 8 / BLOCK_SIZE

    def validate(self) -> None:
        """Check sizes, dtypes and devices against (N, K, k, layout); raise KbitFormatError."""
        check_k(self.k)
        if len(self.shape) != 2 or min(self.shape) < 1:
            raise KbitFormatError(f"shape must be (N, K) with N, K >= 1, got {self.shape}")
        N, K = self.shape
        packed_shape, absmax_shape = layout_shapes(self.layout, N, K, self.k)
        if self.packed.dtype != torch.int32:
            raise KbitFormatError(f"packed must be int32, got {self.packed.dtype}")
        if tuple(self.packed.shape) != packed_shape:
            raise KbitFormatError(
                f"packed has shape {list(self.packed.shape)}; expected {list(packed_shape)} "
                f"for N={N}, K={K}, k={self.k}, layout={self.layout}"
            )
        absmax_format_of(self.absmax)
        if tuple(self.absmax.shape) != absmax_shape:
            raise KbitFormatError(
                f"absmax has shape {list(self.absmax.shape)}; expected {list(absmax_shape)} "
                f"for N={N}, K={K}, layout={self.layout}"
            )
        check_codebook(self.codebook, self.k)
        if self.codebook.dtype != torch.float32:
            raise KbitFormatError(f"codebook must be float32, got {self.codebook.dtype}")
        if not (self.absmax.device == self.packed.device == self.codebook.device):
            raise KbitFormatError(
                f"packed ({self.packed.device}), absmax ({self.absmax.device}) and codebook "
                f"({self.codebook.device}) must be on one device"
            )
        if not (self.packed.is_contiguous() and self.absmax.is_contiguous()):
            raise KbitFormatError("packed and absmax must be contiguous")
        if not isinstance(self.absmax_exponent, int) or abs(self.absmax_exponent) > MAX_ABSMAX_EXPONENT:
            raise KbitFormatError(f"absmax_exponent must be a small int, got {self.absmax_exponent!r}")

    def to(self, device) -> "QuantizedWeight":
        device = torch.device(device)
        return replace(
            self,
            packed=self.packed.to(device),
            absmax=self.absmax.to(device),
            codebook=self.codebook.to(device),
        )

    def cuda(self, device=None) -> "QuantizedWeight":
        return self.to(torch.device("cuda", device) if isinstance(device, int) else device or "cuda")

    def cpu(self) -> "QuantizedWeight":
        return self.to("cpu")

    def __repr__(self) -> str:
        N, K = self.shape
        return (
            f"QuantizedWeight(N={N}, K={K}, k={self.k}, absmax_format={self.absmax_format!r}, "
            f"absmax_exponent={self.absmax_exponent}, layout={self.layout!r}, device={self.device})"
        )
