"""One launch each of dequantize and quantize on an 8192x28672 weight, for ncu."""
import sys

import torch

import kbit
from kbit import ops

ks = [int(k) for k in (sys.argv[1] if len(sys.argv) > 1 else "2,4").split(",")]
w = torch.randn(28672, 8192, dtype=torch.float16, device="cuda") * 0.02
for k in ks:
    q = kbit.quantize(w, k=k)
    t = kbit.repack(q)
    out = torch.empty(q.shape, dtype=torch.float16, device="cuda")
    ops.dequantize_out(t.packed, t.absmax, t.codebook, *t.shape, "tiled64", 0, out)
    status = torch.zeros(3, dtype=torch.int32, device="cuda")
    ops.quantize_out(w, q.codebook, "e4m4", 0, q.packed, q.absmax, status)
torch.cuda.synchronize()
