"""Pure-PyTorch implementation of every kbit op: the CPU backend and the test oracle.

These follow docs/format.md literally and run on any device. The CUDA kernels must match
quantize and repack bit for bit, and dequantize exactly (one rounding, from float32 to the
output dtype). The matmul references dequantize in float32 and multiply in float64.
"""

from __future__ import annotations

import torch

from .format import (
    ABSMAX_RANGE,
    KbitFormatError,
    check_codebook,
    BLOCK_SIZE,
    TILE_BLOCKS,
    decode_absmax,
    encode_absmax,
    layout_shapes,
    num_blocks,
    pack_bitplanes,
    unpack_bitplanes,
)

# rows per chunk in the reference quantizer, to bound the [rows, K, 2**k] distance tensor
_CHUNK_ELEMENTS = 1 << 22


def block_absmax(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] -> float32 [N, KB]: max |w| over each block of 32 (zero padding)."""
    N, K = weight.shape
    kb = num_blocks(K)
    w = torch.nn.functional.pad(weight.to(torch.float32), (0, kb * BLOCK_SIZE - K))
    return w.view(N, kb, BLOCK_SIZE).abs().amax(-1)


def block_scale(absmax_stored: torch.Tensor, absmax_exponent: int) -> torch.Tensor:
    """Stored absmax -> float32 scale = decoded * 2**absmax_exponent (exact)."""
    return decode_absmax(absmax_stored) * (2.0**absmax_exponent)


def nearest_index(x: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """Index of the codebook entry nearest to each x (float32 |x - c|), ties to the lower index."""
    out = torch.empty(x.shape, dtype=torch.int64, device=x.device)
    flat_x, flat_out = x.reshape(-1), out.view(-1)
    step = max(1, _CHUNK_ELEMENTS // codebook.numel())
    for s in range(0, flat_x.numel(), step):
        d = (flat_x[s : s + step, None] - codebook[None, :]).abs()
        flat_out[s : s + step] = d.argmin(-1)  # argmin returns the first minimum
    return out


def quantize(
    weight: torch.Tensor, codebook: torch.Tensor, absmax_format: str, absmax_exponent: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[N, K] weight -> (packed int32 [N, KB, k], absmax [N, KB], status int32 [3]).

    status[0] = 1 if the weight has a NaN/Inf, status[1] = 1 if a block absmax * 2**-exponent
    falls outside the absmax format's range (those blocks hold unspecified values), status[2] = 1
    if the codebook breaks the format's rules (then every index is unspecified).
    """
    k = codebook.numel().bit_length() - 1
    N, K = weight.shape
    kb = num_blocks(K)
    status = torch.zeros(3, dtype=torch.int32, device=weight.device)
    try:
        check_codebook(codebook, k)
    except KbitFormatError:
        status[2] = 1
    w = weight.to(torch.float32)
    if not torch.isfinite(w).all():
        status[0] = 1
    w = torch.nn.functional.pad(w, (0, kb * BLOCK_SIZE - K)).view(N, kb, BLOCK_SIZE)
    shifted = w.abs().amax(-1) * (2.0**-absmax_exponent)
    lo, hi = ABSMAX_RANGE[absmax_format]
    bad = ~((shifted == 0) | ((shifted >= lo) & (shifted <= hi)))
    if bad.any():
        status[1] = 1
        shifted = torch.where(bad, torch.zeros_like(shifted), shifted)
    stored = encode_absmax(shifted, absmax_format)
    scale = block_scale(stored, absmax_exponent)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    x = torch.where(scale[..., None] > 0, w / safe[..., None], torch.zeros_like(w))
    x = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    idx = nearest_index(x, codebook.to(torch.float32))
    return pack_bitplanes(idx, k), stored, status


def dequantize(
    packed: torch.Tensor,
    absmax: torch.Tensor,
    codebook: torch.Tensor,
    shape: tuple[int, int],
    layout: str,
    absmax_exponent: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Packed weight in any layout -> [N, K] in dtype (float32 arithmetic, one rounding)."""
    N, K = shape
    k = codebook.numel().bit_length() - 1
    if layout != "flat":
        packed, absmax = unrepack(packed, absmax, shape, k, layout)
    idx = unpack_bitplanes(packed, k)  # [N, KB, 32]
    vals = codebook.to(torch.float32)[idx] * block_scale(absmax, absmax_exponent)[..., None]
    return vals.reshape(N, -1)[:, :K].to(dtype)


def repack(
    packed: torch.Tensor, absmax: torch.Tensor, shape: tuple[int, int], k: int, layout: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat -> runtime layout.

    tiled64: k-tiles of TILE_BLOCKS = 2 blocks (64 values). Word (kt, n, j, b) sits at
    ((kt * N + n) * 2 + j) * k + b and holds flat block (n, 2 * kt + j); absmax likewise at
    (kt * N + n) * 2 + j. A missing last block (odd KB) is zero words and a zero absmax.
    """
    N, K = shape
    if layout == "flat":
        return packed.clone(), absmax.clone()
    packed_shape, absmax_shape = layout_shapes(layout, N, K, k)
    kt = packed_shape[0]
    pad = kt * TILE_BLOCKS - num_blocks(K)
    p = torch.nn.functional.pad(packed, (0, 0, 0, pad)).view(N, kt, TILE_BLOCKS, k)
    a = torch.nn.functional.pad(absmax, (0, pad)).view(N, kt, TILE_BLOCKS)
    return p.permute(1, 0, 2, 3).contiguous(), a.permute(1, 0, 2).contiguous()


def unrepack(
    packed: torch.Tensor, absmax: torch.Tensor, shape: tuple[int, int], k: int, layout: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Runtime layout -> flat (inverse of `repack`; padding blocks are dropped)."""
    N, K = shape
    if layout == "flat":
        return packed.clone(), absmax.clone()
    kb = num_blocks(K)
    p = packed.permute(1, 0, 2, 3).reshape(N, -1, k)[:, :kb].contiguous()
    a = absmax.permute(1, 0, 2).reshape(N, -1)[:, :kb].contiguous()
    return p, a


def linear(
    x: torch.Tensor, weight_fp32: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """C = x @ W^T (+ bias) in float64 from a float32 dequantized W, returned in x.dtype."""
    out = x.to(torch.float64) @ weight_fp32.to(torch.float64).T
    if bias is not None:
        out = out + bias.to(torch.float64)
    return out.to(x.dtype)


def expert_linear(
    x: torch.Tensor, weights_fp32: list[torch.Tensor], expert_offsets: torch.Tensor
) -> torch.Tensor:
    """Grouped matmul: rows expert_offsets[e]:expert_offsets[e+1] of x use weights_fp32[e]."""
    offs = expert_offsets.tolist()
    n = weights_fp32[0].shape[0]
    out = torch.empty(x.shape[0], n, dtype=torch.float64, device=x.device)
    for e, w in enumerate(weights_fp32):
        rows = slice(offs[e], offs[e + 1])
        out[rows] = x[rows].to(torch.float64) @ w.to(torch.float64).T
    return out.to(x.dtype)
