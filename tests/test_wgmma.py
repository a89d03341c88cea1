"""kbit::wgmma (csrc/wgmma.cu, Hopper's warpgroup MMA) against the reference: W dequantized in
float32, product in float64. Same bounds as tests/test_linear.py (why: see there): the kernel
rounds each decoded weight once to the activation dtype, as kbit.dequantize does, and
accumulates in float32. Outputs are NaN-poisoned before every call. The absmax formats and
per-tensor exponents: tests/test_linear.py, test_mma_absmax_formats_exponent_bias."""

import pytest
import torch

import kbit
from kbit import ops
from kbit import reference as ref

from conftest import GPU, random_weight

TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}
WGMMA = GPU and ops.wgmma_supports(1, 64, 64, 4, "cuda")
needs_wgmma = pytest.mark.skipif(not WGMMA, reason="needs a compute capability 9.0 GPU (sm_90a build)")
# (N, K): model-like, K with a half k-tile at the end (odd block count), tiny K, N not a
# multiple of the CTA's 64 / 128 rows
SHAPES = [(512, 2048), (200, 4128), (64, 40), (136, 5120), (8, 96)]
MS = (1, 2, 15, 16, 17, 33, 64, 65, 100, 128, 129, 256, 300)
# (tokens per CTA, warpgroups, K splits over a cluster): every tile width and warpgroup count
# the launcher has, with and without split-K (3 and 8 leave a split with fewer steps or none);
# (256, 2) is the variant with a producer warpgroup and setmaxnreg
CONFIGS = [(32, 1, 1), (64, 1, 4), (128, 1, 1), (256, 1, 3), (32, 2, 8), (64, 2, 1), (128, 2, 2),
           (256, 2, 1), (256, 2, 4)]


def _rel_err(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def _weight(q):
    return ref.dequantize(q.packed.cpu(), q.absmax.cpu(), q.codebook.cpu(), q.shape, q.layout,
                          q.absmax_exponent, torch.float32)


def _run(q, x, bias=None):
    n, kdim = q.shape
    out = torch.full((x.shape[0], n), float("nan"), dtype=x.dtype, device=x.device)
    ops.wgmma_out(x, q.packed, q.absmax, q.codebook, n, kdim, q.absmax_exponent, bias, out)
    return out


def _check_forced(q, configs, k5_table, rng):
    """q through each forced (tokens, warpgroups, K splits) at M = 1, 70, 257, dtypes
    alternating, with a bias; splits -1 (stream-K) must have run as stream-K at M = 257."""
    n, kdim = q.shape
    w = _weight(q)
    try:
        for i, (tn, wg, splits) in enumerate(configs):
            ops.force_wgmma_config(tn, wg, splits, k5_table)
            dtype = (torch.float16, torch.bfloat16)[i % 2]
            bias = torch.randn(n, generator=rng).to(dtype).cuda()
            for m in (1, 70, 257):
                x = torch.randn(m, kdim, generator=rng).to(dtype).cuda()
                err = _rel_err(_run(q, x, bias).cpu(), ref.linear(x.cpu(), w, bias.cpu()))
                assert err <= TOL[dtype], (tn, wg, splits, m, err)
                if splits == -1 and m == 257:
                    assert ops.wgmma_last_streamk(), (tn, wg)
    finally:
        ops.force_wgmma_config()


@needs_wgmma
@pytest.mark.parametrize("k", [2, 3, 4, 5])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_wgmma_shapes_and_m(k, dtype, rng):
    for n, kdim in SHAPES:
        q = kbit.repack(kbit.quantize(random_weight(n, kdim, gen=rng, device="cuda", spread=0.5), k=k))
        w = _weight(q)
        for m in MS:
            x = torch.randn(m, kdim, generator=rng).to(dtype).cuda()
            err = _rel_err(_run(q, x).cpu(), ref.linear(x.cpu(), w, None))
            assert err <= TOL[dtype], (n, kdim, m, err)


@needs_wgmma
@pytest.mark.parametrize("k,k5_table", [(2, "auto"), (3, "auto"), (4, "auto"), (5, "narrow"), (5, "wide")])
def test_wgmma_every_cta_shape(k, k5_table, rng):
    """Every (tokens, warpgroups, K splits) per CTA the launcher can pick, forced, with a bias;
    k = 5 with each of its two codebook tables."""
    q = kbit.repack(kbit.quantize(random_weight(200, 4128, gen=rng, device="cuda", spread=0.5), k=k))
    _check_forced(q, CONFIGS, k5_table, rng)


@needs_wgmma
@pytest.mark.parametrize("k,k5_table", [(2, "auto"), (3, "auto"), (4, "auto"), (5, "narrow"), (5, "wide")])
@pytest.mark.parametrize("absmax_format", ["fp16", "fp32"])
def test_wgmma_runtime_absmax_formats(k, k5_table, absmax_format, rng):
    """E4M4 weights run kernels compiled for that format; the other formats run the kernels
    that read it at run time: every k (k = 5 with both tables), both dtypes, tile widths
    with and without a split, stream-K (forced: 8 tiles of 65 k-steps at M = 257), a bias."""
    q = kbit.repack(kbit.quantize(random_weight(256, 4128, gen=rng, device="cuda", spread=0.5), k=k,
                                  absmax_format=absmax_format))
    _check_forced(q, [(32, 1, 1), (128, 2, 2), (256, 1, 3), (256, 2, 1), (256, 1, -1)], k5_table, rng)


@needs_wgmma
@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e5, 1e34])
def test_wgmma_split_partials_any_magnitude(scale, rng):
    """The K split (a cluster's: 2, 8; stream-K's through global memory: -1) hands its partial
    tiles over as fp16 scaled by a power of two (per CTA; per thread for stream-K): outputs
    around 1e-6 (fp16 subnormals unscaled), 1e5 (past fp16's range unscaled) and 1e35 (near
    fp32's top) stay within bf16's bound; fp16 outputs at an ordinary magnitude within fp16's."""
    n, kdim = 512, 4096
    q = kbit.repack(kbit.quantize(random_weight(n, kdim, gen=rng, device="cuda", spread=0.5), k=4))
    w = _weight(q)
    dtypes = (torch.bfloat16, torch.float16) if scale == 1.0 else (torch.bfloat16,)
    try:
        for splits in (2, 8, -1):
            ops.force_wgmma_config(64, 1, splits)
            for dtype in dtypes:
                x = (torch.randn(40, kdim, generator=rng) * scale).to(dtype).cuda()
                err = _rel_err(_run(q, x).cpu(), ref.linear(x.cpu(), w, None))
                assert ops.wgmma_last_streamk() == (splits == -1)
                assert err <= TOL[dtype], (splits, dtype, scale, err)
    finally:
        ops.force_wgmma_config()


@needs_wgmma
@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_wgmma_streamk(k, rng):
    """Stream-K (forced): one CTA per SM deals the (tile, k-step) units, partial tiles go
    through the per-stream workspace to each tile's owner. Every tile width and warpgroup
    count, a half last k-tile (K = 8224), a bias, and calls back to back with new x each time
    (an owner that did not wait for its contributors, or flags not cleared for the next call,
    would add stale partials)."""
    n, kdim = 512, 8224
    q = kbit.repack(kbit.quantize(random_weight(n, kdim, gen=rng, device="cuda", spread=0.5), k=k))
    w = _weight(q)
    try:
        for i, (tn, wg) in enumerate([(64, 1), (128, 1), (256, 1), (32, 2), (128, 2), (256, 2)]):
            ops.force_wgmma_config(tn, wg, -1)
            dtype = (torch.float16, torch.bfloat16)[i % 2]
            bias = torch.randn(n, generator=rng).to(dtype).cuda()
            for m in (1, 70, 257, 1, 33):
                x = torch.randn(m, kdim, generator=rng).to(dtype).cuda()
                got = _run(q, x, bias)
                assert ops.wgmma_last_streamk(), (tn, wg, m)
                err = _rel_err(got.cpu(), ref.linear(x.cpu(), w, bias.cpu()))
                assert err <= TOL[dtype], (tn, wg, m, err)
    finally:
        ops.force_wgmma_config()


@needs_wgmma
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_wgmma_streamk_graph(dtype, rng):
    """Stream-K chosen automatically (gateup, N = 5120, K = 2048, at M = 256: the split model
    takes it there) inside CUDA graphs: three calls per graph share the graph's workspace,
    two graphs and eager calls on the same stream each use their own; every replay with new x
    matches the reference (a workspace whose flags were not zero at a replay's start, or that
    two graphs shared, would hang or add stale partials)."""
    n, kdim, m = 5120, 2048, 256
    qs = [kbit.repack(kbit.quantize(random_weight(n, kdim, gen=rng, device="cuda", spread=0.5), k=k))
          for k in (4, 5)]
    ws = [_weight(q) for q in qs]
    xs = [torch.empty(m, kdim, dtype=dtype, device="cuda") for _ in range(2)]
    outs = [[torch.empty(m, n, dtype=dtype, device="cuda") for _ in range(3)] for _ in range(2)]
    graphs = []
    for gi in range(2):
        xs[gi].copy_(torch.randn(m, kdim, generator=rng).to(dtype))
        _run(qs[0], xs[gi])  # warm up outside the capture (workspace sizes, plans)
        assert ops.wgmma_last_streamk()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for j in range(3):
                q = qs[j % 2]
                ops.wgmma_out(xs[gi], q.packed, q.absmax, q.codebook, n, kdim, q.absmax_exponent, None, outs[gi][j])
        graphs.append(g)
    for rep in range(3):
        for gi in range(2):
            xs[gi].copy_(torch.randn(m, kdim, generator=rng).to(dtype))
            for o in outs[gi]:
                o.fill_(float("nan"))
            graphs[gi].replay()
            eager = _run(qs[1], xs[gi])  # between replays, on the same stream
            torch.cuda.synchronize()
            for j in range(3):
                want = ref.linear(xs[gi].cpu(), ws[j % 2], None)
                err = _rel_err(outs[gi][j].cpu(), want)
                assert err <= TOL[dtype], (rep, gi, j, err)
            assert _rel_err(eager.cpu(), ref.linear(xs[gi].cpu(), ws[1], None)) <= TOL[dtype]


@needs_wgmma
def test_wgmma_unaligned_and_strided(rng):
    """x with a row stride > K or starting 2 bytes past an allocation, out starting 2 bytes past
    one: the op copies where the kernel's alignment rules need it."""
    n, kdim = 64, 256
    q = kbit.repack(kbit.quantize(random_weight(n, kdim, gen=rng, device="cuda"), k=3))
    w = _weight(q)
    base = torch.randn(40, kdim + 9, generator=rng).to(torch.float16).cuda()
    for x in (base[:, :kdim], base[:, 1:kdim + 1], base.flatten()[1:1 + 40 * kdim].view(40, kdim)):
        flat = torch.full((40 * n + 2,), float("nan"), dtype=torch.float16, device="cuda")
        out = flat[1:1 + 40 * n].view(40, n)
        ops.wgmma_out(x, q.packed, q.absmax, q.codebook, n, kdim, 0, None, out)
        assert _rel_err(out.cpu(), ref.linear(x.cpu(), w, None)) <= TOL[torch.float16]
        assert flat[0].isnan() and flat[-1].isnan()


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if WGMMA else []))
def test_wgmma_refuses_and_empty(device, rng):
    q = kbit.repack(kbit.quantize(random_weight(20, 64, gen=rng, device=device), k=2))
    x = torch.randn(3, 64, generator=rng).to(torch.float16).to(device)
    with pytest.raises(ValueError, match="multiples of 8"):
        ops.wgmma(x, q.packed, q.absmax, q.codebook, 20, 64, 0)
    q = kbit.repack(kbit.quantize(random_weight(24, 64, gen=rng, device=device), k=2))
    assert ops.wgmma(x[:0], q.packed, q.absmax, q.codebook, 24, 64, 0).shape == (0, 24)


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if WGMMA else []))
def test_wgmma_opcheck(device, rng):
    q = kbit.repack(kbit.quantize(random_weight(24, 96, gen=rng, device=device), k=5))
    x = torch.randn(70, 96, generator=rng).to(torch.float16).to(device)
    bias = torch.randn(24, generator=rng).to(torch.float16).to(device)
    for b in (None, bias):
        torch.library.opcheck(ops.wgmma, (x, q.packed, q.absmax, q.codebook, 24, 96, 0, b))
    out = torch.empty(70, 24, dtype=torch.float16, device=device)
    torch.library.opcheck(ops.wgmma_out, (x, q.packed, q.absmax, q.codebook, 24, 96, 0, bias, out))
