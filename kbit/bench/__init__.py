"""`kbit bench`: the main job. Times the kbit ops on the GPU against the GPU's own ceilings.

Suite "ops" (this version): dequantize (tiled64 -> fp16) and quantize (fp16 -> flat, E4M4) per
k on the model shapes of DESIGN.md §4 plus an 8192x28672 weight, next to the two reference
rates measured in the same run: a large device-to-device copy and an fp16 GEMV (M=1, cuBLAS)
on an 8192x28672 weight, the weight-streaming rate. Every number is cold (inputs and outputs
rotated past L2), CUDA-graph timed, median of repeats.
"""

from __future__ import annotations

import argparse
import json
import sys

MODEL_SHAPES = {  # name: (K, N)
    "gateup": (2048, 5120),
    "down": (5120, 2048),
    "Q": (2048, 4096),
    "O": (4096, 2048),
    "KV": (2048, 512),
    "big": (8192, 28672),
}


DEFAULT_M = "1,2,3,4,8,16,32,64,256,1024,4096"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", default="linear,ops", help="comma-separated suites: linear (per-M "
                   "matmul tables, the main job), ops (dequantize/quantize rates)")
    p.add_argument("--m", default=DEFAULT_M, help=f"M values of the linear suite (default {DEFAULT_M})")
    p.add_argument("--k", default="2,3,4,5", help="comma-separated bit widths (default 2,3,4,5)")
    p.add_argument("--shapes", default=None, help="comma-separated shape names (default: all of the suite)")
    p.add_argument("--kernels", default=None, help="comma-separated kbit kernel columns of the "
                   "linear suite (default all: Scalar,MMA,WGMMA,dq+cuBLAS); fewer for quick A/B runs")
    p.add_argument("--json", metavar="PATH", help="write all results as JSON here")
    p.add_argument("--repeats", type=int, default=15, help="graph replays per measurement")
    p.add_argument("--plot", metavar="PATH", help="PNG of the dense-TOTAL speedup vs M per k "
                   "(needs matplotlib: pip install kbit[bench])")
    p.add_argument("--after-fill", action="store_true", help="precede every timed call (fp16 and "
                   "kbit) by a 1-element fill_, a kernel without programmatic dependent launch, and "
                   "subtract its time: what a call costs after a non-kbit kernel (the default times "
                   "back-to-back calls, which kbit's PDL launches may overlap; KBIT_PDL=0 turns PDL off)")
    p.add_argument("--ncu", action="store_true", help="instead of the graph timing: kernel-only "
                   "times of the linear suite under Nsight Compute (ncu on PATH; caches flushed "
                   "before each kernel, clocks not locked; kbit/bench/ncu.py)")
    p.add_argument("--no-check", action="store_true", help="skip the linear suite's output check "
                   "(each kernel's output against the reference once per cell, before timing it; a "
                   "failed check makes kbit bench exit with status 3)")
    p.add_argument("--from-json", metavar="PATH", help="with --plot: plot a saved --json result "
                   "instead of running (no GPU needed)")


def run(args) -> int:
    if args.from_json:
        if not args.plot:
            print("--from-json needs --plot", file=sys.stderr)
            return 2
        from .plot import dense_speedups, plot

        with open(args.from_json) as f:
            saved = json.load(f)
        lin = saved.get("linear") or saved.get("linear_ncu")
        if lin is None:
            print(f"{args.from_json} has no linear-suite results", file=sys.stderr)
            return 2
        plot(dense_speedups(lin), args.plot, saved.get("info", {}).get("device", ""))
        print(f"wrote {args.plot}")
        return 0
    from .linear_suite import KERNELS

    kernels = args.kernels.split(",") if args.kernels else list(KERNELS)
    if not kernels or any(kern not in KERNELS for kern in kernels):
        print(f"--kernels {args.kernels!r}: choose from {','.join(KERNELS)}", file=sys.stderr)
        return 2
    if args.ncu and args.after_fill:
        print("--ncu times each kernel alone; --after-fill does not apply", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("kbit bench needs a CUDA GPU; none is visible to PyTorch.", file=sys.stderr)
        return 2
    import kbit

    if not kbit.native_available():
        print(f"kbit bench needs the native CUDA library: {kbit.native_status()}", file=sys.stderr)
        return 2
    from .linear_suite import CHECK_FAILED_STATUS, DENSE, EXTRA, run_linear
    from .ops_suite import run_ops
    from .timing import device_report, set_after_fill

    ks = [int(x) for x in args.k.split(",")]
    suites = [s for s in args.suite.split(",") if s]
    info = device_report()
    print(f"device: {info['device']} ({info['sms']} SMs, L2 {info['l2_mb']} MB); "
          f"torch {info['torch']}, CUDA {info['cuda']}, kbit {kbit.__version__}")
    print(f"nvidia-smi (driver, sm clock, mem clock, max sm clock, power limit): {info['nvidia_smi']}")
    info["pdl"] = kbit._lib._lib.kbit_pdl_mode()  # KBIT_PDL as the library read it (default 1)
    info["after_fill"] = bool(args.after_fill)
    info["ncu"] = bool(args.ncu)
    print(f"PDL mode of gemv, mma and wgmma (KBIT_PDL): {info['pdl']}; "
          + ("each kernel alone under ncu" if args.ncu
             else "every call timed after a 1-element fill_ (its time subtracted)" if args.after_fill
             else "back-to-back calls"))
    set_after_fill(args.after_fill)
    result = {"info": info}
    linear_shapes = args.shapes.split(",") if args.shapes else list(DENSE) + list(EXTRA)
    unknown = [s for s in linear_shapes if s not in DENSE and s not in EXTRA]
    if unknown and (args.ncu or "linear" in suites):
        print(f"unknown shapes {unknown}; choose from {list(DENSE) + list(EXTRA)}", file=sys.stderr)
        return 2
    if args.ncu:
        from .ncu import run_ncu

        lin = run_ncu([int(m) for m in args.m.split(",")], ks, linear_shapes, kernels)
        if lin is None:
            return 1
        result["linear_ncu"] = lin
        return _finish(args, result, lin, info)
    from .ops_suite import warm_up

    warm_up()
    # ops first: its reference rates (the fp16 GEMV streaming rate that dequantize is measured
    # against) are taken before the linear suite's large-M GEMMs heat the GPU (after them the
    # same GEMV took 170 instead of 162 us on the H100, which would flatter dequantize).
    if "ops" in suites:
        shapes = args.shapes.split(",") if args.shapes else list(MODEL_SHAPES)
        shapes = [s for s in shapes if s in MODEL_SHAPES]
        result["ops"] = run_ops(ks, {s: MODEL_SHAPES[s] for s in shapes}, args.repeats)
    if "linear" in suites:
        result["linear"] = run_linear([int(m) for m in args.m.split(",")], ks, linear_shapes,
                                      args.repeats, kernels, check=not args.no_check)
    rc = _finish(args, result, result.get("linear"), info)
    return CHECK_FAILED_STATUS if result.get("linear", {}).get("check_failed") else rc


def _finish(args, result: dict, linear: dict | None, info: dict) -> int:
    """--plot of the linear tables (graph-timed or --ncu), --json of everything."""
    if args.plot and linear is not None:
        from .plot import dense_speedups, plot

        try:
            plot(dense_speedups(linear), args.plot, info["device"])
            print(f"wrote {args.plot}")
        except (RuntimeError, ValueError) as e:  # no matplotlib, or not all dense shapes run
            print(f"--plot: {e}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.json}")
    return 0
