"""One launch of kbit::wgmma per forced configuration on one dense shape, for ncu.

Usage: python scripts/profile_wgmma.py SHAPE k M TN.WG.S[,TN.WG.S...]   (0.0.0 = automatic;
       "fp16" = one fp16 cuBLAS matmul of the same shape, for comparison)
e.g.   ncu -k regex:wgmma_kernel --section SpeedOfLight python scripts/profile_wgmma.py gateup 4 256 256.1.1,128.2.1
"""
import sys

import torch

import kbit
from kbit import ops
from kbit.bench.linear_suite import DENSE

name, k, M = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
configs = [c if c == "fp16" else tuple(int(v) for v in c.split(".")) for c in sys.argv[4].split(",")]
K, N = DENSE[name]
w = torch.randn(N, K, dtype=torch.float16, device="cuda") * 0.02
q = kbit.repack(kbit.quantize(w, k=k))
x = torch.randn(M, K, dtype=torch.float16, device="cuda")
y = torch.empty(M, N, dtype=torch.float16, device="cuda")
for cfg in configs:
    if cfg == "fp16":
        torch.matmul(x, w.t(), out=y)
    else:
        ops.force_wgmma_config(*cfg)
        ops.wgmma_out(x, q.packed, q.absmax, q.codebook, N, K, 0, None, y)
    torch.cuda.synchronize()
    print("config", cfg if cfg == "fp16" else ".".join(map(str, cfg)), "done", flush=True)
ops.force_wgmma_config()
