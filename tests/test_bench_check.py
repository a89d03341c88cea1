"""`kbit bench`'s output check (kbit/bench/linear_suite.py) on the CPU: a right output passes, a
wrong or unwritten one fails, and the reference weight is kbit.reference's dequantization."""

from types import SimpleNamespace

import torch

import kbit
from kbit import reference as ref
from kbit.bench import linear_suite as ls


def _weight(n=40, kdim=96, k=3):
    w = torch.randn(n, kdim) * 0.1
    q = kbit.repack(kbit.quantize(w, k=k))
    wt = SimpleNamespace(q={k: q}, N=n, K=kdim, _wref={})
    return wt, q


def test_reference_weight_is_the_reference_dequantization():
    wt, q = _weight()
    got = ls._Weights.reference(wt, 3)
    want = ref.dequantize(q.packed, q.absmax, q.codebook, (40, 96), q.layout, q.absmax_exponent, torch.float32)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert ls._Weights.reference(wt, 3) is got  # cached


def test_check_output_passes_right_and_fails_wrong_or_unwritten(capsys):
    wt, _ = _weight()
    w = ls._Weights.reference(wt, 3)
    x = torch.randn(5, 96).half()
    want = x.float() @ w.T
    y = torch.empty(5, 40, dtype=torch.float16)

    def right(i):
        y.copy_(want)  # rounded to fp16 once, as a kernel's output is

    def wrong(i):  # one output row from the wrong weight row
        y.copy_(want)
        y[2] = want[3]

    def partial(i):  # the last column never written
        y[:, :-1] = want[:, :-1]

    checks = {
        (5, "odd", 3, "right"): ls.check_output(right, y, want),
        (5, "odd", 3, "wrong"): ls.check_output(wrong, y, want),
        (5, "odd", 3, "partial"): ls.check_output(partial, y, want),
    }
    assert checks[(5, "odd", 3, "right")] <= 1e-3
    assert checks[(5, "odd", 3, "wrong")] > ls.CHECK_TOL
    assert checks[(5, "odd", 3, "partial")] != checks[(5, "odd", 3, "partial")]  # NaN
    failed = ls.report_checks(checks)
    assert failed == ["5,odd,3,wrong", "5,odd,3,partial"]
    assert "OUTPUT CHECK FAILED in 2 of 3 cells" in capsys.readouterr().err
    assert ls.report_checks({(5, "odd", 3, "right"): checks[(5, "odd", 3, "right")]}) == []
    assert "output check: all 1 kernel cells within" in capsys.readouterr().out
