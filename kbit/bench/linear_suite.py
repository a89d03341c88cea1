"""The "linear" suite of `kbit bench`: per-M tables in the seeds' format.

Rows (shape, k) over the dense shapes of DESIGN.md §4, columns per kernel (Scalar = the scalar
GEMV for M <= 4; MMA = the tensor-core kernel for M <= 64; WGMMA = the Hopper warpgroup-MMA
GEMM, compute capability 9.0 only; dq+cuBLAS = dequantize into a reused buffer, then cuBLAS),
fp16 cuBLAS, Best (fastest kbit kernel), GB/s of Best (k-bit weight bytes / time), vs fp16 =
fp16 / Best; a TOTAL row per k sums Best and fp16 over the dense shapes. The 8192x28672 weight
("big", K = 8192, N = 28672) is measured for M <= 64 and shown below the TOTAL, not in it. MoE
rows are not measured yet (no grouped kernel). Every time is cold: weights rotated over enough
copies to exceed L2 several times; CUDA-graph replay, median.

Before a kernel's cell is timed, its output is checked once (unless check=False): the output
poisoned with NaN, one call, then its relative Frobenius error against the reference
(kbit.reference.dequantize in float32, product in float64, as the tests) must be <= CHECK_TOL, or the cell is
reported as failed and `kbit bench` exits with status 3 (CHECK_FAILED_STATUS). A timing A/B of a new kernel form thus
also says whether that form computes the right numbers.
"""

from __future__ import annotations

import sys

import torch

import kbit
from kbit import ops
from kbit import reference as ref

from .timing import copies_for_cold, graph_time_us, sm_clock_mhz

DENSE = {"gateup": (2048, 5120), "down": (5120, 2048), "Q": (2048, 4096), "O": (4096, 2048),
         "KV": (2048, 512)}
EXTRA = {"big": (8192, 28672)}  # name: (K, N); not in TOTAL
EXTRA_MAX_M = 64
KERNELS = ["Scalar", "MMA", "WGMMA", "dq+cuBLAS"]
# each column's kernel as kbit/dispatch_table.py names it (scripts/make_dispatch.py reads it too)
DISPATCH_NAMES = {"Scalar": "gemv", "MMA": "mma", "WGMMA": "wgmma", "dq+cuBLAS": "dq"}
# the output check's bound, fp16 x: the tests' bound (tests/test_linear.py says why), ~10x the
# kernels' own rounding (weights rounded to fp16 twice, fp32 sums, the fp16 output) and far below
# what a wrong index, scale or tile produces (~1e-1 and up)
CHECK_TOL = 2e-3
CHECK_FAILED_STATUS = 3  # kbit bench's exit status where a check failed (1 is an uncaught error)


def check_output(call, y, want) -> float:
    """Relative Frobenius error of call(0)'s output y (poisoned with NaN first, so an output
    the kernel does not write fails) against want (float32); NaN where y is not finite."""
    y.fill_(float("nan"))
    call(0)
    got = y.float()
    if not torch.isfinite(got).all():
        return float("nan")
    return ((got - want).norm() / want.norm()).item()


def _progress(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


def floor_us(repeats: int) -> float:
    """µs per call of the smallest kernel (a 1-element fill) in the same graph harness."""
    t = [torch.empty(1, device="cuda") for _ in range(4)]
    return graph_time_us(lambda i: t[i].fill_(1.0), 4, repeats=repeats)


def host_overhead_us(calls: int = 300, reps: int = 5) -> tuple[float, float, float]:
    """Eager kbit.linear at M = 1 on gateup (k = 4): wall µs per call of back-to-back calls, the
    best of `reps` runs of `calls` (host-bound when it exceeds the GPU time); the same for an
    eager fp16 torch.matmul(out=) of that shape, its runs interleaved with kbit's; and kbit's GPU
    time per call in a CUDA graph. The wall times are the host's as much as the code's: H200
    hosts of the same code read 16.7 and 30.8 µs in single runs, best-of-5 sets 18.3-29.0 µs
    within one process (NOTES.md v57), and the host's speed drifted by up to 40% within minutes
    (v59): their ratio is what compares."""
    import time

    K, N = DENSE["gateup"]
    q = kbit.repack(kbit.quantize(torch.randn(N, K, dtype=torch.float16, device="cuda") * 0.02, k=4))
    w = torch.randn(N, K, dtype=torch.float16, device="cuda") * 0.02
    x = torch.randn(1, K, dtype=torch.float16, device="cuda")
    y = torch.empty(1, N, dtype=torch.float16, device="cuda")
    y16 = torch.empty(1, N, dtype=torch.float16, device="cuda")
    calls_of = {"kbit": lambda: kbit.linear(x, q, out=y), "fp16": lambda: torch.matmul(x, w.T, out=y16)}
    for fn in calls_of.values():
        for _ in range(20):
            fn()
    torch.cuda.synchronize()
    wall = dict.fromkeys(calls_of, float("inf"))
    for _ in range(reps):
        for name, fn in calls_of.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            wall[name] = min(wall[name], (time.perf_counter() - t0) / calls * 1e6)
    return wall["kbit"], wall["fp16"], graph_time_us(lambda i: kbit.linear(x, q, out=y), 1)


class _Weights:
    """One shape's cold-rotation copies: fp16 weights and, per k, the k-bit packs (one copy of
    each where rotate is False: under `kbit bench --ncu` Nsight Compute flushes the caches)."""

    def __init__(self, K, N, ks, weight_bytes, name, rotate=True):
        self.K, self.N = K, N
        w = torch.randn(N, K, dtype=torch.float16, device="cuda") * 0.02
        self.nw = copies_for_cold(N * K * 2) if rotate else 1
        self.w16 = [w.clone() for _ in range(self.nw)]
        self.q, self.packs = {}, {}
        for k in ks:
            q = kbit.repack(kbit.quantize(w, k=k))
            weight_bytes[(name, k)] = q.packed.numel() * 4 + q.absmax.numel() * q.absmax.element_size()
            nq = copies_for_cold(weight_bytes[(name, k)]) if rotate else 1
            self.q[k] = q
            self.packs[k] = [(q.packed.clone(), q.absmax.clone()) for _ in range(nq)]
        self.buf = torch.empty(N, K, dtype=torch.float16, device="cuda")
        self._wref = {}

    def reference(self, k):
        """The float32 dequantized weight of pack k (kbit.reference; cached per k)."""
        if k not in self._wref:
            q = self.q[k]
            self._wref[k] = ref.dequantize(q.packed, q.absmax, q.codebook, (self.N, self.K), q.layout,
                                           q.absmax_exponent, torch.float32)
        return self._wref[k]


def fp16_call(wt, x, y):
    """The fp16 cuBLAS reference call of a cell: call(i) uses weight copy i."""
    return lambda i: torch.matmul(x, wt.w16[i].T, out=y)


def kbit_calls(wt, m, k, x, y, kernels):
    """{column: call(i)} of the kbit kernels of `kernels` that run at (shape, M, k), in the
    table's column order; call(i) uses pack copy i. Every cell gets at least one kernel."""
    K, N = wt.K, wt.N
    q, packs = wt.q[k], wt.packs[k]
    e = q.absmax_exponent
    calls = {}
    if "Scalar" in kernels and m <= ops.GEMV_MAX_M:
        calls["Scalar"] = lambda i: ops.gemv_out(x, packs[i][0], packs[i][1], q.codebook, N, K, e, None, y)
    if "MMA" in kernels and ops.mma_supports(m, K, N, k, "cuda"):
        calls["MMA"] = lambda i: ops.mma_out(x, packs[i][0], packs[i][1], q.codebook, N, K, e, None, y)
    if "WGMMA" in kernels and ops.wgmma_supports(m, K, N, k, "cuda"):
        calls["WGMMA"] = lambda i: ops.wgmma_out(x, packs[i][0], packs[i][1], q.codebook, N, K, e, None, y)

    def dq(i):
        ops.dequantize_out(packs[i][0], packs[i][1], q.codebook, N, K, "tiled64", e, wt.buf)
        torch.matmul(x, wt.buf.T, out=y)

    if "dq+cuBLAS" in kernels or not calls:
        calls["dq+cuBLAS"] = dq
    return calls


def _measure_cells(name, wt, m, ks, repeats, results, fp16, clocks, kernels, checks=None):
    """fp16 and every kbit kernel of `kernels` at one (shape, M); the SM clock is read after
    each cell. checks (a dict, or None for no check): (M, shape, k, column) -> the output
    check's relative error (check_output), taken before the cell is timed."""
    x = torch.randn(m, wt.K, dtype=torch.float16, device="cuda")
    y = torch.empty(m, wt.N, dtype=torch.float16, device="cuda")
    fp16[(m, name)] = graph_time_us(fp16_call(wt, x, y), wt.nw, repeats=repeats)
    clk = [sm_clock_mhz()]
    for k in ks:
        row = {}
        want = (x.double() @ wt.reference(k).double().T).float() if checks is not None else None
        for col, call in kbit_calls(wt, m, k, x, y, kernels).items():
            if want is not None:
                checks[(m, name, k, col)] = check_output(call, y, want)
            row[col] = graph_time_us(call, len(wt.packs[k]), repeats=repeats)
            clk.append(sm_clock_mhz())
        results[(m, name, k)] = row
    clocks[(m, name)] = clk


def run_linear(ms: list[int], ks: list[int], shapes: list[str], repeats: int,
               kernels: list[str] = KERNELS, check: bool = True) -> dict:
    results = {}  # (M, shape, k) -> {kernel: us}
    checks = {} if check else None  # (M, shape, k, kernel) -> relative error of its output
    fp16 = {}  # (M, shape) -> us
    weight_bytes = {}  # (shape, k) -> bytes of packed + absmax
    clocks = {}  # (M, shape) -> SM MHz after each cell
    floor = floor_us(repeats)
    sm_clock_mhz()  # the first call loads the spin kernel (read 37 MHz once)
    dense = [s for s in shapes if s in DENSE]
    extra = [s for s in shapes if s in EXTRA]
    _progress("quantizing the weights")
    weights = {name: _Weights(*(DENSE | EXTRA)[name], ks, weight_bytes, name) for name in dense + extra}
    # M ascending, every shape per M: the power-heavy large-M GEMMs run last, so they cannot
    # lower the SM clock of the small-M cells (measured in session 7: +5-16% on M = 1 cells
    # that followed M = 4096 ones); the clock after each cell is recorded and printed.
    for m in sorted(ms):
        _progress(f"M={m}")
        for name in dense + [e for e in extra if m <= EXTRA_MAX_M]:
            _measure_cells(name, weights[name], m, ks, repeats, results, fp16, clocks, kernels, checks)
    del weights
    torch.cuda.empty_cache()
    wall, wall16, gpu = host_overhead_us()
    print(f"\nper-call floor (1-element fill_ in the same CUDA-graph harness): {floor:.2f} us")
    print(f"eager kbit.linear, M=1 gateup k=4, out= given: {wall:.1f} us per call wall-clock, best of 5 x 300 "
          f"(back-to-back, host-bound if above the GPU time), {gpu:.1f} us GPU time (graph, hot); eager fp16 "
          f"torch.matmul(out=) in the same loops: {wall16:.1f} us ({wall / wall16:.2f}x of it)")

    def title(m):
        clk = sorted(c for (mm, _), cs in clocks.items() if mm == m for c in cs)
        return (f"M={m}: (us per call; cold L2; CUDA-graph replay, median; SM clock after each "
                f"cell {clk[0]:.0f}-{clk[-1]:.0f} MHz, median {clk[len(clk) // 2]:.0f})")

    family = ops.device_family(torch.cuda.current_device())
    print_tables(ms, ks, dense, extra, results, fp16, weight_bytes, title, family)
    failed = report_checks(checks) if checks is not None else []
    return {
        **tables_json(kernels, results, fp16, weight_bytes),
        "check_tol": CHECK_TOL if checks is not None else None,
        "check_rel_err": None if checks is None else {  # None: not finite (strict JSON has no NaN)
            ",".join(map(str, key)): (v if v == v else None) for key, v in checks.items()},
        "check_failed": failed,
        "floor_us": floor,
        "eager_linear_m1_wall_us": wall,
        "eager_fp16_matmul_m1_wall_us": wall16,
        "sm_clock_mhz": {f"{m},{s}": v for (m, s), v in clocks.items()},
    }


def report_checks(checks: dict) -> list[str]:
    """Print the output check's outcome; returns the failed cells as "M,shape,k,column"."""
    failed = {key: err for key, err in checks.items() if not err <= CHECK_TOL}  # NaN fails too
    if failed:
        print(f"\nOUTPUT CHECK FAILED in {len(failed)} of {len(checks)} cells (relative error > {CHECK_TOL} "
              f"or not finite; their times above are of wrong results):", file=sys.stderr)
        for key, err in failed.items():
            print(f"  M,shape,k,kernel = {','.join(map(str, key))}: {err:.3g}", file=sys.stderr)
    elif checks:
        worst = max(checks, key=checks.get)
        print(f"\noutput check: all {len(checks)} kernel cells within {CHECK_TOL} of the reference "
              f"(worst {checks[worst]:.1e}: M,shape,k,kernel = {','.join(map(str, worst))})")
    return [",".join(map(str, key)) for key in failed]


def tables_json(kernels, results, fp16, weight_bytes) -> dict:
    """The tables' figures with string keys for --json (what plot.dense_speedups and
    scripts/make_dispatch.py read): "M,shape" -> fp16 µs, "M,shape,k" -> {kernel: µs},
    "shape,k" -> weight bytes."""
    return {
        "kernels": list(kernels),
        "fp16_us": {f"{m},{s}": v for (m, s), v in fp16.items()},
        "kbit_us": {f"{m},{s},{k}": v for (m, s, k), v in results.items()},
        "weight_bytes": {f"{s},{k}": v for (s, k), v in weight_bytes.items()},
    }


def print_tables(ms, ks, dense, extra, results, fp16, weight_bytes, title, family=None) -> None:
    """The per-M tables (title(m) above each), the dense-TOTAL summary of the fastest kernels
    and that of the kernels kbit.linear picks on GPU family `family` (ops.device_family)."""
    summary = {}
    for m in ms:
        print("\n" + title(m))
        hdr = (f"| {'shape':6} | k | " + " | ".join(f"{c:>9}" for c in KERNELS)
               + f" | {'fp16':>7} | {'Best':>9} | {'us':>7} | {'GB/s':>5} | vs fp16 |")
        print(hdr)
        print("|" + "|".join("-" * len(c) for c in hdr.split("|")[1:-1]) + "|")

        def line(name, k, row, f):
            best = min(row, key=row.get)
            cells = " | ".join(f"{row[c]:>9.1f}" if c in row else f"{'-':>9}" for c in KERNELS)
            gbps = weight_bytes[(name, k)] / row[best] / 1e3
            print(f"| {name:6} | {k} | {cells} | {f:>7.1f} | {best:>9} | {row[best]:>7.1f} "
                  f"| {gbps:>5.0f} | {f / row[best]:>6.2f}x |")
            return row[best]

        for k in ks if dense else ():  # no TOTAL rows without a dense shape (--shapes big)
            tot_best = tot_fp16 = 0.0
            for name in dense:
                tot_best += line(name, k, results[(m, name, k)], fp16[(m, name)])
                tot_fp16 += fp16[(m, name)]
            summary[(m, k)] = (tot_best, tot_fp16)
            blank = " | ".join(f"{'':>9}" for _ in KERNELS)
            print(f"| TOTAL  | {k} | {blank} | {tot_fp16:>7.1f} | {'':>9} | {tot_best:>7.1f} "
                  f"| {'':>5} | {tot_fp16 / tot_best:>6.2f}x |")
        for name in extra:
            for k in ks:
                if (m, name, k) in results:
                    line(name, k, results[(m, name, k)], fp16[(m, name)])
    if not dense:
        print("\n(no dense shape selected: no TOTAL rows, no summary)")
        return
    print("\nSummary: dense TOTAL (" + "+".join(dense) + ") fp16 / kbit Best")
    print("| M | " + " | ".join(f"k={k}" for k in ks) + " |")
    print("|---|" + "---|" * len(ks))
    for m in ms:
        print(f"| {m} | " + " | ".join(f"{summary[(m, k)][1] / summary[(m, k)][0]:.2f}x" for k in ks) + " |")
    picked = picked_totals(ms, ks, dense, results, family)
    if picked:
        print(f"\nSummary: dense TOTAL fp16 / the kernels kbit.linear picks (kbit/dispatch_table.py, "
              f"{family or 'default'} table; * where that is not the Best)")
        print("| M | " + " | ".join(f"k={k}" for k in ks) + " |")
        print("|---|" + "---|" * len(ks))
        for m in ms:
            print(f"| {m} | " + " | ".join(
                f"{summary[(m, k)][1] / picked[(m, k)]:.2f}x" + ("*" if picked[(m, k)] > summary[(m, k)][0] else "")
                for k in ks) + " |")


def picked_totals(ms, ks, dense, results, family=None) -> dict:
    """{(M, k): dense TOTAL us of the kernels kbit.linear's dispatch table for GPU family
    `family` picks} from the measured cells (a Hopper GPU: wgmma available), or {} where a pick
    was not measured (a `--kernels` subset)."""
    from kbit.linear import kernel_for

    column = {name: col for col, name in DISPATCH_NAMES.items()}
    totals = {}
    for m in ms:
        for k in ks:
            total = 0.0
            for name in dense:
                kdim, n = DENSE[name]
                us = results[(m, name, k)].get(column[kernel_for(m, n, kdim, k, family)])
                if us is None:
                    return {}
                total += us
            totals[(m, k)] = total
    return totals
