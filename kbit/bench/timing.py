"""Timing rules of DESIGN.md §4: CUDA-graph replays of many back-to-back calls (launch gaps
out), inputs rotated over enough copies to exceed L2 ("cold"), median over repeats."""

from __future__ import annotations

import statistics
import subprocess
from typing import Callable

import torch


def l2_bytes(device=None) -> int:
    props = torch.cuda.get_device_properties(device or torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 50 * 2**20))


def copies_for_cold(bytes_per_copy: int, factor: int = 4, most: int = 64) -> int:
    """How many input copies make one rotation exceed `factor` x L2."""
    need = factor * l2_bytes()
    return max(2, min(most, -(-need // max(1, bytes_per_copy))))


# set_after_fill(True): every timed call is preceded in the graph by a 1-element fill_ (a
# kernel launched without programmatic dependent launch, as a norm or activation kernel of a
# model would be), and the fill's own time is subtracted. Back-to-back calls of one kbit kernel
# may overlap through PDL (csrc/common.cuh); this mode shows what a call gains when its
# predecessor is not a kbit kernel.
_after_fill: torch.Tensor | None = None


def set_after_fill(on: bool) -> None:
    global _after_fill
    _after_fill = torch.empty(1, device="cuda") if on else None


def graph_time_us(call: Callable[[int], None], n_variants: int, calls: int | None = None,
                  repeats: int = 15, warmup: int = 2) -> float:
    """Median µs per call of `call(i)` (i cycles over n_variants) replayed in a CUDA graph
    (minus a preceding fill's time under set_after_fill(True))."""
    if _after_fill is not None:
        fill = _after_fill

        def pair(i: int) -> None:
            fill.fill_(1.0)
            call(i)

        return (_graph_time_us(pair, n_variants, calls, repeats, warmup)
                - _graph_time_us(lambda i: fill.fill_(1.0), n_variants, calls, repeats, warmup))
    return _graph_time_us(call, n_variants, calls, repeats, warmup)


def _graph_time_us(call: Callable[[int], None], n_variants: int, calls: int | None, repeats: int,
                   warmup: int) -> float:
    calls = calls or max(n_variants, 20)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(n_variants):
            call(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for j in range(calls):
            call(j % n_variants)
    for _ in range(warmup):
        graph.replay()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    del graph
    return statistics.median(times)


def sm_clock_mhz(cycles: int = 200_000) -> float:
    """The SM clock right now: a kernel spinning `cycles` SM clock cycles (clock64), timed with
    events (~0.1 ms at 1.98 GHz; the launch latency adds < 1% to the time)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) * 1000.0)


def device_report() -> dict:
    """Device, clocks and versions, recorded with every result."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    info = {
        "device": props.name,
        "sms": props.multi_processor_count,
        "l2_mb": round(l2_bytes() / 2**20, 1),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.limit",
             "--format=csv,noheader", f"--id={torch.cuda.current_device()}"],
            capture_output=True, text=True, timeout=10,
        ).stdout.strip()
        info["nvidia_smi"] = out
    except (OSError, subprocess.SubprocessError):
        info["nvidia_smi"] = "unavailable"
    return info
