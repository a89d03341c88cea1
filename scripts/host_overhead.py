"""Where the host time of an eager kbit.linear call at M = 1 goes (device machine).

Prints wall-clock us per call of back-to-back calls for: the whole kbit.linear, its pieces
(dispatch lookup, output allocation, the ctypes call alone with M = 0 so nothing launches, the
ctypes call that launches), and eager fp16 torch.matmul / F.linear as the reference; then the
same shape at M = 64, which the dispatch table gives to wgmma (kbit.linear against the
torch.library op it bypasses, and fp16), and at M = 1024 (dequantize + cuBLAS: kbit.linear
against the same with the dequantize op), with each call's GPU time for comparison.
Usage: python scripts/host_overhead.py [calls]
"""
import sys
import time

import torch

import kbit
from kbit import _lib, ops

L = sys.modules["kbit.linear"]  # the module (kbit.linear is the function)

calls = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
K, N = 2048, 5120
w = torch.randn(N, K, dtype=torch.float16, device="cuda") * 0.02
q = kbit.repack(kbit.quantize(w, k=4))
x = torch.randn(1, K, dtype=torch.float16, device="cuda")
y = torch.empty(1, N, dtype=torch.float16, device="cuda")
lib = _lib._lib
stream = torch.cuda.current_stream().cuda_stream
wargs = L._launch_args(q, x.device)


def per_call(fn):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def ctypes_call(m):
    return lib.kbit_mma(0, stream, x.data_ptr(), 1, m, K, wargs[0], wargs[1], wargs[2], wargs[3],
                        wargs[4], N, K, wargs[5], None, y.data_ptr(), N, None, 0, 0)


blocks = {m: _lib.CallBlock(0, stream, x.data_ptr(), 1, m, K, wargs[0], wargs[1], wargs[2], wargs[3], wargs[4], N, K,
                            wargs[5], 0, y.data_ptr(), N, 0, 0, 0) for m in (0, 1)}


def block_call(m):
    return lib.kbit_small_m_call(_lib.CALL_CODES["mma"], blocks[m])


rows = [
    ("kbit.linear(x, q, out=y)", lambda: kbit.linear(x, q, out=y)),
    ("kbit.linear(x, q)", lambda: kbit.linear(x, q)),
    ("kernel_for lookup", lambda: L.kernel_for(1, N, K, 4)),
    ("torch.empty((1, N))", lambda: torch.empty((1, N), dtype=torch.float16, device="cuda")),
    ("x.device / stream handle", lambda: torch.cuda.current_stream(x.device.index).cuda_stream),
    ("ctypes kbit_mma, M = 0 (no launch)", lambda: ctypes_call(0)),
    ("ctypes kbit_mma, M = 1 (launch)", lambda: ctypes_call(1)),
    ("ctypes kbit_small_m_call mma, M = 0", lambda: block_call(0)),
    ("ctypes kbit_small_m_call mma, M = 1", lambda: block_call(1)),
    ("ops.mma_out (torch.library op)", lambda: ops.mma_out(x, q.packed, q.absmax, q.codebook, N, K, 0, None, y)),
    ("fp16 torch.matmul(x, w.T, out=y)", lambda: torch.matmul(x, w.T, out=y)),
    ("fp16 F.linear(x, w)", lambda: torch.nn.functional.linear(x, w)),
]
for name, fn in rows:
    print(f"{name:40s} {per_call(fn):7.2f} us")

# M = 64: the wgmma path (its GPU time per call from CUDA events over the same calls, hot)
x64 = torch.randn(64, K, dtype=torch.float16, device="cuda")
y64 = torch.empty(64, N, dtype=torch.float16, device="cuda")
print(f"M = 64: dispatch table kernel {L.kernel_for(64, N, K, 4)!r}")


def gpu_us(fn, reps=200):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(20):
            fn()
    g.replay()
    start.record()
    for _ in range(reps // 20):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


rows64 = [
    ("kbit.linear(x64, q, out=y64)", lambda: kbit.linear(x64, q, out=y64)),
    ("kbit.linear(x64, q)", lambda: kbit.linear(x64, q)),
    ("ops.wgmma_out (torch.library op)", lambda: ops.wgmma_out(x64, q.packed, q.absmax, q.codebook, N, K, 0, None, y64)),
    ("fp16 F.linear(x64, w)", lambda: torch.nn.functional.linear(x64, w)),
]
for name, fn in rows64:
    print(f"{name:40s} {per_call(fn):7.2f} us wall, {gpu_us(fn):6.2f} us GPU (graph, hot)")

# M = 1024: dequantize + cuBLAS (the dispatch table's "dq" for this shape and k)
x1k = torch.randn(1024, K, dtype=torch.float16, device="cuda")
y1k = torch.empty(1024, N, dtype=torch.float16, device="cuda")
wq = torch.empty(N, K, dtype=torch.float16, device="cuda")
print(f"M = 1024: dispatch table kernel {L.kernel_for(1024, N, K, 4)!r}")


def dq_op_then_matmul():
    ops.dequantize_out(q.packed, q.absmax, q.codebook, N, K, q.layout, 0, wq)
    torch.matmul(x1k, wq.T, out=y1k)


rows1k = [
    ("kbit.linear(x1k, q, out=y1k)", lambda: kbit.linear(x1k, q, out=y1k)),
    ("ops.dequantize_out + matmul", dq_op_then_matmul),
    ("fp16 torch.matmul(x1k, w.T, out=y1k)", lambda: torch.matmul(x1k, w.T, out=y1k)),
]
for name, fn in rows1k:
    print(f"{name:40s} {per_call(fn):7.2f} us wall, {gpu_us(fn):6.2f} us GPU (graph, hot)")
