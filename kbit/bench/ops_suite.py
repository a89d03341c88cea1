"""The "ops" suite of `kbit bench`: dequantize and quantize against the streaming rate."""

from __future__ import annotations

import sys

import torch

import kbit
from kbit import ops

from .timing import copies_for_cold, graph_time_us


def _progress(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


def warm_up(seconds: float = 0.5) -> None:
    """Busy the GPU so its clocks have ramped up before the first measurement."""
    a = torch.randn(4096, 4096, dtype=torch.bfloat16, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    while True:
        for _ in range(20):
            a @ a
        end.record()
        end.synchronize()
        if start.elapsed_time(end) > seconds * 1000:
            return


def reference_rates(repeats: int) -> dict:
    """GB/s of a 1 GiB device copy (read + write) and of an fp16 GEMV on 8192x28672."""
    warm_up()
    n = 2**29  # fp16 elements: 1 GiB
    src = [torch.randn(n, dtype=torch.float16, device="cuda") for _ in range(2)]
    dst = [torch.empty_like(s) for s in src]
    us = graph_time_us(lambda i: dst[i].copy_(src[i]), 2, calls=4, repeats=repeats)
    copy = {"us": us, "gbps": 2 * n * 2 / us / 1e3}
    # the same bytes through an SM kernel (torch.copy_ of one buffer may use a copy engine)
    us = graph_time_us(lambda i: torch.mul(src[i], 1.0, out=dst[i]), 2, calls=4, repeats=repeats)
    elementwise = {"us": us, "gbps": 2 * n * 2 / us / 1e3}
    us = graph_time_us(lambda i: dst[i].fill_(1.0), 2, calls=4, repeats=repeats)
    fill = {"us": us, "gbps": n * 2 / us / 1e3}
    del src, dst
    K, N = 8192, 28672
    w = [torch.randn(N, K, dtype=torch.float16, device="cuda") for _ in range(2)]
    x = torch.randn(1, K, dtype=torch.float16, device="cuda")
    y = [torch.empty(1, N, dtype=torch.float16, device="cuda") for _ in range(2)]
    us = graph_time_us(lambda i: torch.matmul(x, w[i].T, out=y[i]), 2, calls=10, repeats=repeats)
    gemv = {"us": us, "gbps": (N * K * 2 + K * 2 + N * 2) / us / 1e3}
    del w
    torch.cuda.empty_cache()
    return {"copy_1GiB": copy, "elementwise_1GiB": elementwise, "fill_1GiB": fill,
            "fp16_gemv_8192x28672": gemv}


def run_ops(ks: list[int], shapes: dict, repeats: int) -> dict:
    _progress("reference rates")
    rates = reference_rates(repeats)
    stream_rate = rates["fp16_gemv_8192x28672"]["gbps"]
    ew_rate = rates["elementwise_1GiB"]["gbps"]
    for key, label in (("copy_1GiB", "copy_ 1 GiB (read+write)"), ("elementwise_1GiB", "x*1 -> y 1 GiB (read+write)"),
                       ("fill_1GiB", "fill_ 1 GiB (write only)")):
        print(f"{label}: {rates[key]['us']:.1f} us, {rates[key]['gbps']:.0f} GB/s")
    print(f"fp16 GEMV 8192x28672 (M=1, cuBLAS): {rates['fp16_gemv_8192x28672']['us']:.1f} us, "
          f"{stream_rate:.0f} GB/s  <- streaming rate (100%)")
    rows = []
    for name, (K, N) in shapes.items():
        w_half = torch.randn(N, K, dtype=torch.float16, device="cuda") * 0.02
        for k in ks:
            _progress(f"{name} k={k}")
            qw = kbit.repack(kbit.quantize(w_half, k=k))
            in_bytes = qw.packed.numel() * 4 + qw.absmax.numel()
            out_bytes = N * K * 2
            copies = copies_for_cold(in_bytes + out_bytes)
            srcs = [(qw.packed.clone(), qw.absmax.clone()) for _ in range(copies)]
            outs = [torch.empty(N, K, dtype=torch.float16, device="cuda") for _ in range(copies)]
            cb = qw.codebook

            def dq(i):
                ops.dequantize_out(srcs[i][0], srcs[i][1], cb, N, K, "tiled64", 0, outs[i])

            us_dq = graph_time_us(dq, copies, repeats=repeats)
            del srcs, outs
            flat = kbit.quantize(w_half, k=k)
            q_in = N * K * 2
            q_out = flat.packed.numel() * 4 + flat.absmax.numel()
            qcopies = copies_for_cold(q_in + q_out)
            wins = [w_half.clone() for _ in range(qcopies)]
            qouts = [(torch.empty_like(flat.packed), torch.empty_like(flat.absmax)) for _ in range(qcopies)]
            status = torch.zeros(3, dtype=torch.int32, device="cuda")

            def qz(i):
                ops.quantize_out(wins[i], cb, "e4m4", 0, qouts[i][0], qouts[i][1], status)

            us_q = graph_time_us(qz, qcopies, repeats=repeats)
            del wins, qouts
            torch.cuda.empty_cache()
            row = {
                "shape": name, "N": N, "K": K, "k": k,
                "dequant_us": us_dq, "dequant_gbps": (in_bytes + out_bytes) / us_dq / 1e3,
                "quant_us": us_q, "quant_gbps": (q_in + q_out) / us_q / 1e3,
            }
            row["dequant_pct"] = 100 * row["dequant_gbps"] / stream_rate
            row["quant_pct"] = 100 * row["quant_gbps"] / stream_rate
            row["dequant_pct_ew"] = 100 * row["dequant_gbps"] / ew_rate
            rows.append(row)
    print()
    print("dequantize tiled64 -> fp16 and quantize fp16 -> flat/E4M4; cold L2, CUDA-graph replay, median")
    print("GB/s counts bytes read + written; % is of the fp16 GEMV streaming rate, %ew of the x*1 -> y rate")
    hdr = f"| {'shape':6} | {'N':>5} | {'K':>5} | k | {'dequant us':>10} | {'GB/s':>6} | {'%':>5} | {'%ew':>5} | {'quant us':>9} | {'GB/s':>6} | {'%':>5} |"
    print(hdr)
    print("|" + "|".join("-" * (len(c)) for c in hdr.split("|")[1:-1]) + "|")
    for r in rows:
        print(f"| {r['shape']:6} | {r['N']:>5} | {r['K']:>5} | {r['k']} | {r['dequant_us']:>10.1f} | "
              f"{r['dequant_gbps']:>6.0f} | {r['dequant_pct']:>5.1f} | {r['dequant_pct_ew']:>5.1f} | {r['quant_us']:>9.1f} | "
              f"{r['quant_gbps']:>6.0f} | {r['quant_pct']:>5.1f} |")
    return {"rates": rates, "ops": rows}
