"""`kbit bench --ncu`: kernel-only times of the linear suite, measured by Nsight Compute.

The graph-timed tables of `kbit bench` give what a call costs on a busy stream: its kernels plus
the launch gap to the next one, minus what programmatic dependent launch overlaps. This mode
gives the GPU time of the kernels alone. A child process runs every cell's calls eagerly under

    ncu --clock-control none --cache-control all --metrics gpu__time_duration.sum

so ncu serializes the kernels, flushes L1 and L2 before each one (cold weights and x without
rotating copies) and leaves the GPU's clocks as they are. A cell's time per call is the sum of
the durations of the kernels the call launched (dq+cuBLAS: the dequantize and the GEMM), median
over NCU_CALLS calls. The child brackets each cell's measured calls with a marker kernel
(torch.cuda._sleep's spin kernel) and writes the order of its cells to a manifest; the parent
cuts ncu's kernel list at the markers and pairs the pieces with the manifest.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

NCU_CALLS = 5  # profiled calls per cell (after one unprofiled warm-up call)
MARKER = "spin_kernel"  # the kernel of torch.cuda._sleep, launched by nothing else here
CLOCK = "sm__cycles_elapsed.avg.per_second"  # the SM clock while the kernel ran
_UNIT_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
            "second": 1e9, "s": 1e9}
_UNIT_HZ = {"hz": 1.0, "hertz": 1.0, "khz": 1e3, "mhz": 1e6, "ghz": 1e9, "cycle/second": 1.0,
            "cycle/nsecond": 1e9, "cycle/usecond": 1e6, "cycle/msecond": 1e3}


def parse_ncu_csv(text: str) -> list[tuple[int, str, float, float | None]]:
    """(ID, kernel name, gpu__time_duration in ns, SM clock in Hz or None) per profiled kernel,
    in launch order, from the output of `ncu --csv --metrics gpu__time_duration.sum,CLOCK` (the
    details page: one row per kernel and metric; the lines before the header are ncu's own
    messages)."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID",')), None)
    if start is None:
        raise ValueError("no CSV header (a line starting with \"ID\",) in ncu's output")
    kernels: dict[int, list] = {}
    for r in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        metric, unit = r.get("Metric Name"), (r.get("Metric Unit") or "").strip().lower()
        if metric not in ("gpu__time_duration.sum", CLOCK):
            continue
        value = float(r["Metric Value"].replace(",", ""))
        entry = kernels.setdefault(int(r["ID"]), [r["Kernel Name"], None, None])
        if metric == CLOCK:
            entry[2] = value * _UNIT_HZ[unit] if unit in _UNIT_HZ else None
        elif unit in _UNIT_NS:
            entry[1] = value * _UNIT_NS[unit]
        else:
            raise ValueError(f"unknown unit {unit!r} of gpu__time_duration.sum")
    missing = [i for i, e in kernels.items() if e[1] is None]
    if missing:
        raise ValueError(f"kernels {missing[:5]} have no gpu__time_duration.sum")
    return [(i, e[0], e[1], e[2]) for i, e in sorted(kernels.items())]


def cell_times(records: list[tuple[int, str, float, float | None]], manifest: list[dict]) -> list[dict]:
    """Pairs the kernels between each two markers with the manifest's cells, in order: per cell
    {"us": median per-call µs, "mhz": median SM clock of its kernels (None if ncu gave none),
    "kernels": names of one call's kernels}. A cell whose kernel count is not a multiple of its
    call count (a call launched a different number of kernels) raises."""
    pieces, current = [], None
    for _, name, ns, hz in records:
        if MARKER in name:
            if current is None:
                current = []
            else:
                pieces.append(current)
                current = None
        elif current is not None:
            current.append((name, ns, hz))
    if current is not None or len(pieces) != len(manifest):
        raise ValueError(f"ncu saw {len(pieces)} bracketed cells, the child ran {len(manifest)}"
                         + (" (a start marker without its end)" if current is not None else ""))
    out = []
    for cell, piece in zip(manifest, pieces):
        calls = cell["calls"]
        if not piece or len(piece) % calls:
            raise ValueError(f"cell {cell}: {len(piece)} kernels for {calls} calls")
        per = len(piece) // calls
        times = [sum(ns for _, ns, _ in piece[i * per:(i + 1) * per]) / 1e3 for i in range(calls)]
        clocks = [hz / 1e6 for _, _, hz in piece if hz is not None]
        out.append({"us": statistics.median(times), "mhz": statistics.median(clocks) if clocks else None,
                    "kernels": [n for n, _, _ in piece[:per]]})
    return out


def _child(spec_path: str) -> int:
    """Runs the cells of the spec under ncu (profiling on only around each cell's calls)."""
    import torch

    from .linear_suite import DENSE, EXTRA, EXTRA_MAX_M, _Weights, fp16_call, kbit_calls

    with open(spec_path) as f:
        spec = json.load(f)
    ks, calls, kernels = spec["ks"], spec["calls"], spec["kernels"]
    dense = [s for s in spec["shapes"] if s in DENSE]
    extra = [s for s in spec["shapes"] if s in EXTRA]
    weight_bytes = {}
    print("  .. quantizing the weights", file=sys.stderr, flush=True)
    weights = {name: _Weights(*(DENSE | EXTRA)[name], ks, weight_bytes, name, rotate=False)
               for name in dense + extra}
    manifest = []

    def measure(call, key):
        call(0)  # warm-up, not profiled: lazy loading, workspace allocation
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        torch.cuda._sleep(1000)
        for _ in range(calls):
            call(0)
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        manifest.append(dict(key, calls=calls))

    for m in sorted(spec["ms"]):
        print(f"  .. M={m}", file=sys.stderr, flush=True)
        for name in dense + [e for e in extra if m <= EXTRA_MAX_M]:
            wt = weights[name]
            x = torch.randn(m, wt.K, dtype=torch.float16, device="cuda")
            y = torch.empty(m, wt.N, dtype=torch.float16, device="cuda")
            measure(fp16_call(wt, x, y), {"m": m, "shape": name, "k": None, "kernel": "fp16"})
            for k in ks:
                for col, call in kbit_calls(wt, m, k, x, y, kernels).items():
                    measure(call, {"m": m, "shape": name, "k": k, "kernel": col})
    with open(spec["manifest"], "w") as f:
        json.dump({"cells": manifest, "weight_bytes": [[s, k, b] for (s, k), b in weight_bytes.items()]}, f)
    return 0


def run_ncu(ms: list[int], ks: list[int], shapes: list[str], kernels: list[str]) -> dict | None:
    """Profiles the cells in a child process under ncu, prints the tables in the bench's format
    and returns the results (None, with the reason on stderr, where ncu is missing or fails)."""
    import torch

    from kbit import ops

    from .linear_suite import DENSE, EXTRA, print_tables, tables_json

    ncu = shutil.which("ncu")
    if ncu is None:
        print("--ncu needs Nsight Compute's `ncu` on PATH", file=sys.stderr)
        return None
    with tempfile.TemporaryDirectory(prefix="kbit_ncu_") as tmp:
        spec_path, log_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "ncu.csv")
        manifest_path = os.path.join(tmp, "manifest.json")
        with open(spec_path, "w") as f:
            json.dump({"ms": ms, "ks": ks, "shapes": shapes, "kernels": kernels,
                       "calls": NCU_CALLS, "manifest": manifest_path}, f)
        cmd = [ncu, "--clock-control", "none", "--cache-control", "all", "--profile-from-start", "off",
               "--metrics", "gpu__time_duration.sum," + CLOCK, "--csv", "--print-units", "base",
               "--log-file", log_path, sys.executable, "-m", "kbit.bench.ncu", "--child", spec_path]
        print("profiling under Nsight Compute: " + " ".join(cmd), flush=True)
        rc = subprocess.run(cmd).returncode
        log = ""
        if os.path.exists(log_path):
            with open(log_path) as f:
                log = f.read()
        if rc != 0 or not os.path.exists(manifest_path):
            print(f"ncu run failed (rc {rc}); its output ends:\n" + log[-2000:], file=sys.stderr)
            return None
        with open(manifest_path) as f:
            saved = json.load(f)
    try:
        cells = cell_times(parse_ncu_csv(log), saved["cells"])
    except ValueError as e:  # e.g. no counters permitted: ncu ran the child but profiled nothing
        print(f"--ncu: cannot read ncu's output: {e}; it ends:\n" + log[-2000:], file=sys.stderr)
        return None
    weight_bytes = {(s, k): b for s, k, b in saved["weight_bytes"]}
    results, fp16, names, clocks = {}, {}, {}, {}
    for cell, t in zip(saved["cells"], cells):
        m, shape, k, col = cell["m"], cell["shape"], cell["k"], cell["kernel"]
        if t["mhz"] is not None:
            clocks.setdefault(m, []).append(t["mhz"])
        if col == "fp16":
            fp16[(m, shape)] = t["us"]
        else:
            results.setdefault((m, shape, k), {})[col] = t["us"]
        names[f"{m},{shape},{k},{col}"] = t["kernels"]
    dense = [s for s in shapes if s in DENSE]
    extra = [s for s in shapes if s in EXTRA]

    def title(m):
        clk = sorted(clocks.get(m, []))
        return (f"M={m}: (us per call, kernels only: Nsight Compute's gpu__time_duration, each "
                f"kernel alone after L1 and L2 are flushed; median of {NCU_CALLS} calls; SM clock "
                + (f"{clk[0]:.0f}-{clk[-1]:.0f} MHz, median {clk[len(clk) // 2]:.0f})" if clk
                   else "not reported)"))

    print("\nKernel-only times include what a kernel pays alone on an idle GPU (its start, cold "
          "code and TLB) and none of the overlap of back-to-back launches: they are not the "
          "graph-timed figures and do not compare with them.")
    print_tables(ms, ks, dense, extra, results, fp16, weight_bytes, title,
                 ops.device_family(torch.cuda.current_device()))
    return {
        **tables_json(kernels, results, fp16, weight_bytes),
        "kernel_names": names,
        "sm_clock_mhz": {str(m): v for m, v in clocks.items()},
    }


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        sys.exit(_child(sys.argv[2]))
    print("internal: run through `kbit bench --ncu`", file=sys.stderr)
    sys.exit(2)
