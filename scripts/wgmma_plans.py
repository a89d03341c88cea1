"""Print the plan kbit::wgmma launches with (KBIT_WG_TRACE: tile, shared / solo, stages, splits,
stream-K, the split model's cost and clusters at once per split count) for the dense shapes,
automatic and forced configurations (device machine).
Usage: KBIT_WG_TRACE=1 python scripts/wgmma_plans.py [k,k,...] [M,M,...] [TN.WG.S,...]"""
import sys

import torch

import kbit
from kbit import ops
from kbit.bench.linear_suite import DENSE

ks = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "3,4").split(",")]
ms = [int(v) for v in (sys.argv[2] if len(sys.argv) > 2 else "16,32").split(",")]
forced = [tuple(int(v) for v in c.split(".")) for c in (sys.argv[3] if len(sys.argv) > 3 else "").split(",") if c]
for k in ks:
    for name in ("gateup", "down", "Q", "O", "KV"):
        K, N = DENSE[name]
        q = kbit.repack(kbit.quantize(torch.randn(N, K, device="cuda") * 0.02, k=k))
        for m in ms:
            x = torch.randn(m, K, dtype=torch.float16, device="cuda")
            for cfg in [(0, 0, 0)] + forced:
                ops.force_wgmma_config(*cfg)
                print(f"{name} k={k} M={m} forced={'.'.join(map(str, cfg))}", file=sys.stderr, flush=True)
                ops.wgmma(x, q.packed, q.absmax, q.codebook, N, K, q.absmax_exponent)
                torch.cuda.synchronize()
            ops.force_wgmma_config()
