"""Sweep of the M = 1 scalar GEMV's coalesced variant (gemv_rows_kernel: rows x warps per CTA)
against the lane-per-k-tile kernel ("off") and mma, on the dense shapes + the 28672 x 8192
weight, cold (weights rotated past L2), CUDA-graph replay, median us. Every configuration's
output is first checked against the fp32 reference (relative Frobenius error <= 2e-3 fp16,
1e-2 bf16: the test suite's bounds, tests/test_linear.py). Device, repo root:
    PYTHONPATH=. python3 scripts/gemv_rows_sweep.py [--k 2,4,5] [--dtype fp16]
"""

from __future__ import annotations

import argparse

import torch

import kbit
from kbit import ops
from kbit import reference as ref
from kbit.bench.linear_suite import DENSE, EXTRA
from kbit.bench.timing import copies_for_cold, graph_time_us

CONFIGS = [(-1, 0), (8, 4), (8, 8), (16, 4), (16, 8), (32, 4), (32, 8), (0, 0)]  # (-1, 0): off; (0, 0): auto


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--k", default="2,4,5")
    p.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    args = p.parse_args()
    dtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    tol = 2e-3 if dtype == torch.float16 else 1e-2
    shapes = {**DENSE, **EXTRA}
    names = ["off" if r < 0 else "auto" if r == 0 else f"{r}x{w}" for r, w in CONFIGS]
    print("| shape | k | " + " | ".join(names) + " | MMA | fp16 |")
    print("|---" * (len(names) + 4) + "|")
    fails = 0
    for name, (K, N) in shapes.items():
        w = torch.randn(N, K, dtype=torch.float16, device="cuda") * 0.02
        w16 = [w.clone() for _ in range(copies_for_cold(N * K * 2))]
        xs = [torch.randn(1, K, device="cuda").to(dtype) for _ in range(4)]
        fp16 = graph_time_us(lambda i: torch.matmul(xs[i % 4].half(), w16[i % len(w16)].T), len(w16))
        for k in [int(v) for v in args.k.split(",")]:
            q = kbit.repack(kbit.quantize(w, k=k))
            nbytes = q.packed.numel() * 4 + q.absmax.numel() * q.absmax.element_size()
            packs = [(q.packed.clone(), q.absmax.clone()) for _ in range(copies_for_cold(nbytes))]
            wref = ref.dequantize(q.packed.cpu(), q.absmax.cpu(), q.codebook.cpu(), q.shape, q.layout,
                                  q.absmax_exponent, torch.float32)
            want = ref.linear(xs[0].cpu(), wref, None).double()
            cells = []
            for rows, warps in CONFIGS:
                ops.force_gemv_rows(rows, warps)
                out = torch.full((1, N), float("nan"), dtype=dtype, device="cuda")
                ops.gemv_out(xs[0], q.packed, q.absmax, q.codebook, N, K, q.absmax_exponent, None, out)
                err = float((out.cpu().double() - want).norm() / want.norm())
                if not err <= tol:
                    fails += 1
                    cells.append(f"FAIL {err:.1e}")
                    continue
                t = graph_time_us(lambda i: ops.gemv(xs[i % 4], packs[i % len(packs)][0], packs[i % len(packs)][1],
                                                     q.codebook, N, K, q.absmax_exponent), len(packs))
                cells.append(f"{t:.2f} ({nbytes / t / 1e3:.0f})")
            ops.force_gemv_rows(0, 0)
            tm = graph_time_us(lambda i: ops.mma(xs[i % 4], packs[i % len(packs)][0], packs[i % len(packs)][1],
                                                 q.codebook, N, K, q.absmax_exponent), len(packs))
            print(f"| {name} | {k} | " + " | ".join(cells) + f" | {tm:.2f} | {fp16:.2f} |", flush=True)
    print("us (GB/s of k-bit weights); failures:", fails)


if __name__ == "__main__":
    main()
