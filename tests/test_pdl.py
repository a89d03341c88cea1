"""Programmatic dependent launch (csrc/common.cuh): a gemv / mma / wgmma call may start while the
previous kernel of its stream is still running, and must wait for it before it reads x, the weights or
the codebook and before it writes its output. Each test makes the previous kernel write what the
next call reads, with no synchronisation between them, and compares with the reference (W
dequantized in float32, product in float64; tolerance of test_linear.py: 2e-3 for fp16, one
output rounding with ~4x margin). A call that read too early would see NaN poison or the
previous weights: errors of order 1 or NaN. Run under KBIT_PDL=0 and 1 alike. The "split"
variants force a K split: mma S = 2 (partial sums through its workspace, which the previous
call left for it), wgmma splits = 4 (over a thread-block cluster: the cluster and PDL launch
attributes together)."""

import pytest
import torch

import kbit
from kbit import ops
from kbit import reference as ref

from conftest import GPU, gpu, random_weight

TOL = 2e-3
WGMMA = GPU and ops.wgmma_supports(1, 64, 64, 4, "cuda")
# (kernel, forced K split): mma's S = 2 (K = 2048 at M = 8 fits one CTA otherwise); wgmma's
# forced splits = 4 over a cluster
KERNELS = {"gemv": ("gemv", 0), "mma": ("mma", 0), "mma_split": ("mma", 2), "wgmma": ("wgmma", 0),
           "wgmma_split": ("wgmma", 4)}


@pytest.fixture
def forced():
    """Sets the forced K split of the kernel named by the test's `name`, and clears it after."""
    def force(name):
        kernel, split = KERNELS[name]
        if kernel.startswith("wgmma") and not WGMMA:
            pytest.skip("needs wgmma (compute capability 9.0, sm_90a build)")
        if kernel == "mma":
            ops.force_mma_ksplit(split)
        elif kernel == "wgmma":
            ops.force_wgmma_config(0, 0, split)
        return kernel
    yield force
    ops.force_mma_ksplit(0)
    ops.force_wgmma_config()


def _rel_err(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def _ref(x, q):
    w = ref.dequantize(q.packed.cpu(), q.absmax.cpu(), q.codebook.cpu(), q.shape, q.layout,
                       q.absmax_exponent, torch.float32)
    return ref.linear(x.cpu(), w, None)


def _call(name, x, q, out):
    getattr(ops, f"{name}_out")(x, q.packed, q.absmax, q.codebook, q.shape[0], q.shape[1], q.absmax_exponent,
                                None, out)


@gpu
@pytest.mark.parametrize("name,m", [("gemv", 1), ("gemv", 4), ("mma", 1), ("mma", 8), ("mma_split", 8),
                                    ("wgmma", 16), ("wgmma", 200), ("wgmma_split", 64)])
@pytest.mark.parametrize("k", [2, 4, 5])
def test_chain_reads_previous_output(name, m, k, rng, forced):
    """y1 = x W1^T, then y2 = y1 W2^T right behind it (the second call reads what the first
    wrote); y1 is NaN-poisoned by a fill just before the first call."""
    request_name, name = name, forced(name)
    q1 = kbit.repack(kbit.quantize(random_weight(1024, 2048, gen=rng, device="cuda", spread=0.5), k=k))
    q2 = kbit.repack(kbit.quantize(random_weight(512, 1024, gen=rng, device="cuda", spread=0.5), k=k))
    y1 = torch.empty(m, 1024, dtype=torch.float16, device="cuda")
    y2 = torch.empty(m, 512, dtype=torch.float16, device="cuda")
    for _ in range(4):
        x = torch.randn(m, 2048, generator=rng).to(torch.float16).cuda()
        y1.fill_(float("nan"))
        y2.fill_(float("nan"))
        _call(name, x, q1, y1)
        _call(name, y1, q2, y2)
        assert _rel_err(y1.cpu(), _ref(x, q1)) <= TOL
        assert _rel_err(y2.cpu(), _ref(y1, q2)) <= TOL
    if name == "mma" and KERNELS[request_name][1] > 1:  # the split really ran
        assert ops.mma_ksplit(m, 1024, 512, k, "cuda") == KERNELS[request_name][1]


@gpu
@pytest.mark.parametrize("name,m", [("gemv", 1), ("mma", 1), ("mma", 8), ("mma_split", 8), ("wgmma", 32),
                                    ("wgmma_split", 32)])
def test_weights_written_just_before(name, m, rng, forced):
    """The packed words, scales and codebook of a call are copied into its buffers by the
    kernels right before it (they held another weight's until then)."""
    name = forced(name)
    qa = kbit.repack(kbit.quantize(random_weight(2048, 2048, gen=rng, device="cuda", spread=0.5), k=4))
    steps = torch.cumsum(torch.rand(16, generator=rng) + 0.2, 0)  # a random codebook, gaps >= ~0.02
    cb_b = (steps - steps[0]) / (steps[-1] - steps[0]) * 2 - 1
    qb = kbit.repack(kbit.quantize(random_weight(2048, 2048, gen=rng, device="cuda", spread=0.5), k=4,
                                   codebook=cb_b))
    buf = kbit.repack(kbit.quantize(random_weight(2048, 2048, gen=rng, device="cuda", spread=0.5), k=4))
    x = torch.randn(m, 2048, generator=rng).to(torch.float16).cuda()
    y = torch.empty(m, 2048, dtype=torch.float16, device="cuda")
    for src in (qa, qb, qa):
        buf.packed.copy_(src.packed)
        buf.absmax.copy_(src.absmax)
        buf.codebook.copy_(src.codebook)
        y.fill_(float("nan"))
        _call(name, x, buf, y)
        assert _rel_err(y.cpu(), _ref(x, src)) <= TOL


@gpu
@pytest.mark.parametrize("name,m", [("gemv", 2), ("mma", 3), ("mma_split", 8), ("wgmma", 48),
                                    ("wgmma_split", 48)])
def test_chain_in_cuda_graph(name, m, rng, forced):
    """The chain of test_chain_reads_previous_output captured once and replayed with new x."""
    name = forced(name)
    q1 = kbit.repack(kbit.quantize(random_weight(1024, 2048, gen=rng, device="cuda", spread=0.5), k=3))
    q2 = kbit.repack(kbit.quantize(random_weight(512, 1024, gen=rng, device="cuda", spread=0.5), k=3))
    x = torch.randn(m, 2048, generator=rng).to(torch.float16).cuda()
    y1 = torch.empty(m, 1024, dtype=torch.float16, device="cuda")
    y2 = torch.empty(m, 512, dtype=torch.float16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture
        _call(name, x, q1, y1)
        _call(name, y1, q2, y2)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y1.fill_(float("nan"))
        _call(name, x, q1, y1)
        _call(name, y1, q2, y2)
    for _ in range(3):
        x.copy_(torch.randn(m, 2048, generator=rng).to(torch.float16))
        graph.replay()
        torch.cuda.synchronize()
        assert _rel_err(y1.cpu(), _ref(x, q1)) <= TOL
        assert _rel_err(y2.cpu(), _ref(y1, q2)) <= TOL


@gpu
@pytest.mark.parametrize("name,m", [("gemv", 1), ("mma", 1), ("mma", 4)])
@pytest.mark.parametrize("k", [2, 4, 5])
def test_codebook_written_by_previous_kernel(name, m, k, rng, forced):
    """The codebook of a call is the output of the PDL kernel right before it (viewed as
    float32), which held another codebook until then. mma at k = 5 reads the codebook before
    its PDL wait to build its table early (KBIT_MMA_SPEC_TABLE) and must rebuild it when the
    codebook changed: its 128 CTAs start while the first call's 4 are still running."""
    name = forced(name)
    # first call: y1 = x1 W1^T with x1 one-hot, so y1 is column 0 of W1 (dequantized); its odd
    # halves, the high halves of the float32 view, in [1, 2): codebook entries in [2^-7, 2)
    w1 = random_weight(64, 256, gen=rng, spread=0.0) * 0.02
    w1[1::2, 0] = 1 + torch.rand(32, generator=rng, dtype=torch.float64).float()
    q1 = kbit.repack(kbit.quantize(w1.cuda(), k=4))
    x1 = torch.zeros(1, 256, dtype=torch.float16, device="cuda")
    x1[0, 0] = 1.0
    q2 = kbit.repack(kbit.quantize(random_weight(2048, 2048, gen=rng, device="cuda", spread=0.5), k=k))
    x2 = torch.randn(m, 2048, generator=rng).to(torch.float16).cuda()
    y1 = torch.empty(1, 64, dtype=torch.float16, device="cuda")
    y2 = torch.empty(m, 2048, dtype=torch.float16, device="cuda")
    cb = y1.view(torch.float32).view(-1)[: 1 << k]  # the second call's codebook
    for _ in range(3):
        cb.copy_(q2.codebook)  # the previous codebook, in [-1, 1]
        y2.fill_(float("nan"))
        _call("mma", x1, q1, y1)
        getattr(ops, f"{name}_out")(x2, q2.packed, q2.absmax, cb, 2048, 2048, q2.absmax_exponent, None, y2)
        want = ref.linear(x2.cpu(), _ref_weight(q2, cb), None)
        assert _rel_err(y2.cpu(), want) <= TOL
        # the test can fail: the previous codebook gives a far different product (> 50 TOL; a
        # bound of 0.5 failed once at k = 2, 0.45, where 4 random entries can sit close)
        assert _rel_err(ref.linear(x2.cpu(), _ref_weight(q2), None), want) > 50 * TOL


def _ref_weight(q, codebook=None):
    """q dequantized in float32 on the CPU, with q's codebook or the one given."""
    cb = q.codebook if codebook is None else codebook
    return ref.dequantize(q.packed.cpu(), q.absmax.cpu(), cb.cpu(), q.shape, q.layout,
                          q.absmax_exponent, torch.float32)
