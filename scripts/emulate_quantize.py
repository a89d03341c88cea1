"""CPU emulation of the CUDA quantize kernel's arithmetic (csrc/quantize.cu), bit for bit in
float32, checked against kbit.reference. No GPU needed (exits non-zero on any mismatch):
    PYTHONPATH=. python scripts/emulate_quantize.py [seed] [--quick]

Emulated: the decision thresholds (bisection over the float32 order), the bucket table and
its fix-up step (fast path and the dense-codebook loop), the E4M4 division by a reciprocal
with one FMA correction, and the bit-plane assembly (spread words, byte permutes, the lane
exchange). Checked:
  1. fma32 (the emulated FMA) against exact rational arithmetic;
  2. the index search against reference.nearest_index: nf codebooks k = 2..5 and user
     codebooks (random with a pair 2^-19 apart, clustered ones that take the dense path,
     entries at 0, +-2^-21, a subnormal entry) on random values, every midpoint, threshold,
     codebook entry and bucket boundary +-3 ulps, +-0, +-2, +-3 and tiny values (the kernel
     sees |x| <= 1.5; far out, around |x| ~ 2^25, the reference's rounded distances all tie);
  5. the integer E4M4 encoder (e4m4_code) against kbit.format for every float32 in [0, 31]
     (skipped with --quick).
  3. the reciprocal division against IEEE division (sampled; the exhaustive proof is
     scripts/check_reciprocal.py) and the claim that all |x| <= 2^-48 share one index;
  4. whole weights: packed words against reference.quantize for every k, input dtype, absmax
     format, several absmax exponents and widths that are not a multiple of 32.
"""

from __future__ import annotations

import sys
from fractions import Fraction

import numpy as np
import torch

from check_reciprocal import divide_e4m4, fma32
from kbit import reference as ref
from kbit.format import (ABSMAX_RANGE, choose_absmax_exponent, decode_absmax, e4m4_encode,
                         encode_absmax, nf_codebook)

F32, F64 = np.float32, np.float64
N_BUCKETS = 256          # bucket = round(256 * sat(x / 4 + 1/2)): x in [-2, 2] in steps of 1/64
TINY = F32(2.0**-48)     # every |x| <= TINY has the index of 0 (see check_tiny_lemma)


# ----------------------------------------------------------------------------- float32 helpers


def sat(x):
    """PTX .sat: clamp to [0, 1], NaN -> 0."""
    return np.where(np.isnan(x), F32(0), np.clip(x, F32(0), F32(1))).astype(F32)


def order_key(f):
    i = np.asarray(f, F32).view(np.int32).astype(np.int64)
    return np.where(i < 0, i ^ 0x7FFFFFFF, i)


def from_order_key(k):
    k = np.asarray(k, np.int64)
    return np.where(k < 0, k ^ 0x7FFFFFFF, k).astype(np.int32).view(F32)


def ulps(v, n):
    """v and its n float32 neighbours on each side."""
    v = np.asarray(v, F32).ravel()
    out, up, dn = [v], v, v
    for _ in range(n):
        up, dn = np.nextafter(up, F32(np.inf)), np.nextafter(dn, F32(-np.inf))
        out += [up, dn]
    return np.concatenate(out)


# ----------------------------------------------------------------------------- index search


def decision_thresholds(cb):
    """quantize.cu: decision_threshold for every adjacent pair (smallest x picking hi)."""
    lo, hi = cb[:-1], cb[1:]
    below, above = order_key(lo), order_key(hi)
    while True:
        active = above - below > 1
        if not active.any():
            return from_order_key(above)
        mid = below + (above - below) // 2
        x = from_order_key(mid)
        pick_hi = np.abs(x - hi) < np.abs(x - lo)   # float32 arithmetic
        above = np.where(active & pick_hi, mid, above)
        below = np.where(active & ~pick_hi, mid, below)


def bucket_of(x):
    """quantize.cu: bucket_of: the bits of the subnormal sat(x / 4 + 1/2) * 2^-141. Monotone
    in x; NaN -> bucket 0."""
    u = sat(fma32(x, F32(0.25), F32(0.5)))
    v = u * F32(2.0**-141)  # float32 multiply with subnormal result (NumPy keeps subnormals)
    return v.view(np.uint32).astype(np.int64)


class Tables:
    """The kernel's shared-memory tables for one codebook."""

    def __init__(self, cb):
        cb = np.asarray(cb, F32)
        self.n = cb.size
        t = decision_thresholds(cb)
        self.thr = np.append(t, F32(np.nan))       # [n - 1] = NaN: no threshold above
        bt = bucket_of(t)
        # start[b] = number of thresholds in buckets below b (the kernel stores 4x that)
        self.start = (bt[None, :] < np.arange(N_BUCKETS + 1)[:, None]).sum(1)
        self.dense = bool((bt[1:] == bt[:-1]).any())

    def index(self, x):
        """Number of thresholds <= x (the nearest-entry index)."""
        x = np.asarray(x, F32)
        c = self.start[bucket_of(x)]
        if not self.dense:  # at most one threshold per bucket: one comparison settles it
            return c + (self.thr[c] <= x)
        while True:
            step = self.thr[c] <= x   # NaN sentinel stops at n - 1
            if not step.any():
                return c
            c = c + step


# ----------------------------------------------------------------------------- E4M4, division


def e4m4_code(v):
    """quantize.cu: e4m4_code, for float32 v in [0, 31]."""
    v = np.asarray(v, F32)
    b = v.view(np.uint32)
    normal = ((b + np.uint32(0x3FFFF) + ((b >> np.uint32(19)) & np.uint32(1))) >> np.uint32(19)) - np.uint32(116 << 4)
    # fma(v, 2^14, 2^23) = 2^23 + rint(v * 2^14): v * 2^14 < 16 is exact, one rounding to an integer
    sub = np.rint(v.astype(F64) * 2.0**14).astype(np.uint32)
    return np.where(v < F32(2.0**-10), sub, normal)



def divide_ieee(w, scale):
    w, scale = np.asarray(w, F32), np.asarray(scale, F32)
    safe = np.where(scale > 0, scale, F32(1))
    return np.where(scale > 0, w / safe, F32(0)).astype(F32)


# ----------------------------------------------------------------------------- plane assembly


def byte_perm(x, y, sel):
    """CUDA __byte_perm: byte i of the result = byte (nibble i of sel) of {y:x}."""
    src = (np.asarray(y, np.uint64) << np.uint64(32)) | np.asarray(x, np.uint64)
    out = np.zeros(np.shape(src), np.uint64)
    for i in range(4):
        s = (sel >> (4 * i)) & 7
        out |= ((src >> np.uint64(8 * s)) & np.uint64(0xFF)) << np.uint64(8 * i)
    return out.astype(np.uint32)


def spread(idx, k):
    """Bit b < 4 of idx at bit 8b (the kernel's spread table)."""
    idx = np.asarray(idx, np.uint32)
    out = np.zeros(idx.shape, np.uint32)
    for b in range(min(k, 4)):
        out |= ((idx >> np.uint32(b)) & np.uint32(1)) << np.uint32(8 * b)
    return out


def lane_elements(q):
    """Block elements held by lane q (value j of the lane): [8q, 8q+8) then [16+8q, 16+8q+8)."""
    return [8 * q + (j & 7) + 16 * (j >> 3) for j in range(16)]


def pack_planes(idx, k):
    """idx [blocks, 32] -> planes [blocks, k] uint32, as the kernel's two lanes build them."""
    words = {}  # (lane, pair) -> 32-bit word with that lane's halves of planes 2p, 2p + 1
    for q in (0, 1):
        v = idx[:, lane_elements(q)].astype(np.uint32)
        a = sum(spread(v[:, j], k) << np.uint32(j) for j in range(8))
        b = sum(spread(v[:, j], k) << np.uint32(j - 8) for j in range(8, 16))
        words[q, 0] = byte_perm(a, b, 0x5140)
        words[q, 1] = byte_perm(a, b, 0x7362)
        if k == 5:  # bit 4 straight into a 16-bit half (no spread)
            words[q, 2] = sum(((v[:, j] >> np.uint32(4)) & np.uint32(1)) << np.uint32(j) for j in range(16))
    planes = np.zeros((idx.shape[0], k), np.uint32)
    for p in range((k + 1) // 2):
        for q in (0, 1):
            if 2 * p + q < k:
                own, recv = words[q, p], words[1 - q, p]   # __shfl_xor_sync(.., 1)
                planes[:, 2 * p + q] = byte_perm(own, recv, 0x3726 if q else 0x5140)
    return planes


def quantize(weight, codebook, absmax_format, absmax_exponent):
    """Emulated kernel output for finite weights: (packed int32 [N, KB, k], stored absmax).
    fp16/fp32 absmax are plain casts (the reference's)."""
    k = codebook.numel().bit_length() - 1
    n, kdim = weight.shape
    kb = -(-kdim // 32)
    w = np.zeros((n, kb * 32), F32)
    w[:, :kdim] = weight.float().numpy()
    w = w.reshape(n * kb, 32)
    shifted = (np.abs(w).max(1) * F32(2.0**-absmax_exponent)).astype(F32)
    lo, hi = ABSMAX_RANGE[absmax_format]
    shifted[~((shifted == 0) | ((shifted >= lo) & (shifted <= hi)))] = 0
    if absmax_format == "e4m4":
        stored = torch.from_numpy(e4m4_code(shifted).astype(np.uint8))
        x = divide_e4m4(w, decode_absmax(stored).numpy()[:, None], 2.0**-absmax_exponent)
    else:
        stored = encode_absmax(torch.from_numpy(shifted), absmax_format)
        scale = (decode_absmax(stored).numpy() * F32(2.0**absmax_exponent)).astype(F32)
        x = divide_ieee(w, scale[:, None])
    idx = Tables(codebook.numpy()).index(x)
    return torch.from_numpy(pack_planes(idx, k).view(np.int32).reshape(n, kb, k)), stored.view(n, kb)


# ----------------------------------------------------------------------------- checks

FAILURES = []


def expect(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        FAILURES.append(what)


def check_fma32(rng):
    a = rng.standard_normal(4000).astype(F32)
    b = rng.standard_normal(4000).astype(F32)
    c = (rng.standard_normal(4000) * 10.0 ** rng.integers(-12, 3, 4000)).astype(F32)
    # constructed double-rounding cases: a * b lands next to a float32 midpoint of c
    c[:1000] = F32(1)
    a[:1000] = F32(1) + F32(2.0**-23) * rng.integers(1, 4, 1000).astype(F32)
    b[:1000] = F32(2.0**-24) * (F32(1) + F32(2.0**-23) * rng.integers(-3, 4, 1000).astype(F32))
    got = fma32(a, b, c)
    bad = 0
    for i in range(a.size):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        lo = F32(float(exact))  # Fraction -> float64 is correctly rounded; refine below
        cands = [np.nextafter(lo, F32(-np.inf)), lo, np.nextafter(lo, F32(np.inf))]
        dist = [abs(Fraction(float(v)) - exact) for v in cands]
        best = min(dist)
        winners = [v for v, dd in zip(cands, dist) if dd == best]
        want = winners[0] if len(winners) == 1 else [v for v in winners if not (v.view(np.int32) & 1)][0]
        bad += got[i].view(np.int32) != want.view(np.int32)
    expect(bad == 0, f"fma32 vs exact rationals on {a.size} cases ({bad} mismatches)")


def test_values(cb, t, rng):
    mids = ((cb[1:].astype(F64) + cb[:-1].astype(F64)) / 2).astype(F32)
    edges = (np.arange(N_BUCKETS + 1, dtype=F64) + 0.5) / 64 - 2  # bucket boundaries in x
    special = np.array([0, -0.0, 2, -2, 1, -1, 1.5, -1.5, 2**-149, -(2**-149), 2**-126, -(2**-126),
                        2**-60, -(2**-60), 2**-48, -(2**-48), 3, -3], F32)
    return np.concatenate([
        rng.uniform(-1.6, 1.6, 200000).astype(F32),
        (rng.standard_normal(200000) * 0.4).astype(F32),
        ulps(mids, 3), ulps(t, 3), ulps(cb, 3), ulps(edges, 3), ulps(special, 3),
    ])


def codebooks(rng):
    out = []
    for k in (2, 3, 4, 5):
        n = 2**k
        out.append((f"nf k={k}", nf_codebook(k).numpy()))
        for s in range(3):  # as tests/test_quantize.py: random, one pair 2^-19 apart
            u = np.sort(rng.uniform(-1, 1, n)).astype(F32)
            u[0], u[-1] = -1, 1
            u[n // 2] = u[n // 2 - 1] + F32(2.0**-19)
            u = np.sort(u)
            if (np.diff(u.astype(F64)) >= 2.0**-20).all():
                out.append((f"user k={k} #{s}", u))
        # a cluster 2^-19 apart around a random point: many thresholds share a bucket
        centre = rng.uniform(-0.5, 0.5)
        u = np.concatenate([np.linspace(-1, -0.9, n // 2, dtype=F64),
                            centre + 2.0**-19 * np.arange(n // 2 - 1), [1.0]]).astype(F32)
        out.append((f"cluster k={k}", np.sort(u)))
    out.append(("around 0 (+-2^-21)", np.array([-1, -(2**-21), 2**-21, 1], F32)))
    out.append(("exact 0 entry", np.array([-1, -0.5, 0, 1], F32)))
    out.append(("subnormal entry", np.array([-1, 1e-40, 0.5, 1], F32)))
    out.append(("tiny + 2^-20", np.array([-1, -(2**-20), 1e-45, 1], F32)))
    out.append(("uniform k=5", np.linspace(-1, 1, 32).astype(F32)))
    return out


def check_index(rng):
    paths = set()
    for name, cb in codebooks(rng):
        assert (np.diff(cb.astype(F64)) >= 2.0**-20).all() and cb.min() >= -1 and cb.max() <= 1, name
        tab = Tables(cb)
        paths.add(tab.dense)
        x = test_values(cb, tab.thr[:-1], rng)
        got = tab.index(x)
        want = ref.nearest_index(torch.from_numpy(x), torch.from_numpy(cb)).numpy()
        bad = np.flatnonzero(got != want)
        expect(bad.size == 0, f"index {name:20s} {'dense' if tab.dense else 'fast '} path, "
               f"{x.size} values" + (f": x={x[bad[:3]]} got {got[bad[:3]]} want {want[bad[:3]]}" if bad.size else ""))
    expect(paths == {True, False}, "both the fast path and the dense-codebook loop were exercised")


def check_tiny_lemma(rng):
    """|x| <= 2^-48 all index like 0, for every codebook tried (docs in quantize.cu)."""
    tiny = np.concatenate([ulps(np.array([0, TINY, -TINY, 2**-126, -(2**-126)], F32), 4),
                           (rng.uniform(-1, 1, 20000) * TINY).astype(F32)])
    tiny = tiny[np.abs(tiny) <= TINY]
    ok = True
    for name, cb in codebooks(rng):
        idx = ref.nearest_index(torch.from_numpy(tiny), torch.from_numpy(cb)).numpy()
        ok &= bool((idx == idx[0]).all())
    expect(ok, "every |x| <= 2^-48 has the index of x = 0 (all codebooks)")


def check_division(rng):
    codes = np.arange(1, 256)
    e, m = codes >> 4, codes & 15
    d = np.where(e == 0, m / 16 * 2.0**-10, (1 + m / 16) * 2.0 ** (e - 11)).astype(F32)
    bad = 0
    for t in (0, 7, -9, 120, -120):
        w = (rng.uniform(-1, 1, (d.size, 4000)) * d[:, None] * 2.0**t).astype(F32)
        got = divide_e4m4(w, d[:, None], 2.0**-t)
        want = divide_ieee(w, (d * F32(2.0**t))[:, None])
        bad += int((got.view(np.int32) != want.view(np.int32)).sum())
    expect(bad == 0, f"reciprocal division == IEEE division, every E4M4 code, exponents 0, +-7..120 ({bad} mismatches)")


def check_e4m4_code():
    """Every float32 in [0, 31] against kbit.format.e4m4_encode (~1 minute)."""
    top = int(F32(31).view(np.uint32))
    bad = 0
    for s in range(0, top + 1, 1 << 24):
        v = np.arange(s, min(s + (1 << 24), top + 1), dtype=np.uint32).view(F32)
        got = e4m4_code(v)
        bad += int((got > 255).sum()) + int((got.astype(np.uint8) != e4m4_encode(torch.from_numpy(v)).numpy()).sum())
    expect(bad == 0, f"e4m4_code == kbit.format.e4m4_encode for all {top + 1} float32 in [0, 31] ({bad} mismatches)")


def check_quantize(rng):
    gen = torch.Generator().manual_seed(int(rng.integers(1 << 31)))
    for k in (2, 3, 4, 5):
        u = np.sort(rng.uniform(-1, 1, 2**k)).astype(F32)
        u[0], u[-1] = -1, 1
        cbs = [nf_codebook(k), torch.from_numpy(u)]
        for fmt in ("e4m4", "fp16", "fp32"):
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                for n, kdim, mag in ((64, 256, 0.05), (7, 100, 1.0), (16, 96, 1e-30), (9, 64, 1e20)):
                    if dtype == torch.float16 and mag not in (0.05, 1.0):
                        continue
                    w = (torch.randn(n, kdim, generator=gen, dtype=torch.float64) * mag
                         * 10.0 ** (-2 * torch.rand(n, 1, generator=gen, dtype=torch.float64))).to(dtype)
                    w[0, : min(kdim, 40)] = 0  # an all-zero block
                    for cb in cbs:
                        e = choose_absmax_exponent(ref.block_absmax(w), fmt)
                        want = ref.quantize(w, cb, fmt, e)[:2]
                        got = quantize(w, cb, fmt, e)
                        if not (torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])):
                            expect(False, f"quantize k={k} {fmt} {dtype} {n}x{kdim} mag={mag} e={e}")
                            return
    expect(True, "whole-weight emulation == reference.quantize, packed and absmax (k 2..5, "
                 "fp32/fp16/bf16, e4m4/fp16/fp32, exponents, K % 32 != 0)")


def main():
    seeds = [a for a in sys.argv[1:] if a.isdigit()]
    rng = np.random.default_rng(int(seeds[0]) if seeds else 0)
    check_fma32(rng)
    check_index(rng)
    check_tiny_lemma(rng)
    check_division(rng)
    check_quantize(rng)
    if "--quick" not in sys.argv:
        check_e4m4_code()
    print(f"{len(FAILURES)} failure(s)")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
