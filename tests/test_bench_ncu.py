"""`kbit bench --ncu`: reading Nsight Compute's CSV and cutting it into cells (pure Python)."""

import pytest

from kbit.bench.ncu import CLOCK, MARKER, cell_times, parse_ncu_csv

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
          '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def _row(i, name, value, unit="nsecond", metric="gpu__time_duration.sum"):
    return (f'"{i}","7","python3","h","{name}","1","7","(512, 1, 1)","(132, 1, 1)","0","9.0",'
            f'"Command line profiler metrics","{metric}","{unit}","{value}"')


def _csv(rows):
    return "==PROF== Connected to process 7\n==PROF== Profiling \"x\": 0%\n" + HEADER + "\n" + "\n".join(rows) + "\n"


def test_parse_reads_units_separators_clocks_and_order():
    text = _csv([_row(2, "b", "1,500"), _row(2, "b", "1,755,000,000", unit="hz", metric=CLOCK),
                 _row(0, "a", "2.5", unit="usecond"), _row(0, "a", "1.2", unit="ghz", metric=CLOCK),
                 _row(1, "a", "7", metric="sm__warps_active.avg"),
                 _row(3, "c", "9"), _row(3, "c", "9", unit="furlong/s", metric=CLOCK)])
    assert parse_ncu_csv(text) == [(0, "a", 2500.0, 1.2e9), (2, "b", 1500.0, 1.755e9), (3, "c", 9.0, None)]


def test_parse_rejects_missing_header_durations_and_unknown_units():
    with pytest.raises(ValueError, match="header"):
        parse_ncu_csv("==PROF== nothing profiled\n")
    with pytest.raises(ValueError, match="unit"):
        parse_ncu_csv(_csv([_row(0, "a", "1", unit="furlong")]))
    with pytest.raises(ValueError, match="no gpu__time_duration"):
        parse_ncu_csv(_csv([_row(0, "a", "1", unit="hz", metric=CLOCK)]))


def _records(pieces):
    """Kernel records of cells bracketed by markers; pieces: lists of (name, ns)."""
    out, i = [], 0
    for piece in pieces:
        for name, ns in [(MARKER + "(long)", 1.0)] + piece + [(MARKER + "(long)", 1.0)]:
            out.append((i, name, ns, 1.5e9 if name == "gemm" else None))
            i += 1
    return out


def test_cell_times_median_per_call_and_multi_kernel_calls():
    manifest = [{"m": 1, "shape": "Q", "k": 4, "kernel": "MMA", "calls": 3},
                {"m": 1, "shape": "Q", "k": 4, "kernel": "dq+cuBLAS", "calls": 2}]
    one = [("mma_kernel", 4000.0), ("mma_kernel", 9000.0), ("mma_kernel", 5000.0)]
    two = [("dequantize", 1000.0), ("gemm", 2000.0), ("dequantize", 1500.0), ("gemm", 2500.0)]
    got = cell_times(_records([one, two]), manifest)
    assert got[0] == {"us": 5.0, "mhz": None, "kernels": ["mma_kernel"]}
    assert got[1]["us"] == pytest.approx(3.5) and got[1]["kernels"] == ["dequantize", "gemm"]
    assert got[1]["mhz"] == pytest.approx(1500.0)


def test_cell_times_rejects_mismatches():
    manifest = [{"m": 1, "shape": "Q", "k": 4, "kernel": "MMA", "calls": 2}]
    with pytest.raises(ValueError, match="kernels for 2 calls"):
        cell_times(_records([[("a", 1.0), ("b", 1.0), ("a", 1.0)]]), manifest)
    with pytest.raises(ValueError, match="bracketed cells"):
        cell_times(_records([[("a", 1.0), ("a", 1.0)]] * 2), manifest)
    with pytest.raises(ValueError, match="without its end"):
        cell_times(_records([[("a", 1.0), ("a", 1.0)]])[:-1], manifest)


def test_bench_ncu_rejects_after_fill(capsys):
    import argparse

    from kbit import bench

    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    assert bench.run(p.parse_args(["--ncu", "--after-fill"])) == 2
    assert "--after-fill does not apply" in capsys.readouterr().err
