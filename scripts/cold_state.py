"""How much of a cold small-M mma call is the cold L2 state of things other than the weights?

In `kbit bench` the weights rotate through copies larger than L2, so every call also finds x,
the codebook, the kernel's parameters and its code evicted from L2 (by the previous calls'
weights). This script times, in the bench's graph harness (kbit.bench.timing), each model
shape's mma call (weights rotated) alone and right after a "warming" call:
  fill     a 1-element fill_ (a plain second kernel: the cost of the pair itself)
  tiny     the same mma kernel instantiation on a 16-row weight with its own x and codebook
           (warms the kernel's code in L2)
  tiny+    as tiny, but with the big call's x and codebook (warms code, x and codebook)
and prints pair - warming call alone. If `tiny` is much faster than `fill`, code fetch from
DRAM is part of every cold call; `tiny+` adds x and the codebook.
Run on the device:  python scripts/cold_state.py [--k 2 4] [--m 1]
"""

from __future__ import annotations

import argparse

import torch

import kbit
from kbit import ops
from kbit.bench.timing import copies_for_cold, graph_time_us

SHAPES = {"gateup": (5120, 2048), "down": (2048, 5120), "Q": (4096, 2048), "O": (2048, 4096),
          "KV": (512, 2048)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--k", type=int, nargs="+", default=[2, 4])
    p.add_argument("--m", type=int, nargs="+", default=[1])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES))
    a = p.parse_args()
    print("us per call (graph, median); pair columns are (pair - warming call alone)")
    print("| shape | k | M | mma cold | fp16 | after fill | after tiny | after tiny+ | fill | tiny |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for m in a.m:
        for k in a.k:
            for name in a.shapes:
                N, K = SHAPES[name]
                w = torch.randn(N, K, dtype=torch.float16, device="cuda") * 0.02
                q = kbit.repack(kbit.quantize(w, k=k))
                nq = copies_for_cold(q.packed.numel() * 4 + q.absmax.numel())
                packs = [(q.packed.clone(), q.absmax.clone()) for _ in range(nq)]
                w16 = [w.clone() for _ in range(copies_for_cold(N * K * 2))]
                x = torch.randn(m, K, dtype=torch.float16, device="cuda")
                y = torch.empty(m, N, dtype=torch.float16, device="cuda")
                qt = kbit.repack(kbit.quantize(torch.randn(16, K, dtype=torch.float16, device="cuda"), k=k))
                cbt = qt.codebook.clone()
                xt = torch.randn(m, K, dtype=torch.float16, device="cuda")
                yt = torch.empty(m, 16, dtype=torch.float16, device="cuda")
                one = torch.empty(1, dtype=torch.float32, device="cuda")

                def big(i):
                    ops.mma_out(x, packs[i][0], packs[i][1], q.codebook, N, K, 0, None, y)

                def tiny(xx, cb):
                    ops.force_mma_ksplit(1)  # the plain (not split-K) instantiation, as big's
                    ops.mma_out(xx, qt.packed, qt.absmax, cb, 16, K, 0, None, yt)
                    ops.force_mma_ksplit(0)

                if ops.mma_ksplit(m, K, N, k, "cuda") != 1:
                    print(f"| {name} | {k} | {m} | split-K call: skipped |")
                    continue
                t_big = graph_time_us(big, nq)
                t_fp16 = graph_time_us(lambda i: torch.matmul(x, w16[i].T, out=y), len(w16))
                t_fill = graph_time_us(lambda i: one.fill_(1.0), 1)
                t_tiny = graph_time_us(lambda i: tiny(xt, cbt), 1)
                t_fill_big = graph_time_us(lambda i: (one.fill_(1.0), big(i)), nq)
                t_tiny_big = graph_time_us(lambda i: (tiny(xt, cbt), big(i)), nq)
                t_tinyp_big = graph_time_us(lambda i: (tiny(x, q.codebook), big(i)), nq)
                print(f"| {name} | {k} | {m} | {t_big:.2f} | {t_fp16:.2f} | {t_fill_big - t_fill:.2f} | "
                      f"{t_tiny_big - t_tiny:.2f} | {t_tinyp_big - t_tiny:.2f} | {t_fill:.2f} | {t_tiny:.2f} |",
                      flush=True)
                del packs, w16


if __name__ == "__main__":
    main()
