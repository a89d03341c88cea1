"""SQNR (dB) of kbit quantization per k: nf codebook, E4M4 vs fp32 absmax, for Gaussian and
Student-t (nu = 4) weights. Runs on the CPU (reference ops) or a GPU. The table in
docs/format.md comes from `python scripts/sqnr.py`."""
import math
import sys

import torch

import kbit

device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
g = torch.Generator().manual_seed(0)
N, K = 1024, 4096
gauss = torch.randn(N, K, generator=g, dtype=torch.float64)
# Student-t(4): normal / sqrt(chi2_4 / 4), chi2_4 = sum of 4 squared normals
chi2 = (torch.randn(4, N, K, generator=g, dtype=torch.float64) ** 2).sum(0)
student = torch.randn(N, K, generator=g, dtype=torch.float64) / torch.sqrt(chi2 / 4)


def sqnr(w: torch.Tensor, k: int, fmt: str) -> float:
    w32 = (w * 0.02).float().to(device)
    d = kbit.dequantize(kbit.quantize(w32, k=k, absmax_format=fmt), torch.float32)
    return 10 * math.log10((w32.double() ** 2).sum() / ((w32.double() - d.double()) ** 2).sum())


print("| k | bits/weight | Gaussian fp32 | Gaussian E4M4 | loss | Student-t(4) fp32 | Student-t(4) E4M4 | loss |")
print("|---|---|---|---|---|---|---|---|")
for k in (2, 3, 4, 5):
    gf, ge = sqnr(gauss, k, "fp32"), sqnr(gauss, k, "e4m4")
    tf, te = sqnr(student, k, "fp32"), sqnr(student, k, "e4m4")
    print(f"| {k} | {k + 0.25:.2f} | {gf:.2f} | {ge:.2f} | {gf - ge:.2f} | {tf:.2f} | {te:.2f} | {tf - te:.2f} |")
