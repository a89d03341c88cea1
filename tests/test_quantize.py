"""kbit.quantize / dequantize / repack on every device present, bit for bit against an
independent implementation of the format and against kbit.reference."""

import numpy as np
import pytest
import torch

import kbit
from kbit import ops
from kbit import reference as ref
from kbit.format import KbitFormatError, nf_codebook, unpack_bitplanes

import independent
from conftest import GPU, random_weight

DEVICES = ["cpu"] + (["cuda"] if GPU else [])
SHAPES = [(1, 1), (3, 33), (200, 96), (17, 4128), (64, 2048)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _check_against_independent(w, q, fmt):
    idx, stored = independent.quantize(w.float().cpu().numpy(), q.codebook.cpu().numpy(), fmt, q.absmax_exponent)
    got_idx = unpack_bitplanes(q.packed.cpu(), q.k).numpy()
    assert np.array_equal(got_idx, idx), f"indices differ at {np.argwhere(got_idx != idx)[:5]}"
    got_stored = q.absmax.cpu().numpy()
    assert np.array_equal(got_stored.view(np.uint8), np.asarray(stored).view(np.uint8))
    for dtype in DTYPES:
        d = kbit.dequantize(q, dtype)
        want = independent.dequantize(idx, stored, q.codebook.cpu().numpy(), fmt, q.absmax_exponent, w.shape[1])
        assert torch.equal(d.cpu(), torch.from_numpy(want).to(dtype)), dtype


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k", [2, 3, 4, 5])
@pytest.mark.parametrize("fmt", ["e4m4", "fp16", "fp32"])
def test_quantize_matches_independent(device, k, fmt, rng):
    for (n, kdim), dtype in zip(SHAPES, DTYPES * 2):
        # Rows spread over 2 decades plus a partial last block of a few values can, rarely, span
        # more than E4M4's ~5.7 decades (seen once: 1.7e-6 .. 0.98); the format refuses such a
        # tensor by design (tested in test_out_of_range_absmax_*), so draw again.
        for _ in range(20):
            w = random_weight(n, kdim, dtype, rng, device)
            try:
                q = kbit.quantize(w, k=k, absmax_format=fmt)
                break
            except KbitFormatError:
                if fmt != "e4m4":
                    raise
        assert q.shape == (n, kdim) and q.device.type == device
        _check_against_independent(w, q, fmt)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_adversarial_values(device, k, rng):
    cb = nf_codebook(k).double()
    # exact codebook midpoints (ties), codebook values, zeros, a lone nonzero, +-absmax
    mids = ((cb[1:] + cb[:-1]) / 2).float()
    row = torch.cat([mids, cb.float(), -mids, torch.zeros(5), torch.tensor([1.0, -1.0])])
    w = torch.zeros(6, 128)
    w[0, : row.numel()] = row[:128]
    w[1, 40] = 3e-3
    w[2] = torch.randn(128, generator=rng).sign() * 0.25   # ties at the absmax in every block
    w[3, :64] = 2.0**-14                                    # smallest E4M4 scale exactly
    w[4] = torch.randn(128, generator=rng) * 5              # absmax in the top E4M4 binade
    w = w.to(device)
    q = kbit.quantize(w, k=k)
    _check_against_independent(w, q, "e4m4")
    assert (kbit.dequantize(q, torch.float32)[5] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["e4m4", "fp16"])
def test_out_of_range_absmax_gets_tensor_scale(device, fmt, rng):
    big = random_weight(8, 64, gen=rng, device=device, spread=0) * (1e3 if fmt == "e4m4" else 1e6)
    q = kbit.quantize(big, k=4, absmax_format=fmt)
    assert q.absmax_exponent > 0
    _check_against_independent(big, q, fmt)
    rel = (kbit.dequantize(q, torch.float32) - big).norm() / big.norm()
    assert rel < 0.15  # 4-bit quantization error, not saturation (which would be ~1)
    tiny = random_weight(8, 64, gen=rng, device=device, spread=0) * 1e-6
    q = kbit.quantize(tiny, k=4, absmax_format=fmt)
    assert q.absmax_exponent < (0 if fmt == "e4m4" else 1)
    _check_against_independent(tiny, q, fmt)
    assert (kbit.dequantize(q, torch.float32) - tiny).norm() / tiny.norm() < 0.15
    wide = torch.ones(2, 64, device=device)
    wide[1] *= 1e-12
    with pytest.raises(KbitFormatError, match="range"):
        kbit.quantize(wide, k=4, absmax_format=fmt)


@pytest.mark.parametrize("device", DEVICES)
def test_zero_weight(device):
    q = kbit.quantize(torch.zeros(3, 70, device=device), k=3)
    assert (q.absmax == 0).all()
    assert (kbit.dequantize(q, torch.float32) == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_weight_raises(device, bad):
    w = torch.randn(4, 64, device=device)
    w[2, 17] = bad
    with pytest.raises(ValueError, match="NaN or Inf"):
        kbit.quantize(w, k=4)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_weight(device, rng):
    base = random_weight(96, 200, torch.float16, rng, device)
    for view in (base.T, base[::2], base[:, 5:133]):
        assert not view.is_contiguous()
        q, qc = kbit.quantize(view, k=4), kbit.quantize(view.contiguous(), k=4)
        assert torch.equal(q.packed, qc.packed) and torch.equal(q.absmax, qc.absmax)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k", [2, 3, 4, 5])
@pytest.mark.parametrize("fmt", ["e4m4", "fp16", "fp32"])
def test_repack_roundtrip_and_tiled_dequantize(device, k, fmt, rng):
    for n, kdim in [(1, 1), (5, 33), (7, 64), (130, 4128)]:
        q = kbit.quantize(random_weight(n, kdim, gen=rng, device=device), k=k, absmax_format=fmt)
        t = kbit.repack(q)
        assert t.layout == "tiled64"
        p, a = ref.repack(q.packed.cpu(), q.absmax.cpu(), q.shape, k, "tiled64")
        assert torch.equal(t.packed.cpu(), p) and torch.equal(t.absmax.cpu(), a)
        # the layout's index formula, spelled out
        kb = q.packed.shape[1]
        for nn, b in [(0, 0), (n - 1, kb - 1), (n // 2, kb // 2)]:
            kt, j = divmod(b, 2)
            assert torch.equal(t.packed.reshape(-1, k)[(kt * n + nn) * 2 + j].cpu(), q.packed[nn, b].cpu())
        u = kbit.unrepack(t)
        assert torch.equal(u.packed, q.packed) and torch.equal(u.absmax, q.absmax)
        for dtype in DTYPES:
            assert torch.equal(kbit.dequantize(t, dtype), kbit.dequantize(q, dtype))


def _dequantize_guarded(t, dtype, device, offset, guard=64):
    """kbit.dequantize(t, out=...) into a NaN-poisoned buffer, `offset` elements into it
    (1: not 16-byte aligned), with `guard` poisoned elements after the output; asserts the
    elements outside the output stayed NaN and returns the output."""
    n, kdim = t.shape
    buf = torch.full((offset + n * kdim + guard,), float("nan"), dtype=dtype, device=device)
    out = buf[offset: offset + n * kdim].view(n, kdim)
    kbit.dequantize(t, out=out)
    assert buf[:offset].isnan().all() and buf[offset + n * kdim:].isnan().all(), (n, kdim, dtype, "written outside")
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_tiled_dequantize_edges(device, k, rng):
    """tiled64 -> fp16 / bf16 against kbit.reference, on the shapes that the CUDA block-per-lane
    kernel (16-bit outputs, K % 8 == 0) must cut: rows not a multiple of 8, a missing last
    block (odd KB), a partial last block (K % 32 == 8, 16, 24), one unit, several warps per
    band, a per-tensor power of two; the output poisoned with NaN first, with poisoned guard
    elements after it (a store past row N - 1 or column K - 1 of the last row shows there); an
    output that is not 16-byte aligned (the other kernel), with a guard element before it.
    Exact: both sides round the same float32 product once."""
    shapes = [(1, 8), (7, 64), (17, 40), (33, 200), (16, 1024), (37, 1096), (300, 2112)]
    for n, kdim in shapes:
        # (37, 1096) scaled past E4M4's range: a per-tensor power of two (absmax_exponent > 0)
        scale = 1e3 if (n, kdim) == (37, 1096) else 1.0
        q = kbit.quantize(random_weight(n, kdim, gen=rng, device=device) * scale, k=k)
        assert (q.absmax_exponent > 0) == (scale > 1), q.absmax_exponent
        t = kbit.repack(q)
        for dtype in (torch.float16, torch.bfloat16):
            want = ref.dequantize(q.packed.cpu(), q.absmax.cpu(), q.codebook.cpu(), (n, kdim), "flat", q.absmax_exponent, dtype)
            got = _dequantize_guarded(t, dtype, device, offset=0)
            assert torch.equal(got.cpu(), want), (n, kdim, dtype)
            # an out at a 2-byte (not 16-byte) offset
            got = _dequantize_guarded(t, dtype, device, offset=1)
            assert torch.equal(got.cpu(), want), (n, kdim, dtype, "unaligned")


@pytest.mark.skipif(not GPU, reason="needs a CUDA device")
@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_tiled_dequantize_large(k, rng):
    """Weights with more units than an H100 has warps, so that warps loop (the persistent
    grid): 2056 x 8192 (< 2^25 values: the blocks kernel's small-weight instantiation) and
    4100 x 8192 (>= 2^25: the large-weight one, and at k = 2 the other kernel); rows not a
    multiple of the 8-row units. tiled64 against the flat layout's dequantize (compared with
    kbit.reference in test_quantize_matches_independent); poisoned output and guard; exact."""
    for n, kdim in [(2056, 8192), (4100, 8192)]:
        q = kbit.quantize(random_weight(n, kdim, gen=rng, device="cuda"), k=k)
        t = kbit.repack(q)
        for dtype in (torch.float16, torch.bfloat16):
            got = _dequantize_guarded(t, dtype, "cuda", offset=0)
            assert torch.equal(got, kbit.dequantize(q, dtype)), (n, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_dequantize_out_and_poison(device, rng):
    q = kbit.repack(kbit.quantize(random_weight(33, 160, gen=rng, device=device), k=5))
    for dtype in DTYPES:
        out = torch.full((33, 160), float("nan"), dtype=dtype, device=device)
        assert kbit.dequantize(q, out=out) is out
        assert torch.isfinite(out).all()
        assert torch.equal(out, kbit.dequantize(q, dtype))
    with pytest.raises(ValueError, match="out has shape"):
        kbit.dequantize(q, out=torch.empty(33, 161, device=device))
    with pytest.raises(TypeError, match="out has dtype"):
        kbit.dequantize(q, out=torch.empty(33, 160, dtype=torch.int32, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    w = torch.randn(8, 64, device=device)
    with pytest.raises(ValueError, match="k must be"):
        kbit.quantize(w, k=6)
    with pytest.raises(TypeError, match="weight has dtype"):
        kbit.quantize(w.to(torch.int32), k=4)
    with pytest.raises(ValueError, match="2-D"):
        kbit.quantize(w[0], k=4)
    with pytest.raises(ValueError, match="absmax_format"):
        kbit.quantize(w, absmax_format="e5m2")
    with pytest.raises(KbitFormatError, match="codebook"):
        kbit.quantize(w, k=4, codebook=torch.linspace(-1, 1, 8))
    q = kbit.quantize(w, k=4)
    n, kdim = q.shape
    with pytest.raises(ValueError, match="packed has shape"):
        ops.dequantize(q.packed[:4], q.absmax, q.codebook, n, kdim, "flat", 0, torch.float16)
    with pytest.raises(ValueError, match="absmax has shape"):
        ops.dequantize(q.packed, q.absmax[:, :1], q.codebook, n, kdim, "flat", 0, torch.float16)
    with pytest.raises(TypeError, match="packed has dtype"):
        ops.dequantize(q.packed.float(), q.absmax, q.codebook, n, kdim, "flat", 0, torch.float16)
    with pytest.raises(ValueError, match="codebook"):
        ops.dequantize(q.packed, q.absmax, q.codebook[:12], n, kdim, "flat", 0, torch.float16)
    with pytest.raises(ValueError, match="layout"):
        ops.dequantize(q.packed, q.absmax, q.codebook, n, kdim, "tiled32", 0, torch.float16)
    with pytest.raises(ValueError, match="absmax_exponent"):
        ops.dequantize(q.packed, q.absmax, q.codebook, n, kdim, "flat", 500, torch.float16)
    with pytest.raises(TypeError, match="dtype"):
        ops.dequantize(q.packed, q.absmax, q.codebook, n, kdim, "flat", 0, torch.int8)
    if device == "cuda":
        with pytest.raises(ValueError, match="absmax is on cpu"):
            ops.dequantize(q.packed, q.absmax.cpu(), q.codebook, n, kdim, "flat", 0, torch.float16)
        with pytest.raises(ValueError, match="codebook is on cpu"):
            ops.dequantize(q.packed, q.absmax, q.codebook.cpu(), n, kdim, "flat", 0, torch.float16)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device, rng):
    w = random_weight(9, 100, torch.float16, rng, device)
    cb = nf_codebook(3).to(device)
    q = kbit.quantize(w, k=3)
    t = kbit.repack(q)
    n, kdim = q.shape
    cases = [
        (ops.quantize, (w, cb, "e4m4", 0)),
        (ops.quantize_out, (w, cb, "fp16", 0, torch.empty(9, 4, 3, dtype=torch.int32, device=device),
                            torch.empty(9, 4, dtype=torch.float16, device=device),
                            torch.zeros(3, dtype=torch.int32, device=device))),
        (ops.dequantize, (q.packed, q.absmax, q.codebook, n, kdim, "flat", 0, torch.bfloat16)),
        (ops.dequantize, (t.packed, t.absmax, t.codebook, n, kdim, "tiled64", 2, torch.float16)),
        (ops.dequantize_out, (t.packed, t.absmax, t.codebook, n, kdim, "tiled64", 0,
                              torch.empty(n, kdim, device=device))),
        (ops.repack, (q.packed, q.absmax, n, kdim, 3, "tiled64")),
        (ops.unrepack, (t.packed, t.absmax, n, kdim, 3, "tiled64")),
        (ops.repack_out, (q.packed, q.absmax, n, kdim, 3, "tiled64", torch.empty_like(t.packed),
                          torch.empty_like(t.absmax))),
        (ops.unrepack_out, (t.packed, t.absmax, n, kdim, 3, "tiled64", torch.empty_like(q.packed),
                            torch.empty_like(q.absmax))),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_decision_boundaries_user_codebook(device, k, rng):
    """Values within a few ulps of every midpoint, for the nf codebook and a random user
    codebook with some entries only 2**-19 apart: the nearest-entry rule must hold exactly."""
    n = 2**k
    user = torch.sort(torch.rand(n, generator=rng, dtype=torch.float64) * 2 - 1).values.float()
    user[0], user[-1] = -1.0, 1.0
    user[n // 2] = user[n // 2 - 1] + 2.0**-19  # a pair at (about) the smallest allowed gap
    user = torch.sort(user).values
    for cb in (nf_codebook(k), user):
        if not ((cb[1:] - cb[:-1]) >= 2.0**-20).all():
            continue
        mids = (cb[1:] + cb[:-1]) / 2
        near = [mids]
        for steps in (1, 2, 3):
            near += [torch.nextafter(near[-1] if steps > 1 else mids, torch.tensor(2.0)),
                     torch.nextafter(near[-2] if steps > 1 else mids, torch.tensor(-2.0))]
        vals = torch.cat(near)
        # rows of 32: first value 1.0 makes absmax = 1 (stored exactly), so x = w exactly
        per_row = 31
        rows = -(-vals.numel() // per_row)
        body = torch.zeros(rows * per_row)
        body[: vals.numel()] = vals
        w = torch.cat([torch.ones(rows, 1), body.view(rows, per_row)], 1)
        w = w.to(device)
        q = kbit.quantize(w, k=k, codebook=cb)
        _check_against_independent(w, q, "e4m4")


@pytest.mark.parametrize("device", DEVICES)
def test_op_reports_bad_codebook_in_status(device):
    w = torch.randn(4, 64, device=device)
    good = nf_codebook(3).to(device)
    for bad in (good.flip(0), good * 1.5, torch.cat([good[:4], good[3:4] + 2.0**-22, good[5:]])):
        status = ops.quantize(w, bad.contiguous(), "e4m4", 0)[2]
        assert status.tolist()[2] == 1
    assert ops.quantize(w, good, "e4m4", 0)[2].tolist() == [0, 0, 0]


def test_matmul_references(rng):
    """The oracles for kbit.linear / expert_linear: float64 products of the float32 weights."""
    w = random_weight(24, 70, gen=rng)
    x = torch.randn(5, 70, generator=rng).to(torch.bfloat16)
    bias = torch.randn(24, generator=rng)
    out = ref.linear(x, w, bias)
    assert out.dtype == torch.bfloat16
    want = (x.double() @ w.double().T + bias.double()).to(torch.bfloat16)
    assert torch.equal(out, want)
    ws = [random_weight(24, 70, gen=rng) for _ in range(3)]
    offsets = torch.tensor([0, 2, 2, 5], dtype=torch.int32)  # expert 1 has no tokens
    got = ref.expert_linear(x, ws, offsets)
    for e, (a, b) in enumerate([(0, 2), (2, 2), (2, 5)]):
        assert torch.equal(got[a:b], (x[a:b].double() @ ws[e].double().T).to(torch.bfloat16))
