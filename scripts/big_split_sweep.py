"""mma's K split on the 8192 x 28672 weight at M = 8..32 (session 33): bench v41b has MMA at
M = 16 k = 2 90.6 us, k = 3 62.7, k = 4 98.8, k = 5 134.7 (H100), so k = 3's plan is 1.4x
faster than k = 2's with more bytes. Times MMA (cold, the bench's graph harness) under the
automatic plan and every forced S, with the plan's S, and WGMMA for reference.

Usage (device, kbit importable): python3 scripts/big_split_sweep.py [M,M,..] [k,k,..] [K,N | shape,shape,..]
(shape names from kbit.bench.MODEL_SHAPES, e.g. gateup,down,Q,O,KV: a forced-S sweep of the dense
shapes, session 34)
"""

from __future__ import annotations

import sys

import torch

import kbit
from kbit import ops
from kbit.bench import MODEL_SHAPES
from kbit.bench.ops_suite import warm_up
from kbit.bench.timing import copies_for_cold, graph_time_us

ms = [int(v) for v in sys.argv[1].split(",")] if len(sys.argv) > 1 else [8, 16, 32]
ks = [int(v) for v in sys.argv[2].split(",")] if len(sys.argv) > 2 else [2, 3, 4, 5]
arg3 = sys.argv[3] if len(sys.argv) > 3 else "8192,28672"
if arg3.split(",")[0].isdigit():
    shapes = {"W": tuple(int(v) for v in arg3.split(","))}
else:
    shapes = {name: MODEL_SHAPES[name] for name in arg3.split(",")}


def main():
    warm_up()
    print(f"{torch.cuda.get_device_name()}; MMA us per S (auto's S in brackets), WGMMA us")
    print("| shape | M | k | auto | S=1 | S=2 | S=4 | S=8 | WGMMA |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (K, N) in shapes.items():
        sweep(name, K, N)


def sweep(name, K, N):
    w = torch.randn(N, K, dtype=torch.float16, device="cuda") * 0.02
    for k in ks:
        q = kbit.repack(kbit.quantize(w, k=k))
        nb = q.packed.numel() * 4 + q.absmax.numel() * q.absmax.element_size()
        nq = copies_for_cold(nb)
        packs = [(q.packed.clone(), q.absmax.clone()) for _ in range(nq)]
        for m in ms:
            x = torch.randn(m, K, dtype=torch.float16, device="cuda")
            y = torch.empty(m, N, dtype=torch.float16, device="cuda")
            cells = []
            for S in [0, 1, 2, 4, 8]:
                ops.force_mma_ksplit(S)
                s_plan = ops.mma_ksplit(m, K, N, k, "cuda")
                if s_plan == 0:
                    cells.append("-")
                    continue
                t = graph_time_us(lambda i: ops.mma_out(x, packs[i][0], packs[i][1], q.codebook, N, K, 0, None, y), nq)
                cells.append(f"{t:.2f}" + (f" [{s_plan}]" if S == 0 else ""))
            ops.force_mma_ksplit(0)
            tw = graph_time_us(lambda i: ops.wgmma_out(x, packs[i][0], packs[i][1], q.codebook, N, K, 0, None, y), nq) \
                if ops.wgmma_supports(m, K, N, k, "cuda") else float("nan")
            print(f"| {name} | {m} | {k} | " + " | ".join(cells) + f" | {tw:.2f} |", flush=True)


if __name__ == "__main__":
    main()
