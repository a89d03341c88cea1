"""One mma launch of gateup (K = 2048, N = 5120) per M at a forced K split, for ncu (session 35:
which M ran the slot flush, from the dynamic shared memory each launch asked for).

Usage (device): ncu -k regex:mma_kernel --section LaunchStats ... python3 scripts/profile_mma_m.py M,M,.. S k
"""
import sys
import torch
import kbit
from kbit import ops
ms = [int(v) for v in sys.argv[1].split(",")]
S = int(sys.argv[2]); k = int(sys.argv[3])
K, N = 2048, 5120
w = torch.randn(N, K, dtype=torch.float16, device="cuda") * 0.02
q = kbit.repack(kbit.quantize(w, k=k))
ops.force_mma_ksplit(S)
for m in ms:
    x = torch.randn(m, K, dtype=torch.float16, device="cuda")
    y = torch.empty(m, N, dtype=torch.float16, device="cuda")
    ops.mma_out(x, q.packed, q.absmax, q.codebook, N, K, 0, None, y)
torch.cuda.synchronize()
