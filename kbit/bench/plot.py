"""`kbit bench --plot PATH`: dense-TOTAL speedup over fp16 cuBLAS vs M, one line per k (PNG,
log-scaled M). Works from a fresh run or, with `--from-json`, from a saved `--json` file (no
GPU needed). Needs matplotlib (the `bench` extra)."""

from __future__ import annotations

from .linear_suite import DENSE


def dense_speedups(linear: dict) -> dict[int, dict[int, float]]:
    """{k: {M: fp16 TOTAL / kbit Best TOTAL}} over the dense shapes, from the linear suite's
    JSON (keys "M,shape" and "M,shape,k"); (M, k) pairs missing a shape are left out."""
    fp16 = {tuple(key.split(",")): us for key, us in linear["fp16_us"].items()}
    best = {tuple(key.split(",")): min(row.values()) for key, row in linear["kbit_us"].items()}
    out: dict[int, dict[int, float]] = {}
    for (m, shape, k) in best:
        if shape != next(iter(DENSE)):
            continue
        try:
            kbit_total = sum(best[(m, s, k)] for s in DENSE)
            fp16_total = sum(fp16[(m, s)] for s in DENSE)
        except KeyError:
            continue
        out.setdefault(int(k), {})[int(m)] = fp16_total / kbit_total
    return out


def plot(speedups: dict[int, dict[int, float]], path: str, title: str = "") -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("--plot needs matplotlib: pip install matplotlib") from e
    if not speedups:
        raise ValueError("no dense-TOTAL results to plot (run the linear suite on all dense shapes)")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k in sorted(speedups):
        ms = sorted(speedups[k])
        ax.plot(ms, [speedups[k][m] for m in ms], marker="o", label=f"k={k}")
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M (tokens)")
    ax.set_ylabel("speedup over fp16 cuBLAS (dense TOTAL)")
    ax.set_title(title or "kbit.linear vs fp16 cuBLAS, cold L2, CUDA graphs")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
