"""Small-M matmul kernels on one shape, for ncu and for a hot-vs-cold timing check.

Usage: python scripts/profile_linear.py K N k M [--timing]
Without --timing: one launch each of fp16 cuBLAS, gemv (M <= 4), mma, wgmma (ncu -k regex:...).
With --timing: µs per call, weights hot in L2 (one copy) vs cold (rotated), CUDA-graph replay.
"""
import sys

import torch

import kbit
from kbit import ops
from kbit.bench.timing import copies_for_cold, graph_time_us

K, N, k, M = (int(a) for a in sys.argv[1:5])
timing = "--timing" in sys.argv
w = torch.randn(N, K, dtype=torch.float16, device="cuda") * 0.02
q = kbit.repack(kbit.quantize(w, k=k))
x = torch.randn(M, K, dtype=torch.float16, device="cuda")
y = torch.empty(M, N, dtype=torch.float16, device="cuda")
kernels = {"fp16": None}
if M <= ops.GEMV_MAX_M:
    kernels["gemv"] = ops.gemv_out
if ops.mma_supports(M, K):
    kernels["mma"] = ops.mma_out
if ops.wgmma_supports(M, K, N, k, "cuda"):
    kernels["wgmma"] = ops.wgmma_out
if not timing:
    for _ in range(2):
        torch.matmul(x, w.T, out=y)
        for name, fn in kernels.items():
            if fn is not None:
                fn(x, q.packed, q.absmax, q.codebook, N, K, 0, None, y)
    torch.cuda.synchronize()
    sys.exit(0)
nq = copies_for_cold(q.packed.numel() * 4 + q.absmax.numel())
packs = [(q.packed.clone(), q.absmax.clone()) for _ in range(nq)]
nw = copies_for_cold(N * K * 2)
ws = [w.clone() for _ in range(nw)]
for name, fn in kernels.items():
    res = []
    for n_var in (1, None):
        if fn is None:
            nv = n_var or nw
            t = graph_time_us(lambda i: torch.matmul(x, ws[i].T, out=y), nv)
        else:
            nv = n_var or nq
            t = graph_time_us(lambda i: fn(x, packs[i][0], packs[i][1], q.codebook, N, K, 0, None, y), nv)
        res.append(t)
    print(f"K={K} N={N} k={k} M={M} {name:5}: hot {res[0]:6.2f} us, cold {res[1]:6.2f} us")
