"""Does a cell's time depend on how long the GPU was busy before it? (session 33)

`kbit bench` replays each cell's graph twice before timing 15 replays (~3 ms of work per
cell), after ~0.1-1 s of host work (weights, graphs) in which the GPU idles; the SM clock read
after the cells spans 600-1700 MHz (max 1980). This probe times fp16 cuBLAS and kbit's mma
(M = 1, 4, 16; k = 4; gateup, Q, KV) in the bench's graph harness after an idle pause, with
the bench's 2-replay warm-up ("short") and with the same graph replayed for WARM_MS first
("long"), reading the SM clock just before and after the timed replays.

Usage (device, kbit importable): python3 scripts/warmup_probe.py [WARM_MS]
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

import kbit
from kbit import ops
from kbit.bench.linear_suite import DENSE
from kbit.bench.ops_suite import warm_up
from kbit.bench.timing import copies_for_cold, sm_clock_mhz

WARM_MS = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0


def timed(call, n, warm_ms, repeats=15, idle_s=0.3):
    # The capture and the replay loop of kbit.bench.timing._graph_time_us, opened up: the
    # probe needs the idle pause between the capture and the warm-up, a warm-up by time, and
    # the clock read right before the timed replays, none of which that helper exposes.
    calls = max(n, 20)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(n):
            call(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for j in range(calls):
            call(j % n)
    torch.cuda.synchronize()
    time.sleep(idle_s)  # the bench's host work between cells, GPU idle
    if warm_ms <= 0:
        for _ in range(2):
            g.replay()
    else:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        while True:
            for _ in range(4):
                g.replay()
            e.record()
            e.synchronize()
            if s.elapsed_time(e) >= warm_ms:
                break
    torch.cuda.synchronize()
    c0 = sm_clock_mhz(50_000)
    ts = []
    for _ in range(repeats):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1000.0 / calls)
    c1 = sm_clock_mhz(50_000)
    return statistics.median(ts), c0, c1


def main():
    torch.manual_seed(0)
    warm_up()
    sm_clock_mhz()
    print(f"device {torch.cuda.get_device_name()}; long warm-up {WARM_MS:.0f} ms; idle 0.3 s before each")
    print("| M | shape | warm | fp16 us | clk | mma us | clk | fp16/mma |")
    print("|---|---|---|---|---|---|---|---|")
    for name in ["gateup", "Q", "KV"]:
        K, N = DENSE[name]
        w = torch.randn(N, K, dtype=torch.float16, device="cuda") * 0.02
        nw = copies_for_cold(N * K * 2)
        w16 = [w.clone() for _ in range(nw)]
        q = kbit.repack(kbit.quantize(w, k=4))
        nb = q.packed.numel() * 4 + q.absmax.numel() * q.absmax.element_size()
        nq = copies_for_cold(nb)
        packs = [(q.packed.clone(), q.absmax.clone()) for _ in range(nq)]
        for m in [1, 4, 16]:
            x = torch.randn(m, K, dtype=torch.float16, device="cuda")
            y = torch.empty(m, N, dtype=torch.float16, device="cuda")
            for warm in [0, WARM_MS, 0, WARM_MS]:
                f, fc0, fc1 = timed(lambda i: torch.matmul(x, w16[i].T, out=y), nw, warm)
                k_, kc0, kc1 = timed(lambda i: ops.mma_out(x, packs[i][0], packs[i][1], q.codebook, N, K, 0, None, y),
                                     nq, warm)
                tag = "long" if warm > 0 else "short"
                print(f"| {m} | {name} | {tag} | {f:.2f} | {fc0:.0f}-{fc1:.0f} | {k_:.2f} | {kc0:.0f}-{kc1:.0f} | "
                      f"{f / k_:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
