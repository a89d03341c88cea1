"""An independent NumPy implementation of docs/format.md §1 (quantize and dequantize), written
from the text rather than from kbit's code, to check kbit bit for bit."""

import numpy as np


def e4m4_values():
    out = []
    for code in range(256):
        e, m = code >> 4, code & 15
        out.append(m / 16 * 2.0**-10 if e == 0 else (1 + m / 16) * 2.0 ** (e - 11))
    return np.array(out, dtype=np.float64)


def encode_scale(a, fmt):
    """float32 absmax (in range) -> (stored array, decoded float32 array)."""
    if fmt == "fp32":
        return a.astype(np.float32), a.astype(np.float32)
    if fmt == "fp16":
        h = a.astype(np.float16)
        return h, h.astype(np.float32)
    table = e4m4_values()
    d = np.abs(table[None, :] - a.astype(np.float64).reshape(-1, 1))
    best = d.min(1, keepdims=True)
    cand = d == best  # one or two nearest codes; a tie goes to the even code
    code = np.where(cand.sum(1) > 1, np.argmax(cand & (np.arange(256) % 2 == 0), 1), np.argmin(d, 1))
    code = code.reshape(a.shape).astype(np.uint8)
    return code, table[code].astype(np.float32)


def quantize(w, codebook, fmt="e4m4", exponent=0):
    """w: float32 [N, K] ndarray. Returns (indices [N, KB, 32], stored absmax [N, KB])."""
    n, k = w.shape
    kb = -(-k // 32)
    wp = np.zeros((n, kb * 32), np.float32)
    wp[:, :k] = w
    wp = wp.reshape(n, kb, 32)
    absmax = np.abs(wp).max(-1) * np.float32(2.0**-exponent)
    stored, decoded = encode_scale(absmax.astype(np.float32), fmt)
    scale = (decoded * np.float32(2.0**exponent)).astype(np.float32)
    with np.errstate(invalid="ignore", divide="ignore"):
        x = np.where(scale[..., None] > 0, wp / scale[..., None], np.float32(0)).astype(np.float32)
    cb = codebook.astype(np.float32)
    dist = np.abs(x[..., None] - cb).astype(np.float32)
    return np.argmin(dist, -1), stored  # argmin: first (lowest) index among ties


def dequantize(indices, stored, codebook, fmt, exponent, k_cols):
    if fmt == "e4m4":
        decoded = e4m4_values()[stored].astype(np.float32)
    else:
        decoded = stored.astype(np.float32)
    scale = (decoded * np.float32(2.0**exponent)).astype(np.float32)
    vals = codebook.astype(np.float32)[indices] * scale[..., None]
    return vals.reshape(indices.shape[0], -1)[:, :k_cols]
