"""One mma launch per k on the 8192 x 28672 weight at M (default 16) with S K-slices forced
(default 2), for ncu (session 33: k = 3 ran 1.4-1.6x faster than k = 2 and 4 there).
Usage: python3 scripts/profile_big.py [M] [S] [k,k,..]"""
import sys

import torch

import kbit
from kbit import ops

M = int(sys.argv[1]) if len(sys.argv) > 1 else 16
S = int(sys.argv[2]) if len(sys.argv) > 2 else 2
ks = [int(k) for k in (sys.argv[3] if len(sys.argv) > 3 else "2,3,4").split(",")]
K, N = 8192, 28672
w = torch.randn(N, K, dtype=torch.float16, device="cuda") * 0.02
x = torch.randn(M, K, dtype=torch.float16, device="cuda")
y = torch.empty(M, N, dtype=torch.float16, device="cuda")
ops.force_mma_ksplit(S)
for k in ks:
    q = kbit.repack(kbit.quantize(w, k=k))
    ops.mma_out(x, q.packed, q.absmax, q.codebook, N, K, 0, None, y)
torch.cuda.synchronize()
