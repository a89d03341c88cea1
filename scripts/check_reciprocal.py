"""Exhaustive CPU check of the quantize kernel's division by an E4M4 block scale.
Usage: python scripts/check_reciprocal.py (NumPy only, a few minutes; exits 1 on a mismatch).

For E4M4 absmax the kernel (csrc/quantize.cu: divide_e4m4) computes x = RN(w / s), with
s = d * 2^t, d an E4M4 value in [2^-14, 31] and |t| <= 120, without a division per value:

    w' = w * 2^-t                 exact unless w' is subnormal
    y  = RN(1 / d)                once per block (__frcp_rn); y = 0 when d == 0
    q0 = RN(w' * y)
    r  = fma(-q0, d, w')          RN(w' - q0 d)
    x  = fma(r, y, q0)            RN(q0 + r y)

Claim A: x == RN(w' / d) == RN(w / s), bit for bit, whenever |w'| >= 2^-66.
Claim B: for |w'| < 2^-66, both x and RN(w / s) have magnitude <= 2^-48, where every valid
codebook gives the index of 0 (the lemma in quantize.cu, tested by emulate_quantize.py), so the
index is the same. (This covers subnormal w', subnormal quotients and w' that lost bits.)

Why finitely many cases prove claim A: with |w'| >= 2^-66 and d in [2^-14, 31], y, q0, x are
normal, and r is 0 or normal: w' is a multiple of 2^-89, q0 >= 2^-71 of 2^-94, d (5
significant bits) of 2^-18, so w' - q0 d is a multiple of 2^-112. Every step is one rounding
of an exact value, so scaling w' by 2^i and d by 2^j scales y, q0, r, x (and RN(w'/d)) by
exact powers of two: the outcome depends only on the significands. The sign is symmetric
(round-to-nearest-even is). w' has 2^23 significands; E4M4 values have 16 (1 + m/16; the
subnormal codes m * 2^-14 normalise into the same set). Part 1 runs all 16 * 2^23 pairs.
Parts 2-3 re-run them at the real extreme exponents of d, for quotients near 1 and near
2^-20 and at the 2^-66 boundary (checking the scaling argument itself); part 4 checks claim B
on subnormal w', subnormal quotients and the band just below 2^-66.

fma32 emulates a float32 FMA exactly: the product of two float32 is exact in float64, TwoSum
gives the exact error of the float64 sum, and a float32 midpoint hit by the rounded sum is
resolved with that error (the only case where rounding twice differs from rounding once).
"""

from __future__ import annotations

import sys

import numpy as np

F32, F64 = np.float32, np.float64
BOUND = 2.0**-66   # claim A below, claim B above
TINY = 2.0**-48    # the lemma's bound


def fma32(a, b, c):
    """float32 fma(a, b, c) = RN32(a * b + c) with one rounding, exactly."""
    a, b, c = (np.asarray(v, F32) for v in (a, b, c))
    p = a.astype(F64) * b.astype(F64)              # exact: 24 + 24 significant bits
    c64 = c.astype(F64)
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)              # TwoSum: s + err == p + c exactly
    r = s.astype(F32)
    up = s > r.astype(F64)
    other = np.nextafter(r, np.where(up, F32(np.inf), F32(-np.inf)))
    mid = (r.astype(F64) + other.astype(F64)) * 0.5 == s
    beyond = mid & (err != 0) & ((err > 0) == up)
    return np.where(beyond, other, r).astype(F32)


def divide_e4m4(w, d, shift_down):
    """The kernel's x = w / (d * 2^t) for an E4M4 value d, shift_down = 2^-t."""
    w = np.asarray(w, F32) * F32(shift_down)
    d = np.asarray(d, F32)
    with np.errstate(divide="ignore"):
        y = np.where(d > 0, F32(1) / d, F32(0)).astype(F32)
    q0 = (w * y).astype(F32)
    r = fma32(-q0, d, w)
    return fma32(r, y, q0)


def e4m4_values():
    codes = np.arange(1, 256)
    e, m = codes >> 4, codes & 15
    return np.where(e == 0, m / 16 * 2.0**-10, (1 + m / 16) * 2.0 ** (e - 11)).astype(F32)


def binade(e):
    """Every float32 in [2^e, 2^(e+1)) (normal e) or every positive subnormal (e == -149)."""
    if e == -149:
        return np.arange(1, 1 << 23, dtype=np.uint32).view(F32)
    return (np.arange(1 << 23, dtype=np.uint32) + np.uint32((e + 127) << 23)).view(F32)


def significand(d):
    return F32(d / 2.0 ** np.floor(np.log2(F64(d))))


FAILED = []


def run(label, w, d, exact):
    x = divide_e4m4(w, d, 1.0)
    want = (w / F32(d)).astype(F32)
    differ = x.view(np.int32) != want.view(np.int32)
    if exact:
        bad = int(differ.sum())
        note = ""
    else:
        bad = int(((np.abs(x) > TINY) | (np.abs(want) > TINY)).sum())
        note = f", {int(differ.sum())} differ from RN(w / s) (allowed: both are tiny)"
    print(f"{'ok  ' if bad == 0 else 'FAIL'} {label}: {w.size} dividends, {bad} mismatches{note}")
    if bad:
        i = np.flatnonzero(differ)[:3]
        print(f"     w={w[i]!r} d={d!r} got={x[i]!r} want={want[i]!r}")
        FAILED.append(label)


def main():
    values = e4m4_values()
    sig = np.array([significand(v) for v in values])
    mantissas = np.unique(sig)
    assert mantissas.size == 16 and np.array_equal(mantissas, (1 + np.arange(16) / 16).astype(F32))

    print("part 1: all 2^23 dividend significands x 16 divisor significands (quotients in (1/2, 2))")
    ones = binade(0)
    for m in mantissas:
        run(f"w in [1,2), d = {m}", ones, m, exact=True)
    run("negative w in [1,2), d = 1.0625", -ones, F32(1.0625), exact=True)

    print("part 2: real E4M4 divisors at their smallest and largest exponent, quotients ~1 and ~2^-20")
    for m in mantissas:
        ds = values[sig == m]
        for d in (ds.min(), ds.max()):
            e = int(np.floor(np.log2(F64(d))))
            run(f"d = {float(d):<14.8g} w in [2^{e}, 2^{e + 1})", binade(e), d, exact=True)
            run(f"d = {float(d):<14.8g} w in [2^{e - 20}, 2^{e - 19})", binade(e - 20), d, exact=True)

    print("part 3: the claim-A boundary, |w'| in [2^-66, 2^-65), largest and smallest d per significand")
    for m in mantissas:
        ds = values[sig == m]
        for d in (ds.min(), ds.max()):
            run(f"d = {float(d):<14.8g} w in [2^-66, 2^-65)", binade(-66), d, exact=True)

    print("part 4 (claim B): |w'| < 2^-66: subnormal w', subnormal quotients, just below the bound")
    for m in mantissas:
        ds = values[sig == m]
        for d in (ds.min(), ds.max()):
            for e in (-67, -126, -149):
                run(f"d = {float(d):<14.8g} w in binade 2^{e}", binade(e), d, exact=False)
    zeros = np.array([0.0, -0.0], F32)
    for d in (values.min(), values.max()):
        run(f"d = {float(d):.8g} w = +-0", zeros, d, exact=False)

    print("zero scale: y = 0 gives x = 0 for any finite w'")
    w = np.concatenate([binade(0), -binade(10), binade(-149)])
    x = divide_e4m4(w, F32(0), 1.0)
    ok = bool((x == 0).all())
    print(f"{'ok  ' if ok else 'FAIL'} d = 0: {w.size} dividends")
    if not ok:
        FAILED.append("zero scale")

    print(f"{len(FAILED)} failing case(s)")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
