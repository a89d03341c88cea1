"""kbit.linear / kbit::gemv against the reference: W dequantized in float32, product in float64.

Tolerance (relative Frobenius error): the result is rounded once to the output dtype
(relative 2^-11 = 4.9e-4 for fp16, 2^-8 = 3.9e-3 for bf16) on top of float32 accumulation in
another order (~1e-6). 2e-3 (fp16) and 1e-2 (bf16) leave ~4x / ~2.5x margin over one rounding
while any wrong index, scale or missing block (errors of order 1e-1 .. 1) fails.
"""

import pytest
import torch

import kbit
from kbit import _lib, ops
from kbit import reference as ref

from conftest import GPU, random_weight

DEVICES = ["cpu"] + (["cuda"] if GPU else [])
TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}
# (64, 16384): several rounds of k-tiles per lane; (2049, 4021): 2 rows per warp at M = 1 with a
# half-empty last warp, 63 k-tiles (a partial second slot), K % 8 != 0 (x's element-wise path).
# Its last block holds 21 values: with 1 (K = 4001) a tiny block absmax can fall outside E4M4's
# range and quantize() rightly refuses the weight (seen on the GPU, session 24)
SHAPES = [(512, 2048), (200, 96), (200, 4128), (64, 40), (2048, 512), (64, 16384), (2049, 4021)]


def _rel_err(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def _reference(x, q, bias=None):
    w = ref.dequantize(q.packed.cpu(), q.absmax.cpu(), q.codebook.cpu(), q.shape, q.layout,
                       q.absmax_exponent, torch.float32)
    return ref.linear(x.cpu(), w, None if bias is None else bias.cpu())


def _within_rounding(out, x, q, dtype):
    """Element-wise check against the kernels' arithmetic, for outputs too small for the
    Frobenius bound to be a statistic (a few outputs, short dot products): every element within
    |out - C| <= 2u (|x| @ |W|^T) + 2u |C|, C the float64 product, u the unit roundoff of dtype
    (2^-11 fp16, 2^-8 bf16). Each weight is rounded twice in the activation dtype (codebook
    value, then its product with the block scale) and the output once; the bf16-rounded
    reference differs from C by up to another u |C|. Seen on the H100 (session 25): (N, K, M) =
    (8, 33, 1), bf16, k = 3 at 1.005e-2 with every output within 3 bf16 ulps of the reference.
    Only for K <= 64: the bound grows like K and C like sqrt(K), so at K = 4128 it would accept
    a whole missing 32-value block (a review's numpy check); at K <= 64 a missing block is an
    error of ~0.4 |C| or more against a bound of ~0.06 |C|."""
    w = ref.dequantize(q.packed.cpu(), q.absmax.cpu(), q.codebook.cpu(), q.shape, q.layout,
                       q.absmax_exponent, torch.float32).double()
    xd = x.cpu().double()
    c, mag = xd @ w.T, xd.abs() @ w.abs().T
    u = 2.0 ** -11 if dtype == torch.float16 else 2.0 ** -8
    return bool(((out.cpu().double() - c).abs() <= 2 * u * (mag + c.abs())).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k", [2, 3, 4, 5])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gemv_small_m(device, k, dtype, rng):
    """The scalar GEMV kernel itself (ops.gemv_out, NaN-poisoned output) and kbit.linear, which
    may dispatch elsewhere."""
    for n, kdim in SHAPES if device == "cuda" else SHAPES[1:2]:
        q = kbit.repack(kbit.quantize(random_weight(n, kdim, gen=rng, device=device, spread=0.5), k=k))
        for m in (1, 2, 3, 4):
            x = torch.randn(m, kdim, generator=rng).to(dtype).to(device)
            want = _reference(x, q)
            out = torch.full((m, n), float("nan"), dtype=dtype, device=device)
            ops.gemv_out(x, q.packed, q.absmax, q.codebook, n, kdim, q.absmax_exponent, None, out)
            assert _rel_err(out.cpu(), want) <= TOL[dtype], ("gemv", n, kdim, m)
            got = kbit.linear(x, q)
            assert got.shape == (m, n) and got.dtype == dtype
            err = _rel_err(got.cpu(), want)
            assert err <= TOL[dtype], (n, kdim, m, err)


@pytest.mark.parametrize("device", ["cuda"] if "cuda" in DEVICES else [])
@pytest.mark.parametrize("rows,warps,groups", [(8, 1, 1), (16, 8, 1), (32, 3, 1), (8, 10, 5), (8, 20, 5)])
def test_gemv_rows_configs(device, rows, warps, groups, rng):
    """The GEMV's coalesced variant (gemv_rows_kernel) forced to several CTA shapes at M = 1..4
    (32 rows and row groups: M = 1 only; M > 1 then takes the lane-per-k-tile kernel): N not a
    multiple of the rows per CTA (5 groups of 8 rows: 2049 rows leave the last CTA one full
    group, one group of one row and three past N), K past the last full tile, K of 71 k-tiles
    (4500: one round of 5 tiles per lane at 16 rows on 8 warps), K near M = 1's 48 KB x limit
    (12000; M = 3, 4 of it pass the 2-CTAs-per-SM limit and fall back), x at an odd element
    offset (no 16-byte loads), x rows with a padded stride, a bias; K = 2048 (32 k-tiles: at
    M = 1, k = 2, 3, (8, 10, 5) runs the tensor-core form of 5 groups x 2 warps with 2 units per
    lane in one round, as gateup does, a case the other K miss)."""
    try:
        ops.force_gemv_rows(rows, warps, groups)
        for n, kdim in ((1040, 96), (2049, 4021), (1040, 4500), (1024, 12000), (1040, 2048)):
            for k in (2, 3, 4, 5):
                q = kbit.repack(kbit.quantize(random_weight(n, kdim, gen=rng, device=device, spread=0.5), k=k))
                w = ref.dequantize(q.packed.cpu(), q.absmax.cpu(), q.codebook.cpu(), q.shape, q.layout,
                                   q.absmax_exponent, torch.float32)  # _reference's, once per weight
                for dtype in (torch.float16, torch.bfloat16):
                    for m in (1, 2, 3, 4):
                        # row strides: odd (no 16-byte loads), and a multiple of 8 past K
                        for width in (kdim + 9, (kdim + 7) // 8 * 8 + 8):
                            buf = torch.randn(m, width, generator=rng).to(dtype).to(device)
                            for x in (buf[:, :kdim], buf[:, 1:kdim + 1]):
                                bias = torch.randn(n, generator=rng).to(dtype).to(device)
                                out = torch.full((m, n), float("nan"), dtype=dtype, device=device)
                                ops.gemv_out(x, q.packed, q.absmax, q.codebook, n, kdim, q.absmax_exponent, bias, out)
                                err = _rel_err(out.cpu(), ref.linear(x.cpu(), w, bias.cpu()))
                                assert err <= TOL[dtype], (n, kdim, k, dtype, m, width, err)
    finally:
        ops.force_gemv_rows(0, 0)


@pytest.mark.parametrize("device", ["cuda"] if "cuda" in DEVICES else [])
@pytest.mark.parametrize("tc", [1, 0, 12])
@pytest.mark.parametrize("k", [2, 3, 4, "4-asym"])
def test_gemv_m1_tc_forms(device, tc, k, rng):
    """M = 1, k = 2..4, forced: the tensor-core GEMV (gemv_tc_kernel: codebook x block scale by
    byte-table permutes, products by MMAs; tc = 1) and the rows kernel (tc = 0); tc = 12 is the
    per-k mask (k = 2, 3 on tensor cores, k = 4 on the rows kernel), on the CTA forms
    of the dense model shapes (5 x 2, 4 x 2, 2 x 4, 2 x 5 warps of 8-row groups) and odd shapes;
    k = 4 with the symmetric nf codebook (the magnitude-and-sign tables) and with an asymmetric
    one ("4-asym": the full 16-entry tables),
    fp16 and bf16, the three absmax formats (the tensor-core form takes E4M4 only; fp16 / fp32
    scales go to the rows kernel), a bias, x at an odd offset (no 16-byte loads), NaN-poisoned
    outputs; and fp32 scales past fp16's range with fp16 x, whose codebook x scale products the
    tensor-core form could not hold. The tensor-core form rounds each codebook value x block
    scale once to the activation dtype before fp32 MMAs (as mma.cu): the bounds of
    test_mma_small_m."""
    shapes = [(5120, 2048), (2048, 5120), (4096, 2048), (2048, 4096), (512, 2048), (200, 4128), (2049, 4021),
              (64, 40)]
    codebook = None
    if k == "4-asym":  # ascending in [-1, 1], entry 15 - i != -entry i
        k, codebook = 4, torch.linspace(-1.0, 1.0, 17)[1:] ** 3
    try:
        ops.force_gemv_tc(tc)
        for n, kdim in shapes:
            w = random_weight(n, kdim, gen=rng, device=device, spread=0.5)
            for fmt in ("e4m4", "fp16", "fp32"):
                q = kbit.repack(kbit.quantize(w, k=k, codebook=codebook, absmax_format=fmt))
                wq = ref.dequantize(q.packed.cpu(), q.absmax.cpu(), q.codebook.cpu(), q.shape, q.layout,
                                    q.absmax_exponent, torch.float32)  # once per weight: the CPU's share
                for dtype in (torch.float16, torch.bfloat16):
                    xs = torch.randn(1, kdim + 1, generator=rng).to(dtype).to(device)
                    for x in (xs[:, :kdim], xs[:, 1:]):
                        # a bias, except on the short dot products (K <= 64: checked element-wise)
                        bias = torch.randn(n, generator=rng).to(dtype).to(device) if kdim > 64 else None
                        out = torch.full((1, n), float("nan"), dtype=dtype, device=device)
                        ops.gemv_out(x, q.packed, q.absmax, q.codebook, n, kdim, q.absmax_exponent, bias, out)
                        err = _rel_err(out.cpu(), ref.linear(x.cpu(), wq, None if bias is None else bias.cpu()))
                        assert err <= TOL[dtype] or (bias is None and _within_rounding(out, x, q, dtype)), (
                            n, kdim, fmt, dtype, x.data_ptr() % 16, err)
        # block scales ~2e4..7e5 (fp32 absmax; fp16's largest is 65504) with small fp16 x
        w = random_weight(512, 2048, gen=rng, device=device, spread=1.0) * 3e5
        q = kbit.repack(kbit.quantize(w, k=k, codebook=codebook, absmax_format="fp32"))
        x = (torch.randn(1, 2048, generator=rng) * 1e-3).to(torch.float16).to(device)
        out = torch.full((1, 512), float("nan"), dtype=torch.float16, device=device)
        ops.gemv_out(x, q.packed, q.absmax, q.codebook, 512, 2048, q.absmax_exponent, None, out)
        assert out.isfinite().all()
        err = _rel_err(out.cpu(), _reference(x, q))
        assert err <= TOL[torch.float16], err
    finally:
        ops.force_gemv_tc(-1)


@pytest.mark.parametrize("device", ["cuda"] if "cuda" in DEVICES else [])
@pytest.mark.parametrize("name", ["gemv", "mma"])
def test_small_m_misaligned_weights(device, name, rng):
    """Weights viewed 4 bytes off a 16-byte boundary (kbit never makes such views) give the
    aligned result: the op copies them instead of letting vector loads fault the device."""
    n, kdim = 200, 4128
    for k in (2, 4):
        q = kbit.repack(kbit.quantize(random_weight(n, kdim, gen=rng, device=device), k=k))
        buf = torch.empty(q.packed.numel() + 4, dtype=torch.int32, device=device)
        packed = buf[1:1 + q.packed.numel()].view(q.packed.shape)
        packed.copy_(q.packed)
        assert packed.data_ptr() % 16 != 0
        x = torch.randn(3, kdim, generator=rng).to(torch.float16).to(device)
        args = (q.absmax, q.codebook, n, kdim, q.absmax_exponent)
        # gemv: bit-identical. mma: its warps add partial sums into shared memory with atomics
        # in whatever order they finish, so two calls may differ in the last fp16 bit (seen
        # once on the H100, session 25: 1 of 600 outputs, 0.00049 at 0.74)
        tol = dict(rtol=0, atol=0) if name == "gemv" else dict(rtol=2.0 ** -9, atol=1e-5)
        torch.testing.assert_close(getattr(ops, name)(x, packed, *args), getattr(ops, name)(x, q.packed, *args),
                                   **tol)


MMA_SHAPES = [(512, 2048), (200, 96), (200, 4128), (64, 40), (8, 33), (2048, 512), (136, 5120),
              (64, 4096)]  # last: at M >= 8 the staged x rows sit on both sides of the table
MMA_MS = (1, 2, 3, 4, 5, 8, 9, 15, 16, 17, 31, 32, 33, 64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k", [2, 3, 4, 5])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_mma_small_m(device, k, dtype, rng):
    """Tensor-core kernel, M = 1..64 (split over K where x does not fit whole), into
    NaN-poisoned outputs.

    The kernel multiplies codebook value x block scale in the activation dtype (one extra
    rounding of each weight before the fp32-accumulated MMA: relative 2^-11 fp16 / 2^-8 bf16,
    random in sign, so it adds ~1/sqrt(3) of that to the Frobenius error): still inside the
    bounds above.
    """
    for n, kdim in MMA_SHAPES if device == "cuda" else MMA_SHAPES[1:2]:
        q = kbit.repack(kbit.quantize(random_weight(n, kdim, gen=rng, device=device, spread=0.5), k=k))
        for m in MMA_MS if device == "cuda" else (1, 9):
            if not ops.mma_supports(m, kdim, n, k, device):
                continue
            x = torch.randn(m, kdim, generator=rng).to(dtype).to(device)
            out = torch.full((m, n), float("nan"), dtype=dtype, device=device)
            ops.mma_out(x, q.packed, q.absmax, q.codebook, n, kdim, 0, None, out)
            err = _rel_err(out.cpu(), _reference(x, q))
            assert err <= TOL[dtype] or (n * m < 256 and kdim <= 64 and _within_rounding(out, x, q, dtype)), (n, kdim, m, err)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("absmax_format", ["e4m4", "fp16", "fp32"])
@pytest.mark.parametrize("name", ["gemv", "mma", "wgmma"])
def test_mma_absmax_formats_exponent_bias(device, absmax_format, name, rng):
    """The scalar GEMV (M <= 4) and both tensor-core kernels (wgmma: compute capability 9.0
    only, M past 64 too)."""
    if name == "wgmma" and device == "cuda" and not ops.wgmma_supports(1, 320, 72, 4, device):
        pytest.skip("wgmma needs a compute capability 9.0 GPU (sm_90a build)")
    # weights ~1e-7 and ~1e3: per-tensor exponents far from 0 for E4M4
    for scale in (1e-7, 1e3):
        w = random_weight(72, 320, gen=rng, device=device, spread=1.0) * scale
        q = kbit.repack(kbit.quantize(w, k=4, absmax_format=absmax_format))
        bias = torch.randn(72, generator=rng).to(torch.bfloat16).to(device) * scale
        for m in (1, 3) if name == "gemv" else (1, 6, 13) + ((80,) if name == "wgmma" else ()):
            x = torch.randn(m, 320, generator=rng).to(torch.bfloat16).to(device)
            got = getattr(ops, name)(x, q.packed, q.absmax, q.codebook, 72, 320, q.absmax_exponent, bias)
            err = _rel_err(got.cpu(), _reference(x, q, bias))
            assert err <= TOL[torch.bfloat16], (name, absmax_format, scale, m, err)


@pytest.mark.parametrize("device", ["cuda"] if "cuda" in DEVICES else [])
@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_mma_bulk_copy_variant(device, k, rng):
    """csrc/mma.cu streams the weights with bulk copies when a CTA owns >= 6 row groups
    (N = 12288: 768 groups, 6 per CTA on 128..153 SMs), N % 16 == 0 and aligned tensors:
    every k, absmax format, M in both token-tile variants, K = 320 (5 k-tiles: the last step
    has one), a bias, NaN-poisoned outputs. Same bounds as test_mma_small_m."""
    n, kdim = 12288, 320
    w = random_weight(n, kdim, gen=rng, device=device, spread=0.5)
    for fmt in ("e4m4", "fp16", "fp32"):
        q = kbit.repack(kbit.quantize(w, k=k, absmax_format=fmt))
        for dtype in (torch.float16, torch.bfloat16):
            bias = torch.randn(n, generator=rng).to(dtype).to(device)
            for m in (1, 7, 12):
                x = torch.randn(m, kdim, generator=rng).to(dtype).to(device)
                out = torch.full((m, n), float("nan"), dtype=dtype, device=device)
                ops.mma_out(x, q.packed, q.absmax, q.codebook, n, kdim, q.absmax_exponent, bias, out)
                err = _rel_err(out.cpu(), _reference(x, q, bias))
                assert err <= TOL[dtype], (fmt, dtype, m, err)


@pytest.mark.parametrize("device", ["cuda"] if "cuda" in DEVICES else [])
@pytest.mark.parametrize("k", [2, 4])
def test_mma_bulk_copy_ring_wraps(device, k, rng):
    """The bulk variant with more steps than stages (K = 4160: 33 steps, the last with one
    k-tile) and 2 consumer warps per row group (6 row groups per CTA on 128..153 SMs): the
    stage ring wraps, which needs the stage count to be a multiple of 2 (csrc/mma.cu)."""
    n, kdim = 12288, 4160
    q = kbit.repack(kbit.quantize(random_weight(n, kdim, gen=rng, device=device, spread=0.5), k=k))
    w = ref.dequantize(q.packed.cpu(), q.absmax.cpu(), q.codebook.cpu(), q.shape, q.layout,
                       q.absmax_exponent, torch.float32)
    for m in (1, 12):
        x = torch.randn(m, kdim, generator=rng).to(torch.float16).to(device)
        out = torch.full((m, n), float("nan"), dtype=torch.float16, device=device)
        ops.mma_out(x, q.packed, q.absmax, q.codebook, n, kdim, q.absmax_exponent, None, out)
        err = _rel_err(out.cpu(), ref.linear(x.cpu(), w, None))
        assert err <= TOL[torch.float16], (m, err)


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_mma_split_k(k, rng):
    """Split-K (2, 4, 8 CTAs per row-group set adding their partial sums through the workspace):
    every forced slice count on shapes with slices of unequal length (K = 4128: 33 steps), a
    bias, the bulk-copy variant (N = 12288), M in every token-tile width, both dtypes,
    NaN-poisoned outputs, each call twice (the workspace must be left all zero for the next
    one, which would otherwise add stale partial sums or wait on them). Same bounds as
    test_mma_small_m. Then the workspace is all zero, and a call forced to split without a
    workspace is refused."""
    device = "cuda"
    cases = [(200, 4128, (1, 17, 40)), (512, 2048, (5, 16, 64)), (12288, 320, (9, 33))]
    seen = set()
    try:
        for n, kdim, ms in cases:
            q = kbit.repack(kbit.quantize(random_weight(n, kdim, gen=rng, device=device, spread=0.5), k=k))
            w = ref.dequantize(q.packed.cpu(), q.absmax.cpu(), q.codebook.cpu(), q.shape, q.layout,
                               q.absmax_exponent, torch.float32)
            for S in (1, 2, 4, 8):
                ops.force_mma_ksplit(S)
                for i, m in enumerate(ms):
                    if ops.mma_ksplit(m, kdim, n, k, device) != S:
                        continue
                    seen.add(S)
                    dtype = (torch.float16, torch.bfloat16)[i % 2]
                    bias = torch.randn(n, generator=rng).to(dtype).to(device)
                    for _ in range(2):
                        x = torch.randn(m, kdim, generator=rng).to(dtype).to(device)
                        out = torch.full((m, n), float("nan"), dtype=dtype, device=device)
                        ops.mma_out(x, q.packed, q.absmax, q.codebook, n, kdim, q.absmax_exponent, bias, out)
                        err = _rel_err(out.cpu(), ref.linear(x.cpu(), w, bias.cpu()))
                        assert err <= TOL[dtype], (n, kdim, m, S, err)
        assert seen == {1, 2, 4, 8}, seen
        torch.cuda.synchronize()
        held = [ws for key, ws in ops._workspaces.items() if key[0] == "mma"]
        assert held and all(not ws.any() for ws in held)
        ops.force_mma_ksplit(2)
        assert ops.mma_ksplit(1, 2048, 64, k, device) == 2
        x = torch.randn(1, 2048, dtype=torch.float16, device=device)
        q = kbit.repack(kbit.quantize(random_weight(64, 2048, gen=rng, device=device), k=k))
        out = torch.empty(1, 64, dtype=torch.float16, device=device)
        dev, stream = _lib.stream_of(x)
        rc = _lib._lib.kbit_mma(
            dev, stream, x.data_ptr(), _lib.DTYPE_CODES[x.dtype], 1, 2048, q.packed.data_ptr(),
            q.absmax.data_ptr(), _lib.ABSMAX_CODES[q.absmax_format], q.codebook.data_ptr(), k, 64,
            2048, 0, None, out.data_ptr(), 64, None, 0, 0)
        assert rc != 0  # forced to split, no workspace: refused without launching
    finally:
        ops.force_mma_ksplit(0)


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("k", [2, 4])
def test_mma_multi_wave_plan(k, rng):
    """A plan that needs two waves of CTAs: 28672 x 8192 at M = 16 (K split over 2 or 4 CTAs,
    x 64-128 KB per CTA, so the accumulators of one wave's row groups do not fit; csrc/mma.cu's
    plan_of then spreads the row groups evenly over both waves), through the automatic plan,
    fp16, NaN-poisoned output, twice (the workspace must be left zero). The reference is
    computed on the GPU (235 M weights). Same bound as test_mma_small_m."""
    n, kdim, m = 28672, 8192, 16
    gen = torch.Generator(device="cuda").manual_seed(int(torch.randint(0, 2**31, (1,), generator=rng)))
    w = torch.randn(n, kdim, generator=gen, device="cuda") * 0.02
    q = kbit.repack(kbit.quantize(w, k=k))
    del w
    wd = ref.dequantize(q.packed, q.absmax, q.codebook, q.shape, q.layout, q.absmax_exponent, torch.float32)
    assert ops.mma_ksplit(m, kdim, n, k, "cuda") > 1
    for _ in range(2):
        x = torch.randn(m, kdim, generator=gen, device="cuda").to(torch.float16)
        out = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
        ops.mma_out(x, q.packed, q.absmax, q.codebook, n, kdim, q.absmax_exponent, None, out)
        err = _rel_err(out, ref.linear(x, wd, None))
        assert err <= TOL[torch.float16], (k, err)


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_mma_model_shapes_large_m(rng):
    """The model shapes at M = 16 (down: only with split-K), 28 (the slot flush's tiles behind
    the table, x rows in front of it) and 48, 64 through the automatic plan, where the library
    says mma takes them (k = 4, fp16)."""
    for kdim, n in [(2048, 5120), (5120, 2048), (2048, 512)]:
        q = kbit.repack(kbit.quantize(random_weight(n, kdim, gen=rng, device="cuda", spread=0.5), k=4))
        w = ref.dequantize(q.packed.cpu(), q.absmax.cpu(), q.codebook.cpu(), q.shape, q.layout,
                           q.absmax_exponent, torch.float32)
        for m in (16, 28, 48, 64):
            assert ops.mma_supports(m, kdim, n, 4, "cuda"), (kdim, n, m)
            x = torch.randn(m, kdim, generator=rng).to(torch.float16).cuda()
            out = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
            ops.mma_out(x, q.packed, q.absmax, q.codebook, n, kdim, 0, None, out)
            err = _rel_err(out.cpu(), ref.linear(x.cpu(), w, None))
            assert err <= TOL[torch.float16], (kdim, n, m, err)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name, m, k", [("mma", 11, 3), ("gemv", 3, 5)])
def test_small_m_opcheck(device, name, m, k, rng):
    op, op_out = getattr(ops, name), getattr(ops, f"{name}_out")
    q = kbit.repack(kbit.quantize(random_weight(24, 100, gen=rng, device=device), k=k))
    x = torch.randn(m, 100, generator=rng).to(torch.float16).to(device)
    bias = torch.randn(24, generator=rng).to(torch.float16).to(device)
    for b in (None, bias):
        torch.library.opcheck(op, (x, q.packed, q.absmax, q.codebook, 24, 100, 0, b))
    out = torch.empty(m, 24, dtype=torch.float16, device=device)
    torch.library.opcheck(op_out, (x, q.packed, q.absmax, q.codebook, 24, 100, 0, bias, out))


@pytest.mark.parametrize("device", DEVICES)
def test_mma_limits(device, rng):
    q = kbit.repack(kbit.quantize(random_weight(24, 100, gen=rng, device=device), k=3))
    with pytest.raises(ValueError, match="M <= 64"):
        ops.mma(torch.zeros(65, 100, dtype=torch.float16, device=device), q.packed, q.absmax,
                q.codebook, 24, 100, 0)
    # without a device: a K-slice of x (at most 8 per cluster) within MMA_MAX_X_BYTES
    assert not ops.mma_supports(64, 1 << 15) and ops.mma_supports(16, 1 << 15)
    assert ops.mma_supports(64, 8192) and not ops.mma_supports(64, 8193)
    assert not ops.mma_supports(65, 128) and not ops.mma_supports(0, 128)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_linear_bias_leading_dims_noncontiguous(device, dtype, rng):
    q = kbit.repack(kbit.quantize(random_weight(96, 160, gen=rng, device=device), k=4))
    bias = torch.randn(96, generator=rng).to(dtype).to(device)
    for m in (1, 3, 5, 17):
        x = torch.randn(m, 2 * 160, generator=rng).to(dtype).to(device)[:, ::2]  # non-contiguous
        got = kbit.linear(x, q, bias)
        assert _rel_err(got.cpu(), _reference(x, q, bias)) <= TOL[dtype]
    x3 = torch.randn(2, 3, 160, generator=rng).to(dtype).to(device)
    got = kbit.linear(x3, q)
    assert got.shape == (2, 3, 96)
    assert _rel_err(got.cpu().reshape(6, 96), _reference(x3.reshape(6, 160), q)) <= TOL[dtype]


@pytest.mark.parametrize("device", DEVICES)
def test_linear_m_zero_and_bad_input(device, rng):
    q = kbit.repack(kbit.quantize(random_weight(32, 64, gen=rng, device=device), k=3))
    assert kbit.linear(torch.empty(0, 64, dtype=torch.float16, device=device), q).shape == (0, 32)
    with pytest.raises(ValueError, match="last dim"):
        kbit.linear(torch.randn(2, 63, dtype=torch.float16, device=device), q)
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        kbit.linear(torch.randn(2, 64, device=device), q)
    with pytest.raises(TypeError, match="QuantizedWeight"):
        kbit.linear(torch.randn(2, 64, dtype=torch.float16, device=device), torch.zeros(32, 64))
    with pytest.raises(TypeError, match="bias"):
        kbit.linear(torch.randn(2, 64, dtype=torch.float16, device=device), q, torch.zeros(32))


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_gemv_graph_replay_new_inputs(rng):
    q = kbit.repack(kbit.quantize(random_weight(256, 512, gen=rng, device="cuda"), k=4))
    x = torch.randn(1, 512, dtype=torch.float16, device="cuda")
    kbit.linear(x, q)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = kbit.linear(x, q)
    x.copy_(torch.randn(1, 512, generator=rng).to(torch.float16))
    g.replay()
    torch.cuda.synchronize()
    assert _rel_err(y.cpu(), _reference(x, q)) <= TOL[torch.float16]


@pytest.mark.parametrize("device", DEVICES)
def test_linear_torch_compile_fullgraph(device, rng):
    q = kbit.repack(kbit.quantize(random_weight(64, 256, gen=rng, device=device), k=4))
    compiled = torch.compile(lambda x: kbit.linear(x, q), fullgraph=True)
    for m in (1, 8):  # the GEMV path and the dequantize + matmul path
        x = torch.randn(m, 256, generator=rng).to(torch.bfloat16).to(device)
        # same ops; inductor may order the bf16 GEMM differently, so compare to bf16 rounding
        torch.testing.assert_close(compiled(x), kbit.linear(x, q))


def test_dispatch_table_well_formed():
    from kbit import dispatch_table

    assert dispatch_table.DEFAULT_FAMILY in dispatch_table.TABLES
    cells = [item for table in dispatch_table.TABLES.values() for item in table.items()]
    for key, entries in [*cells, (None, dispatch_table.DEFAULT)]:
        tops = [top for top, _ in entries]
        assert tops == sorted(tops) and len(set(tops)) == len(tops), key
        for top, name in entries:
            assert name in ("gemv", "mma", "wgmma", "dq"), key
            assert top <= {"gemv": ops.GEMV_MAX_M, "mma": ops.MMA_MAX_M, "wgmma": 1 << 62, "dq": 1 << 62}[name], key


def test_kernel_for_ranges(monkeypatch):
    from kbit import dispatch_table
    from kbit.linear import kernel_for

    monkeypatch.setattr(dispatch_table, "TABLES", {dispatch_table.DEFAULT_FAMILY: {(512, 2048, 2): ((1, "gemv"), (8, "mma"))}})
    monkeypatch.setattr(dispatch_table, "DEFAULT", ((16, "mma"),))
    got = [kernel_for(m, 512, 2048, 2) for m in (1, 2, 8, 9)]
    assert got == ["gemv", "mma", "mma", "dq"]
    assert [kernel_for(m, 512, 2048, 3) for m in (1, 16, 17)] == ["mma", "mma", "dq"]
    # a family's own table; other families and None take DEFAULT_FAMILY's
    tables = {dispatch_table.DEFAULT_FAMILY: {(512, 2048, 2): ((1, "gemv"),)}, "X9": {(512, 2048, 2): ((4, "mma"),)}}
    monkeypatch.setattr(dispatch_table, "TABLES", tables)
    assert [kernel_for(1, 512, 2048, 2, fam) for fam in ("X9", "Y1", None)] == ["mma", "gemv", "gemv"]
    assert kernel_for(2, 512, 2048, 2, "X9") == "mma" and kernel_for(2, 512, 2048, 2) == "dq"


def test_device_family_names():
    assert ops.family_of("NVIDIA H100 80GB HBM3") == "H100"
    assert ops.family_of("NVIDIA H200") == "H200" and ops.family_of("NVIDIA H200 NVL") == "H200"
    assert ops.family_of("") == ""
    if GPU:
        assert ops.device_family(0) == ops.family_of(torch.cuda.get_device_name(0))


def test_make_dispatch_ranges():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "make_dispatch.py"
    spec = importlib.util.spec_from_file_location("make_dispatch", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    best = {1: "gemv", 2: "mma", 4: "mma", 8: "mma", 16: "dq", 32: "dq"}
    assert mod.ranges(best) == ((1, "gemv"), (8, "mma"))
    assert mod.ranges({1: "mma", 2: "dq", 4: "mma"}) == ((1, "mma"), (2, "dq"), (4, "mma"))
    # a `kbit bench --kernels` result cannot make a table; older results (no "kernels") can
    assert mod.unmeasured({"kernels": ["MMA"]}) == ["Scalar", "WGMMA", "dq+cuBLAS"]
    assert mod.unmeasured({"kernels": ["Scalar", "MMA", "WGMMA", "dq+cuBLAS"]}) == []
    assert mod.unmeasured({}) == []
    # several runs: per cell the highest median speedup, each run relative to its own fp16
    shapes = {"A": (256, 64)}

    def run(fp16, mma, dq):
        return {"fp16_us": {"1,A": fp16}, "kbit_us": {"1,A,4": {"MMA": mma, "dq+cuBLAS": dq}}}

    assert mod.pick([run(10, 5, 4)], shapes) == {(64, 256, 4): {1: "dq"}}
    # dq is faster in one run only; a slow-clock run (fp16 20) counts by its ratios, not its times
    runs = [run(10, 5, 4), run(10, 4, 5), run(20, 8, 9)]
    assert mod.pick(runs, shapes) == {(64, 256, 4): {1: "mma"}}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", ["gemv", "mma", "wgmma", "dq"])
def test_linear_each_dispatched_kernel(device, kernel, monkeypatch, rng):
    """Each kernel name the table can hold, at M = 1, 3 (and past mma's range for "wgmma",
    which on a GPU without it must fall back, not fail)."""
    from kbit import dispatch_table

    n, kdim, k = 200, 4128, 3
    monkeypatch.setattr(dispatch_table, "TABLES", {dispatch_table.DEFAULT_FAMILY: {(n, kdim, k): ((4 if kernel == "gemv" else 100, kernel),)}})
    q = kbit.repack(kbit.quantize(random_weight(n, kdim, gen=rng, device=device), k=k))
    for m in (1, 3) + ((70,) if kernel == "wgmma" else ()):
        x = torch.randn(m, kdim, generator=rng).to(torch.float16).to(device)
        out = torch.full((m, n), float("nan"), dtype=torch.float16, device=device)
        got = kbit.linear(x, q, out=out)
        assert got is out
        assert _rel_err(got.cpu(), _reference(x, q)) <= TOL[torch.float16]


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_linear_wgmma_fast_path(dtype, monkeypatch, rng):
    """Where the table says wgmma, eager kbit.linear launches it directly (no torch.library op:
    no call reaches ops._small_m_cuda_into) when x's rows are 16-byte aligned, with bias, with
    and without out=, at M = 17 .. 256 (M = 256 on the 5120-row weight may run stream-K, with
    its workspace); a misaligned x takes the op path, which copies it. A device without wgmma
    runs mma (M <= its limit) or the op path. All against the reference."""
    from kbit import dispatch_table

    calls = []
    real = ops._small_m_cuda_into
    monkeypatch.setattr(ops, "_small_m_cuda_into", lambda cfn, *a: (calls.append(cfn), real(cfn, *a))[1])
    for (n, kdim, k), ms in (((512, 2048, 4), (17, 64)), ((5120, 2048, 2), (256,))):
        monkeypatch.setattr(dispatch_table, "TABLES", {dispatch_table.DEFAULT_FAMILY: {(n, kdim, k): ((1 << 20, "wgmma"),)}})
        q = kbit.repack(kbit.quantize(random_weight(n, kdim, gen=rng, device="cuda"), k=k))
        bias = torch.randn(n, generator=rng).to(dtype).cuda()
        for m in ms:
            direct = ops.wgmma_supports(m, kdim, n, k, "cuda") or ops.mma_supports(m, kdim, n, k, "cuda")
            x = torch.randn(m, kdim, generator=rng).to(dtype).cuda()
            want = _reference(x, q, bias)
            calls.clear()
            got = kbit.linear(x, q, bias)
            assert got.shape == (m, n) and _rel_err(got.cpu(), want) <= TOL[dtype]
            assert calls == [] or not direct
            out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
            calls.clear()
            assert kbit.linear(x, q, bias, out=out) is out
            assert _rel_err(out.cpu(), want) <= TOL[dtype]
            assert calls == [] or not direct
            buf = torch.empty(m, kdim + 8, dtype=dtype, device="cuda")
            xm = buf[:, 1:kdim + 1]  # rows 2 bytes past a 16-byte boundary, stride K + 8
            xm.copy_(x)
            calls.clear()
            got = kbit.linear(xm, q, bias)
            assert _rel_err(got.cpu(), want) <= TOL[dtype]
            if ops.wgmma_supports(m, kdim, n, k, "cuda"):
                assert calls == ["kbit_wgmma"]


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_linear_wgmma_graph_replay_new_inputs(monkeypatch, rng):
    """A CUDA graph of kbit.linear calls on the wgmma path (stream-K workspace from the graph's
    pool at M = 256) replays with new inputs."""
    from kbit import dispatch_table

    n, kdim, k = 5120, 2048, 4
    monkeypatch.setattr(dispatch_table, "TABLES", {dispatch_table.DEFAULT_FAMILY: {(n, kdim, k): ((1 << 20, "wgmma"),)}})
    q = kbit.repack(kbit.quantize(random_weight(n, kdim, gen=rng, device="cuda"), k=k))
    xs = [torch.randn(m, kdim, dtype=torch.float16, device="cuda") for m in (64, 256)]
    for x in xs:
        kbit.linear(x, q)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ys = [kbit.linear(x, q) for x in xs]
    for _ in range(2):
        for x in xs:
            x.copy_(torch.randn(x.shape, generator=rng).to(torch.float16))
        g.replay()
        torch.cuda.synchronize()
        for x, y in zip(xs, ys):
            assert _rel_err(y.cpu(), _reference(x, q)) <= TOL[torch.float16]


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_linear_dq_fast_path(dtype, monkeypatch, rng):
    """Eager kbit.linear's dequantize + cuBLAS path calls the dequantize kernel directly (no
    call reaches ops._dequantize_cuda_into) for tiled64 and flat weights, with bias and out=,
    and the buffer it reuses holds the next weight's values, not the last one's; a CUDA graph of
    the path replays with new inputs."""
    from kbit import dispatch_table

    calls = []
    real = ops._dequantize_cuda_into
    monkeypatch.setattr(ops, "_dequantize_cuda_into", lambda *a: (calls.append(1), real(*a))[1])
    n, kdim = 200, 4128
    for k in (2, 5):
        monkeypatch.setattr(dispatch_table, "TABLES", {dispatch_table.DEFAULT_FAMILY: {(n, kdim, k): ((1, "dq"),)}})
        flat = kbit.quantize(random_weight(n, kdim, gen=rng, device="cuda"), k=k)
        bias = torch.randn(n, generator=rng).to(dtype).cuda()
        for q in (kbit.repack(flat), flat):
            for m in (1, 37):
                x = torch.randn(m, kdim, generator=rng).to(dtype).cuda()
                out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
                calls.clear()
                assert kbit.linear(x, q, bias, out=out) is out
                assert calls == []
                assert _rel_err(out.cpu(), _reference(x, q, bias)) <= TOL[dtype]
    x = torch.randn(37, kdim, dtype=dtype, device="cuda")
    kbit.linear(x, q)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = kbit.linear(x, q)
    x.copy_(torch.randn(x.shape, generator=rng).to(dtype))
    g.replay()
    torch.cuda.synchronize()
    assert _rel_err(y.cpu(), _reference(x, q)) <= TOL[dtype]


def test_small_m_call_unknown_kernel():
    """kbit_small_m_call refuses a kernel code it does not know without touching the device."""
    if not _lib.available():
        pytest.skip("native library not built")
    blk = _lib.CallBlock()
    assert _lib._lib.kbit_small_m_call(len(_lib.CALL_CODES), blk) != 0


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("kernel, ms", [("gemv", (1, 3)), ("mma", (1, 8)), ("wgmma", (64, 96))])
def test_linear_fast_path_threads(kernel, ms, monkeypatch, rng):
    """Eager calls from several threads at once on one weight: each thread's x, out and M reach
    its own launches (the fast path's argument blocks are per thread; ctypes releases the GIL
    during each call). Outputs poisoned before every call; every call checked against the
    single-threaded result of the same kernel."""
    import threading

    from kbit import dispatch_table

    n, kdim, k = 512, 2048, 4
    monkeypatch.setattr(dispatch_table, "TABLES", {dispatch_table.DEFAULT_FAMILY: {(n, kdim, k): ((1 << 20, kernel),)}})
    q = kbit.repack(kbit.quantize(random_weight(n, kdim, gen=rng, device="cuda"), k=k))
    jobs = []
    for t in range(4):
        x = torch.randn(ms[t % 2], kdim, generator=rng).to(torch.float16).cuda()
        want = kbit.linear(x, q).float()
        assert _rel_err(want.cpu(), _reference(x, q)) <= TOL[torch.float16]
        jobs.append((x, torch.empty(x.shape[0], n, dtype=torch.float16, device="cuda"), want, []))
    torch.cuda.synchronize()
    start = threading.Barrier(len(jobs))

    def work(x, out, want, errs):
        start.wait()
        for _ in range(200):
            out.fill_(float("nan"))
            kbit.linear(x, q, out=out)
            errs.append(((out.float() - want).norm() / want.norm()).nan_to_num(float("inf")))
        torch.cuda.synchronize()

    threads = [threading.Thread(target=work, args=job) for job in jobs]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for _, _, _, errs in jobs:
        assert len(errs) == 200
        # the same kernel on the same inputs: equal up to the split-K sums' order (mma, wgmma)
        assert torch.stack(errs).max().item() <= 1e-3
