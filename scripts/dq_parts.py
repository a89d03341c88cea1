"""Where a dequantize + cuBLAS call's time goes (device machine; NOTES.md v40).

Per shape (k = 4 by default): the quantized weights rotated cold as in `kbit bench`, the fp16
buffer reused (as kbit.linear's dq path does). Prints, in us per call (CUDA-graph replay,
median): dq (dequantize into the reused buffer alone), mm_hot (cuBLAS on the buffer, no
dequantize: the buffer stays in L2), dq+mm (both, the bench's dq+cuBLAS cell), fp16 (cuBLAS on
cold fp16 weights), and two ceilings for the dequantize: zero_ (a write-only kernel over the
reused buffer) and copy (the reused buffer from an L2-resident source of the same size).
Usage: python3 scripts/dq_parts.py [--m 256,1024] [--k 4] [--shapes gateup,down]
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
    p.add_argument("--m", default="256,1024")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--shapes", default="gateup,down,O")
    a = p.parse_args()
    torch.manual_seed(0)
    print("| shape | M | dq | mm_hot | dq+mm | fp16 | zero_ | copy | dq GB/s (in+out) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in a.shapes.split(","):
        N, K = SHAPES[name]
        w = torch.randn(N, K, dtype=torch.float16, device="cuda") * 0.02
        q = kbit.repack(kbit.quantize(w, k=a.k))
        qbytes = q.packed.numel() * 4 + q.absmax.numel() * q.absmax.element_size()
        packs = [(q.packed.clone(), q.absmax.clone()) for _ in range(copies_for_cold(qbytes))]
        nw = copies_for_cold(N * K * 2)
        w16 = [w.clone() for _ in range(nw)]
        buf = torch.empty(N, K, dtype=torch.float16, device="cuda")
        src = torch.randn(N, K, dtype=torch.float16, device="cuda")

        def dq(i):
            ops.dequantize_out(packs[i][0], packs[i][1], q.codebook, N, K, "tiled64", 0, buf)

        t_dq = graph_time_us(dq, len(packs))
        t_zero = graph_time_us(lambda i: buf.zero_(), 1)
        t_copy = graph_time_us(lambda i: buf.copy_(src), 1)
        for m in [int(v) for v in a.m.split(",")]:
            x = torch.randn(m, K, dtype=torch.float16, device="cuda")
            y = torch.empty(m, N, dtype=torch.float16, device="cuda")
            t_mm = graph_time_us(lambda i: torch.matmul(x, buf.T, out=y), 1)

            def both(i):
                dq(i)
                torch.matmul(x, buf.T, out=y)

            t_both = graph_time_us(both, len(packs))
            t_fp16 = graph_time_us(lambda i: torch.matmul(x, w16[i].T, out=y), nw)
            gbps = (qbytes + N * K * 2) / t_dq / 1e3
            print(f"| {name} | {m} | {t_dq:.1f} | {t_mm:.1f} | {t_both:.1f} | {t_fp16:.1f} | "
                  f"{t_zero:.1f} | {t_copy:.1f} | {gbps:.0f} |")


if __name__ == "__main__":
    main()
