"""Write kbit/dispatch_table.py from `kbit bench --suite linear --json F` results: for every
measured (shape, k), the fastest kernel at each measured M, as ranges of M.

    python scripts/make_dispatch.py F [F2 ...] > kbit/dispatch_table.py

F@name,name takes only those shapes' cells from F (e.g. the 8192 x 28672 rows, "big", of an
older library's runs where the newer runs measured only the model shapes); the header says so.
Cells whose output check failed in a run (its "check_failed", `kbit bench` since session 62) are
not candidates from that run.
--again TABLE takes the results a generated table names in its docstring (from --docs, default
docs/), so that a refresh passes only the new runs:
    python scripts/make_dispatch.py --again kbit/dispatch_table.py --newer G1 G2 > F
--newer G [G2 ...] are runs of a newer library that measured only some cells (e.g. `--m 1 --k 2,3`
after a change to the M = 1 GEMV): every (M, shape, k) they measure is taken from them alone,
and the other results of their GPU family keep only the cells the newer runs did not measure.

With several results (runs of the same library, on one GPU or several of the same
architecture), a cell's kernel is the one with the highest median speedup over the runs that
measured it, each run's times taken relative to its own fp16 time for that cell (so a run's
clock level does not weigh): one run's noise at a close crossover (M = 4096: wgmma and
dq+cuBLAS within 5%, runs differing by 5-10 us per cell) no longer decides alone.

An M between two measured values takes the kernel measured at the next larger one; an M
past the last entry takes dequantize + cuBLAS ("dq"). The scalar GEMV ("gemv", M <= 4) is a
choice like the others: kbit.linear's eager fast path calls it as directly as mma.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kbit.bench.linear_suite import DENSE, DISPATCH_NAMES as NAMES, EXTRA  # noqa: E402
from kbit.ops import family_of  # noqa: E402


def ranges(best_by_m: dict[int, str]) -> tuple:
    out: list[list] = []
    for m in sorted(best_by_m):
        kernel = best_by_m[m]
        if out and out[-1][1] == kernel:
            out[-1][0] = m
        else:
            out.append([m, kernel])
    while out and out[-1][1] == "dq":  # the default past the table
        out.pop()
    return tuple((m, kernel) for m, kernel in out)


def unmeasured(lin: dict) -> list[str]:
    """Kernel columns a linear-suite result did not time (a `kbit bench --kernels` run, whose
    "best" is not the fastest of all kernels); results from before that option timed all."""
    return [kern for kern in NAMES if kern not in lin.get("kernels", NAMES)]


def pick(runs: list[dict], shapes: dict) -> dict[tuple, dict[int, str]]:
    """{(N, K, k): {M: kernel}} from the runs' "linear" sections: per cell the kernel whose
    median over the runs of fp16_us / kernel_us is highest (runs without the cell skipped)."""
    speedups: dict[tuple, dict[str, list[float]]] = {}
    for lin in runs:
        failed = set(lin.get("check_failed") or ())  # "M,shape,k,column": wrong outputs, never picked
        for key, row in lin["kbit_us"].items():
            m, name, k = key.split(",")
            fp16 = lin["fp16_us"][f"{m},{name}"]
            cell = speedups.setdefault((name, int(m), int(k)), {})
            for kern, us in row.items():
                if kern in NAMES and us and f"{key},{kern}" not in failed:
                    cell.setdefault(kern, []).append(fp16 / us)
    best: dict[tuple, dict[int, str]] = {}
    for (name, m, k), by_kern in speedups.items():
        kdim, n = shapes[name]
        top = max(by_kern, key=lambda kern: statistics.median(by_kern[kern]))
        best.setdefault((n, kdim, k), {})[m] = NAMES[top]
    return best


def sources_of(table: str, docs: str) -> tuple[list[str], list[str]]:
    """The results a generated table was made from, as arguments again: (F[@names] ..., the
    --newer ones), read from its docstring's lines "    NAME.json [(a, b only)] [(...)] (device)"
    and looked up in the directory docs."""
    plain, newer = [], []
    for line in Path(table).read_text().split('"""')[1].splitlines():
        m = re.match(r"    (\S+\.json)(?: \(([^)]*) only\))?", line)
        if m:
            path = str(Path(docs) / m[1])
            if "(newer" in line:
                newer.append(path)
            else:
                plain.append(path + ("@" + m[2].replace(", ", ",") if m[2] else ""))
    return plain, newer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("json", nargs="*")
    p.add_argument("--newer", nargs="+", default=[], metavar="G",
                   help="results of a newer library whose cells replace the others' (same GPU family)")
    p.add_argument("--again", metavar="TABLE", help="also the results TABLE (a generated "
                   "kbit/dispatch_table.py) was made from, with their filters and --newer runs, from --docs")
    p.add_argument("--docs", default="docs", help="where --again finds the results (default docs)")
    p.add_argument("--default", help="the GPU family other GPUs use (default: the first result's)")
    args = p.parse_args()
    if args.again:
        plain, newer = sources_of(args.again, args.docs)
        args.json, args.newer = plain + args.json, newer + args.newer
    if not args.json and not args.newer:
        p.error("no results given")
    runs: dict[str, list] = {}  # family -> [(path, device, linear section)]
    newer: dict[str, set] = {}  # family -> the cells ("M,shape,k") the --newer runs measured
    for arg in args.newer + args.json:
        path, _, only = arg.partition("@")
        data = json.load(open(path))
        lin = data["linear"]
        label = Path(path).name
        if only:
            names = set(only.split(","))
            unknown = names - set(DENSE) - set(EXTRA)
            if unknown:
                sys.exit(f"{arg}: unknown shape names {sorted(unknown)}")
            lin = {**lin, "kbit_us": {key: row for key, row in lin["kbit_us"].items() if key.split(",")[1] in names}}
            if not lin["kbit_us"]:
                sys.exit(f"{arg}: {path} measured none of {sorted(names)}")
            label += f" ({', '.join(sorted(names))} only)"
        missing = unmeasured(lin)
        if missing:
            sys.exit(f"{path} did not measure {missing}: the table needs a run of every kernel")
        device = data.get("info", {}).get("device", "?")
        fam = family_of(device)
        if arg in args.newer:
            newer.setdefault(fam, set()).update(lin["kbit_us"])
            label += " (newer: its cells replace the others')"
        elif newer.get(fam):
            kept = {key: row for key, row in lin["kbit_us"].items() if key not in newer[fam]}
            if len(kept) < len(lin["kbit_us"]):
                label += f" ({len(lin['kbit_us']) - len(kept)} cells superseded by --newer)"
            lin = {**lin, "kbit_us": kept}
        runs.setdefault(fam, []).append((label, device, lin))
    default = args.default or next(iter(runs))
    if default not in runs:
        sys.exit(f"--default {default}: no result from that family (have {sorted(runs)})")
    print('"""Generated by scripts/make_dispatch.py from `kbit bench --suite linear --json F` results;')
    print("do not edit by hand. Regenerate with, on each GPU (two or more runs each):")
    print()
    print("    kbit bench --suite linear --m 1,2,3,4,8,16,24,28,32,48,64,128,256,1024,4096 --json F")
    print("    python scripts/make_dispatch.py F1 F2 ... [--newer G1 G2 ...] > kbit/dispatch_table.py")
    print()
    print("TABLES[family][(N, K, k)] = ((largest M, kernel), ...) in increasing M: the fastest of the")
    print('scalar GEMV, mma, wgmma and dequantize + cuBLAS ("gemv", "mma", "wgmma", "dq") measured at')
    print("that M on GPUs of that family (highest median speedup over the runs); GPUs of other families")
    print("use DEFAULT_FAMILY's table, shapes not in a table DEFAULT. Sources:")
    for fam, group in runs.items():
        ms = sorted({int(key.split(",")[0]) for _, _, lin in group for key in lin["kbit_us"]})
        print(f"{fam} (M = {','.join(map(str, ms))}):")
        for name, device, _ in group:
            print(f"    {name} ({device})")
    print('"""')
    print()
    print("TABLES = {")
    for fam, group in runs.items():
        print(f"    {fam!r}: {{")
        best = pick([lin for _, _, lin in group], {**DENSE, **EXTRA})
        for (n, kdim, k), by_m in sorted(best.items()):
            print(f"        ({n}, {kdim}, {k}): {ranges(by_m)!r},")
        print("    },")
    print("}")
    print(f"DEFAULT_FAMILY = {default!r}")
    print('DEFAULT = ((32, "mma"),)')


if __name__ == "__main__":
    main()
