"""The "linear" suite of `kbit bench`: per-M tables in the seeds' format.

Rows (shape, k) over the dense shapes of DESIGN.md §4, columns per kernel (Scalar = the
GEMV kernel for M <= 4; dq+cuBLAS = dequantize into a reused buffer, then cuBLAS), fp16
cuBLAS, Best (fastest kbit kernel), vs fp16 = fp16 / Best; a TOTAL row per k sums Best and fp16
over the shapes. MoE rows are not measured yet (no grouped kernel). Every time is cold: weights
rotated over enough copies to exceed L2 several times; CUDA-graph replay, median.
"""

from __future__ import annotations

import sys

import torch

import kbit
from kbit import ops

from .timing import copies_for_cold, graph_time_us

DENSE = {"gateup": (2048, 5120), "down": (5120, 2048), "Q": (2048, 4096), "O": (4096, 2048),
         "KV": (2048, 512)}


def _progress(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


def run_linear(ms: list[int], ks: list[int], shapes: list[str], repeats: int) -> dict:
    results = {}  # (M, shape, k) -> {kernel: us}
    fp16 = {}  # (M, shape) -> us
    for name in shapes:
        K, N = DENSE[name]
        w = torch.randn(N, K, dtype=torch.float16, device="cuda") * 0.02
        nw = copies_for_cold(N * K * 2)
        w16 = [w.clone() for _ in range(nw)]
        for m in ms:
            x = torch.randn(m, K, dtype=torch.float16, device="cuda")
            y = torch.empty(m, N, dtype=torch.float16, device="cuda")
            fp16[(m, name)] = graph_time_us(lambda i: torch.matmul(x, w16[i].T, out=y), nw, repeats=repeats)
        del w16
        for k in ks:
            _progress(f"{name} k={k}")
            q = kbit.repack(kbit.quantize(w, k=k))
            nq = copies_for_cold(q.packed.numel() * 4 + q.absmax.numel())
            packs = [(q.packed.clone(), q.absmax.clone()) for _ in range(nq)]
            buf = torch.empty(N, K, dtype=torch.float16, device="cuda")
            for m in ms:
                x = torch.randn(m, K, dtype=torch.float16, device="cuda")
                y = torch.empty(m, N, dtype=torch.float16, device="cuda")
                row = {}
                if m <= ops.GEMV_MAX_M:
                    row["Scalar"] = graph_time_us(
                        lambda i: ops.gemv(x, packs[i][0], packs[i][1], q.codebook, N, K, 0, None),
                        nq, repeats=repeats)

                def dq(i):
                    ops.dequantize_out(packs[i][0], packs[i][1], q.codebook, N, K, "tiled64", 0, buf)
                    torch.matmul(x, buf.T, out=y)

                row["dq+cuBLAS"] = graph_time_us(dq, nq, repeats=repeats)
                results[(m, name, k)] = row
            del packs
        torch.cuda.empty_cache()
    kernels = ["Scalar", "dq+cuBLAS"]
    summary = {}
    for m in ms:
        print(f"\nM={m}: (us per call; cold L2; CUDA-graph replay, median)")
        hdr = f"| {'shape':6} | k | " + " | ".join(f"{c:>9}" for c in kernels) + f" | {'fp16':>7} | {'Best':>9} | {'us':>7} | vs fp16 |"
        print(hdr)
        print("|" + "|".join("-" * len(c) for c in hdr.split("|")[1:-1]) + "|")
        for k in ks:
            tot_best = tot_fp16 = 0.0
            for name in shapes:
                row = results[(m, name, k)]
                best = min(row, key=row.get)
                f = fp16[(m, name)]
                tot_best += row[best]
                tot_fp16 += f
                cells = " | ".join(f"{row[c]:>9.1f}" if c in row else f"{'-':>9}" for c in kernels)
                print(f"| {name:6} | {k} | {cells} | {f:>7.1f} | {best:>9} | {row[best]:>7.1f} | {f / row[best]:>6.2f}x |")
            summary[(m, k)] = (tot_best, tot_fp16)
            blank = " | ".join(f"{'':>9}" for _ in kernels)
            print(f"| TOTAL  | {k} | {blank} | {tot_fp16:>7.1f} | {'':>9} | {tot_best:>7.1f} | {tot_fp16 / tot_best:>6.2f}x |")
    print("\nSummary: dense TOTAL (" + "+".join(shapes) + ") fp16 / kbit Best")
    print("| M | " + " | ".join(f"k={k}" for k in ks) + " |")
    print("|---|" + "---|" * len(ks))
    for m in ms:
        print(f"| {m} | " + " | ".join(f"{summary[(m, k)][1] / summary[(m, k)][0]:.2f}x" for k in ks) + " |")
    return {
        "fp16_us": {f"{m},{s}": v for (m, s), v in fp16.items()},
        "kbit_us": {f"{m},{s},{k}": v for (m, s, k), v in results.items()},
    }
