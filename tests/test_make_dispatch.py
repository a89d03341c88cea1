"""scripts/make_dispatch.py on synthetic bench results (CPU only): the median pick per cell and
the F@shapes filter that takes only some shapes' cells from a result."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _result(path: Path, times: dict) -> str:
    """A `kbit bench --json` file holding the linear cells {(m, name, k): {column: us}}, fp16
    at 10 us for every (m, name)."""
    kbit_us = {f"{m},{name},{k}": row for (m, name, k), row in times.items()}
    fp16_us = {f"{m},{name}": 10.0 for (m, name, _) in times}
    data = {"info": {"device": "NVIDIA H200"},
            "linear": {"kernels": ["Scalar", "MMA", "WGMMA", "dq+cuBLAS"], "kbit_us": kbit_us, "fp16_us": fp16_us}}
    path.write_text(json.dumps(data))
    return str(path)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "make_dispatch.py"), *args],
                          capture_output=True, text=True, cwd=ROOT)


def _tables(stdout: str) -> dict:
    scope: dict = {}
    exec(stdout, scope)  # the generated module is plain literals
    return scope["TABLES"]


def test_shape_filter_takes_only_the_named_shapes(tmp_path):
    def row(fast, us=1.0):
        return {c: (us if c == fast else 5.0) for c in ("Scalar", "MMA", "WGMMA", "dq+cuBLAS")}

    new = _result(tmp_path / "new.json", {(1, "KV", 4): row("Scalar"), (64, "KV", 4): row("WGMMA")})
    # the old run's KV M = 64 pick is far faster, so it wins the median whenever it counts
    old = _result(tmp_path / "old.json", {(1, "KV", 4): row("MMA"), (64, "KV", 4): row("MMA", 0.1),
                                          (1, "big", 4): row("MMA"), (64, "big", 4): row("WGMMA")})
    res = _run(new, old + "@big")
    assert res.returncode == 0, res.stderr
    table = _tables(res.stdout)["H200"]
    assert table[(512, 2048, 4)] == ((1, "gemv"), (64, "wgmma"))  # the old run's KV cells left out
    assert table[(28672, 8192, 4)] == ((1, "mma"), (64, "wgmma"))  # its big cells taken
    assert "old.json (big only)" in res.stdout
    # without the filter every cell of the old run counts
    both = _tables(_run(new, old).stdout)["H200"]
    assert both[(512, 2048, 4)][-1] == (64, "mma")
    assert both[(28672, 8192, 4)] == ((1, "mma"), (64, "wgmma"))


@pytest.mark.parametrize("suffix, message", [("@nosuch", "unknown shape names"), ("@Q", "measured none of")])
def test_shape_filter_rejects_bad_names(tmp_path, suffix, message):
    path = _result(tmp_path / "r.json", {(1, "KV", 4): {"Scalar": 1.0, "MMA": 2.0, "WGMMA": 3.0, "dq+cuBLAS": 4.0}})
    res = _run(path + suffix)
    assert res.returncode != 0
    assert message in res.stderr


def test_newer_runs_replace_the_cells_they_measure(tmp_path):
    def row(fast, us=1.0):
        return {c: (us if c == fast else 5.0) for c in ("Scalar", "MMA", "WGMMA", "dq+cuBLAS")}

    # three older runs say MMA at M = 1 for down k = 2 and k = 4 (three votes against one newer
    # run's), and WGMMA at M = 64
    old = [_result(tmp_path / f"old{i}.json", {(1, "down", 2): row("MMA"), (1, "down", 4): row("MMA"),
                                               (64, "down", 2): row("WGMMA")}) for i in range(3)]
    # the newer run measured only M = 1, k = 2: Scalar
    new = _result(tmp_path / "new.json", {(1, "down", 2): row("Scalar")})
    res = _run(*old, "--newer", new)
    assert res.returncode == 0, res.stderr
    table = _tables(res.stdout)["H200"]
    assert table[(2048, 5120, 2)] == ((1, "gemv"), (64, "wgmma"))  # M = 1 from the newer run alone
    assert table[(2048, 5120, 4)] == ((1, "mma"),)  # a cell the newer run did not measure: kept
    assert "new.json (newer: its cells replace the others')" in res.stdout
    assert "old0.json (1 cells superseded by --newer)" in res.stdout
    # without --newer the older runs outvote it
    assert _tables(_run(*old, new).stdout)["H200"][(2048, 5120, 2)][0] == (1, "mma")


def test_cells_that_failed_the_output_check_are_not_picked(tmp_path):
    row = {"Scalar": 1.0, "MMA": 2.0, "WGMMA": 3.0, "dq+cuBLAS": 4.0}
    path = _result(tmp_path / "r.json", {(1, "down", 2): row, (1, "down", 4): row})
    data = json.loads(Path(path).read_text())
    data["linear"]["check_failed"] = ["1,down,2,Scalar"]  # fastest, but wrong
    Path(path).write_text(json.dumps(data))
    table = _tables(_run(path).stdout)["H200"]
    assert table[(2048, 5120, 2)] == ((1, "mma"),)
    assert table[(2048, 5120, 4)] == ((1, "gemv"),)


def test_again_takes_the_results_a_table_names(tmp_path):
    def row(fast):
        return {c: (1.0 if c == fast else 5.0) for c in ("Scalar", "MMA", "WGMMA", "dq+cuBLAS")}

    a = _result(tmp_path / "a.json", {(1, "down", 2): row("MMA"), (1, "big", 2): row("MMA")})
    b = _result(tmp_path / "b.json", {(1, "big", 2): row("WGMMA"), (1, "Q", 2): row("MMA")})
    first = _run(a, b + "@big", "--newer", _result(tmp_path / "n.json", {(1, "Q", 2): row("Scalar")}))
    assert first.returncode == 0, first.stderr
    table = tmp_path / "table.py"
    table.write_text(first.stdout)
    # the same results again, found from the table's docstring: the same table
    again = _run("--again", str(table), "--docs", str(tmp_path))
    assert again.returncode == 0, again.stderr
    assert _tables(again.stdout) == _tables(first.stdout)
    # plus a newer run of down: only that cell moves
    newer = _result(tmp_path / "n2.json", {(1, "down", 2): row("Scalar")})
    moved = _tables(_run("--again", str(table), "--docs", str(tmp_path), "--newer", newer).stdout)["H200"]
    assert moved == {**_tables(first.stdout)["H200"], (2048, 5120, 2): ((1, "gemv"),)}
