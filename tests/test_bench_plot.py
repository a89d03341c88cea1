"""`kbit bench`: the dense-TOTAL speedups `--plot` draws, argument checks (pure Python, no GPU)."""

import pytest

from kbit.bench.linear_suite import DENSE
from kbit.bench.plot import dense_speedups, plot


def _linear(ms, ks):
    fp16, kbit_us = {}, {}
    for m in ms:
        for i, s in enumerate(DENSE):
            fp16[f"{m},{s}"] = 10.0 + i
            for k in ks:
                # two kernels; Best is the smaller one
                kbit_us[f"{m},{s},{k}"] = {"MMA": (10.0 + i) / (k * m), "dq+cuBLAS": 100.0}
    return {"fp16_us": fp16, "kbit_us": kbit_us}


def test_dense_speedups_sums_best_over_the_dense_shapes():
    sp = dense_speedups(_linear([1, 4], [2, 4]))
    assert set(sp) == {2, 4} and set(sp[2]) == {1, 4}
    assert sp[4][1] == pytest.approx(4.0) and sp[2][4] == pytest.approx(8.0)


def test_dense_speedups_skips_incomplete_m():
    lin = _linear([1, 8], [4])
    del lin["kbit_us"][f"8,{list(DENSE)[-1]},4"]
    assert set(dense_speedups(lin)[4]) == {1}


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "s.png"
    plot(dense_speedups(_linear([1, 2, 16], [2, 3])), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_rejects_unknown_kernels(capsys):
    import argparse

    from kbit import bench

    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    assert bench.run(p.parse_args(["--kernels", "MMA,Nope"])) == 2
    assert "choose from Scalar,MMA,WGMMA,dq+cuBLAS" in capsys.readouterr().err


def test_tables_json_keys_are_what_dense_speedups_reads():
    from kbit.bench.linear_suite import tables_json

    fp16 = {(1, s): 10.0 for s in DENSE}
    results = {(1, s, 4): {"MMA": 4.0, "dq+cuBLAS": 20.0} for s in DENSE}
    out = tables_json(["MMA", "dq+cuBLAS"], results, fp16, {(s, 4): 100 for s in DENSE})
    assert out["kernels"] == ["MMA", "dq+cuBLAS"] and out["weight_bytes"]["Q,4"] == 100
    assert dense_speedups(out)[4][1] == pytest.approx(2.5)


def test_picked_totals_follow_the_dispatch_table(monkeypatch, capsys):
    """The second summary sums the cells of the kernels kbit.linear would run (not the fastest
    measured), marks where that is slower than Best, and is left out when a pick was not
    measured."""
    from kbit import dispatch_table
    from kbit.bench.linear_suite import picked_totals, print_tables

    table = {(n, kdim, 4): ((1, "gemv"), (8, "mma")) for kdim, n in DENSE.values()}
    monkeypatch.setattr(dispatch_table, "TABLES", {dispatch_table.DEFAULT_FAMILY: table})
    results = {(m, s, 4): {"Scalar": 3.0, "MMA": 2.0, "dq+cuBLAS": 5.0} for m in (1, 8, 16) for s in DENSE}
    got = picked_totals([1, 8, 16], [4], list(DENSE), results)
    assert got == {(1, 4): 3.0 * len(DENSE), (8, 4): 2.0 * len(DENSE), (16, 4): 5.0 * len(DENSE)}
    assert picked_totals([1], [4], list(DENSE), {(1, s, 4): {"MMA": 2.0} for s in DENSE}) == {}
    fp16 = {(m, s): 10.0 for m in (1, 8, 16) for s in DENSE}
    print_tables([1, 8, 16], [4], list(DENSE), [], results, fp16, {(s, 4): 100 for s in DENSE}, str)
    lines = capsys.readouterr().out.splitlines()
    picked = lines[lines.index(next(x for x in lines if "kbit.linear picks" in x)) + 3:]
    assert picked[:3] == ["| 1 | 3.33x* |", "| 8 | 5.00x |", "| 16 | 2.00x* |"]


def test_tables_without_a_dense_shape(capsys):
    """`kbit bench --shapes big` (no dense shape) prints the big rows and no TOTAL or summary
    (it divided by a zero TOTAL before)."""
    from kbit.bench.linear_suite import print_tables

    results = {(1, "big", k): {"MMA": 40.0 + k, "Scalar": 70.0} for k in (2, 4)}
    print_tables([1], [2, 4], [], ["big"], results, {(1, "big"): 108.0}, {("big", 2): 66e6, ("big", 4): 125e6}, str)
    out = capsys.readouterr().out
    rows = [x for x in out.splitlines() if x.startswith("| big")]
    assert len(rows) == 2 and rows[1].endswith(f"{108.0 / 44.0:>6.2f}x |")
    assert "| TOTAL" not in out and "Summary" not in out and "no dense shape selected" in out
