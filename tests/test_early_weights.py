"""mma's and gemv's first weights and wgmma's codebook requested before their PDL wait
(KBIT_WEIGHTS_STABLE, csrc/kbit.h; kbit/ops.py _stable_flag): only where the kernel running just
before the call cannot have written them. The flag is given when kbit launched gemv, mma or wgmma on the same three weight
tensors before and none of their version counters moved since; any torch write (in place,
through a view, or by one of kbit's `_out` ops) makes the next call wait. The CPU tests check
that bookkeeping; the GPU test makes the previous kernel write the weights of a kbit.linear
call and compares with the reference (a call that read them early would see the previous
weights: errors of order 1)."""

import pytest
import torch

import kbit
from kbit import ops
from kbit import reference as ref

from conftest import gpu, random_weight


@pytest.fixture
def seen(monkeypatch):
    """Fresh bookkeeping, early weights on."""
    monkeypatch.setattr(ops, "_launch_seen", {})
    monkeypatch.setattr(ops, "EARLY_WEIGHTS", True)
    return ops._launch_seen


def _weights():
    return torch.zeros(64, dtype=torch.int32), torch.zeros(8, dtype=torch.uint8), torch.zeros(16)


def _call(p, a, c):
    """What a launch does: the flag, then the record."""
    flag, versions = ops._stable_flag(p, a, c)
    ops._launched(p, a, c, versions)
    return flag


def test_first_call_waits_then_stable(seen):
    p, a, c = _weights()
    assert _call(p, a, c) == 0  # never launched on: its writer may be the previous kernel
    assert _call(p, a, c) == 1
    assert _call(p, a, c) == 1


@pytest.mark.parametrize("write", ["packed", "absmax", "codebook", "view"])
def test_write_makes_the_next_call_wait(seen, write):
    p, a, c = _weights()
    _call(p, a, c)
    assert _call(p, a, c) == 1
    {"packed": lambda: p.add_(1), "absmax": lambda: a.copy_(torch.ones(8, dtype=torch.uint8)),
     "codebook": lambda: c.mul_(2), "view": lambda: p[3:5].zero_()}[write]()
    assert _call(p, a, c) == 0
    assert _call(p, a, c) == 1


def test_out_op_write_is_seen(seen):
    """kbit's own `_out` ops bump the version of what they write (torch.library custom ops with
    mutates_args), as repack_out into a weight's buffers would."""
    @torch.library.custom_op("kbit_test::write_out", mutates_args=("out",))
    def write_out(x: torch.Tensor, out: torch.Tensor) -> None:
        pass  # like kbit's ops: the writing happens outside torch (ctypes)

    p, a, c = _weights()
    _call(p, a, c)
    write_out(torch.ones(1), p)
    assert _call(p, a, c) == 0


def test_other_tensors_or_refused_launch_wait(seen):
    p, a, c = _weights()
    _call(p, a, c)
    a2 = a.clone()
    assert _call(p, a2, c) == 0  # another absmax with the same packed
    assert _call(p, a2, c) == 1
    p.add_(1)
    flag, versions = ops._stable_flag(p, a2, c)
    assert flag == 0  # and the launch is refused: no record
    assert ops._stable_flag(p, a2, c)[0] == 0


def test_dead_weights_leave_no_record(seen):
    p, a, c = _weights()
    _call(p, a, c)
    assert len(seen) == 1
    del p
    assert not seen  # a new tensor at the same id starts over


def test_inference_tensors_and_switch(seen, monkeypatch):
    with torch.inference_mode():
        p, a, c = _weights()
    assert _call(p, a, c) == 0 and _call(p, a, c) == 0  # no version counter: never early
    p, a, c = _weights()
    monkeypatch.setattr(ops, "EARLY_WEIGHTS", False)  # KBIT_EARLY_WEIGHTS=0
    assert _call(p, a, c) == 0 and _call(p, a, c) == 0


@gpu
@pytest.mark.parametrize("m", [1, 4, 16])
@pytest.mark.parametrize("k", [2, 4, 5])
def test_linear_weights_written_by_previous_kernel(m, k, rng):
    """kbit.linear (mma through the eager fast path) right after copy_ kernels wrote its
    weights in place, the last copy the kernel just before the call; alternating two weights,
    each call checked, then calls with no write in between (which take the early path)."""
    n, kdim = 2048, 2048
    qs = [kbit.repack(kbit.quantize(random_weight(n, kdim, gen=rng, device="cuda", spread=0.5), k=k))
          for _ in range(2)]
    buf = kbit.repack(kbit.quantize(random_weight(n, kdim, gen=rng, device="cuda", spread=0.5), k=k))
    x = torch.randn(m, kdim, generator=rng).to(torch.float16).cuda()
    y = torch.empty(m, n, dtype=torch.float16, device="cuda")
    wants = [ref.linear(x.cpu(), ref.dequantize(q.packed.cpu(), q.absmax.cpu(), q.codebook.cpu(), q.shape,
                                                 q.layout, q.absmax_exponent, torch.float32), None) for q in qs]
    kbit.linear(x, buf, out=y)  # buf has been launched on: its next unchanged call is early
    for i in (0, 1, 0, 1):
        y.fill_(float("nan"))
        buf.absmax.copy_(qs[i].absmax)
        buf.packed.copy_(qs[i].packed)  # the kernel right before the call
        assert ops._stable_flag(buf.packed, buf.absmax, buf.codebook)[0] == 0
        kbit.linear(x, buf, out=y)
        err = ((y.cpu().double() - wants[i].double()).norm() / wants[i].double().norm()).item()
        assert err <= 2e-3, (i, err)
        assert ops._stable_flag(buf.packed, buf.absmax, buf.codebook)[0] == ops._WEIGHTS_STABLE * ops.EARLY_WEIGHTS
        for _ in range(2):  # unchanged weights: early loads
            y.fill_(float("nan"))
            kbit.linear(x, buf, out=y)
            err = ((y.cpu().double() - wants[i].double()).norm() / wants[i].double().norm()).item()
            assert err <= 2e-3, (i, err)


def _written_weights_check(op, m, n, k, rng):
    """`op` (ops.gemv or ops.wgmma) right after copy_ kernels wrote its codebook, absmax and
    packed words in place (the flag withheld: the call must wait), then unchanged calls (the
    early path); every call checked against the reference. Then the codebook alone written
    just before the call must change the product."""
    kdim = 2048
    qs = [kbit.repack(kbit.quantize(random_weight(n, kdim, gen=rng, device="cuda", spread=0.5), k=k))
          for _ in range(2)]
    qs[1].codebook.copy_(qs[1].codebook * 0.75)  # another codebook: a stale one is visible
    buf = kbit.repack(kbit.quantize(random_weight(n, kdim, gen=rng, device="cuda", spread=0.5), k=k))
    x = torch.randn(m, kdim, generator=rng).to(torch.float16).cuda()
    wants = [ref.linear(x.cpu(), ref.dequantize(q.packed.cpu(), q.absmax.cpu(), q.codebook.cpu(), q.shape,
                                                 q.layout, q.absmax_exponent, torch.float32), None) for q in qs]

    def call(want):
        y = op(x, buf.packed, buf.absmax, buf.codebook, n, kdim, buf.absmax_exponent)
        return ((y.cpu().double() - want.double()).norm() / want.double().norm()).item()

    call(wants[0])  # buf has been launched on: its next unchanged call is early
    for i in (0, 1, 0, 1):
        buf.codebook.copy_(qs[i].codebook)
        buf.absmax.copy_(qs[i].absmax)
        buf.packed.copy_(qs[i].packed)  # the kernel right before the call
        assert ops._stable_flag(buf.packed, buf.absmax, buf.codebook)[0] == 0
        assert call(wants[i]) <= 2e-3, i
        assert ops._stable_flag(buf.packed, buf.absmax, buf.codebook)[0] == ops._WEIGHTS_STABLE * ops.EARLY_WEIGHTS
        for _ in range(2):  # unchanged weights: early loads
            assert call(wants[i]) <= 2e-3, i
    buf.codebook.copy_(qs[0].codebook)
    assert call(wants[1]) > 0.05  # qs[1]'s words with qs[0]'s codebook: a different product
    buf.codebook.copy_(qs[1].codebook)
    assert call(wants[1]) <= 2e-3


@gpu
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("k", [2, 3, 4, 5])
@pytest.mark.parametrize("n", [512, 2049])
def test_gemv_weights_written_by_previous_kernel(m, k, n, rng):
    """ops.gemv: its coalesced rows kernel reads the codebook and its first tiles before the
    PDL wait on stable weights. n = 2049: a CTA whose last rows lie past N."""
    _written_weights_check(ops.gemv, m, n, k, rng)


@gpu
@pytest.mark.parametrize("m", [1, 64, 256])
@pytest.mark.parametrize("k", [2, 4, 5])
def test_wgmma_weights_written_by_previous_kernel(m, k, rng):
    """ops.wgmma: its codebook read before the PDL wait on stable weights."""
    if not ops.wgmma_supports(m, 2048, 2048, k, "cuda"):
        pytest.skip("wgmma needs a compute capability 9.0 device")
    _written_weights_check(ops.wgmma, m, 2048, k, rng)
