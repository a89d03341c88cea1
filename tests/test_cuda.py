"""CUDA-only behaviour: streams, devices, CUDA graphs, torch.compile, large shapes."""

import pytest
import torch

import kbit
from kbit import ops
from kbit import reference as ref

from conftest import GPU, random_weight

pytestmark = pytest.mark.skipif(not GPU, reason="needs a CUDA GPU and the kbit native library")


@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_large_matches_reference(k, rng):
    w = random_weight(5120, 2048, torch.bfloat16, rng, "cuda")
    q = kbit.quantize(w, k=k)
    p, a, s = ref.quantize(w.cpu(), q.codebook.cpu(), "e4m4", 0)
    assert torch.equal(q.packed.cpu(), p) and torch.equal(q.absmax.cpu(), a) and s.sum() == 0
    t = kbit.repack(q)
    out = torch.full(q.shape, float("nan"), dtype=torch.float16, device="cuda")
    kbit.dequantize(t, out=out)
    assert torch.equal(out.cpu(), ref.dequantize(p, a, q.codebook.cpu(), q.shape, "flat", 0, torch.float16))


def test_side_stream(rng):
    w = random_weight(512, 1024, torch.float16, rng, "cuda")
    expected = kbit.dequantize(kbit.quantize(w, k=4), torch.float16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        q = kbit.quantize(w, k=4)
        d = kbit.dequantize(kbit.repack(q), torch.float16)
    torch.cuda.current_stream().wait_stream(s)
    assert torch.equal(d, expected)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_device(rng):
    w = random_weight(256, 512, torch.float16, rng)
    q1 = kbit.quantize(w.to("cuda:1"), k=3)
    assert q1.device == torch.device("cuda:1") and torch.cuda.current_device() == 0
    assert torch.equal(kbit.dequantize(q1).cpu(), kbit.dequantize(kbit.quantize(w, k=3)))


def test_cuda_graph_replay_with_new_inputs(rng):
    q = kbit.repack(kbit.quantize(random_weight(300, 640, gen=rng, device="cuda"), k=5))
    packed, absmax = q.packed.clone(), q.absmax.clone()
    out = torch.empty(q.shape, dtype=torch.bfloat16, device="cuda")
    args = (packed, absmax, q.codebook, *q.shape, "tiled64", 0, out)
    ops.dequantize_out(*args)  # warm up outside capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ops.dequantize_out(*args)
    q2 = kbit.repack(kbit.quantize(random_weight(300, 640, gen=rng, device="cuda"), k=5))
    packed.copy_(q2.packed)
    absmax.copy_(q2.absmax)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, kbit.dequantize(q2, torch.bfloat16))


def test_torch_compile_fullgraph(rng):
    q = kbit.repack(kbit.quantize(random_weight(64, 256, gen=rng, device="cuda"), k=4))

    def f(packed, absmax, codebook, x):
        w = ops.dequantize(packed, absmax, codebook, 64, 256, "tiled64", 0, torch.float16)
        return x @ w.T

    x = torch.randn(3, 256, dtype=torch.float16, device="cuda")
    compiled = torch.compile(f, fullgraph=True)
    got = compiled(q.packed, q.absmax, q.codebook, x)
    assert torch.equal(got, f(q.packed, q.absmax, q.codebook, x))
