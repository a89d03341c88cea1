"""One mma launch per (k, M) with S K-slices forced, for ncu. Defaults: the 8192 x 28672 weight
at M = 16, S = 2, k = 2, 3, 4 (session 33: k = 3 ran 1.4-1.6x faster than k = 2 and 4 there).
Session 35 ran gateup at M = 8, 16, 24, 32 (`... 8,16,24,32 2 2 2048,5120`) to see which M took
the slot flush (from the dynamic shared memory each launch asked for).
Usage: python3 scripts/profile_big.py [M,M,..] [S] [k,k,..] [K,N]"""
import sys

import torch

import kbit
from kbit import ops

ms = [int(m) for m in (sys.argv[1] if len(sys.argv) > 1 else "16").split(",")]
S = int(sys.argv[2]) if len(sys.argv) > 2 else 2
ks = [int(k) for k in (sys.argv[3] if len(sys.argv) > 3 else "2,3,4").split(",")]
K, N = (int(v) for v in (sys.argv[4] if len(sys.argv) > 4 else "8192,28672").split(","))
w = torch.randn(N, K, dtype=torch.float16, device="cuda") * 0.02
ops.force_mma_ksplit(S)
for k in ks:
    q = kbit.repack(kbit.quantize(w, k=k))
    for M in ms:
        x = torch.randn(M, K, dtype=torch.float16, device="cuda")
        y = torch.empty(M, N, dtype=torch.float16, device="cuda")
        ops.mma_out(x, q.packed, q.absmax, q.codebook, N, K, 0, None, y)
torch.cuda.synchronize()
