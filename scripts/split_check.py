"""Experiment check (fp16, E4M4; works on AB_ONLY libraries): mma against the reference for
every forced K-slice count the library takes, on the dense model shapes and odd ones (and a
14336-row weight, which runs the bulk-copy variant at small M), M = 1..64, with NaN-poisoned
outputs, each call twice: contiguous x, then the same values as a strided view (the second
call also finds the workspace the first one left zeroed). Prints one line per failure and a
summary line.
Usage (device): KBIT_LIBRARY=lib.so python3 scripts/split_check.py"""
import sys

import torch

import kbit
from kbit import ops
from kbit import reference as ref

torch.manual_seed(0)
shapes = [(5120, 2048), (2048, 5120), (4096, 2048), (2048, 4096), (512, 2048), (200, 4128), (12288, 320),
          (14336, 1024)]
bad = runs = 0
for n, kdim in shapes:
    for k in (2, 3, 4, 5):
        w = torch.randn(n, kdim, device="cuda") * 0.02
        q = kbit.repack(kbit.quantize(w.half(), k=k))
        wd = ref.dequantize(q.packed.cpu(), q.absmax.cpu(), q.codebook.cpu(), q.shape, q.layout,
                            q.absmax_exponent, torch.float32).double()
        for S in (1, 2, 4, 8):
            ops.force_mma_ksplit(S)
            for m in (1, 2, 3, 5, 8, 9, 12, 16, 17, 32, 33, 64):
                if ops.mma_ksplit(m, kdim, n, k, "cuda") != S:  # 0: not an mma call
                    continue
                x = torch.randn(m, kdim, device="cuda").half()
                want = x.cpu().double() @ wd.T
                wide = torch.zeros(m, kdim + 16, dtype=torch.float16, device="cuda")
                wide[:, 8:8 + kdim] = x
                for rep, xr in enumerate((x, wide[:, 8:8 + kdim])):
                    out = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
                    ops.mma_out(xr, q.packed, q.absmax, q.codebook, n, kdim, q.absmax_exponent, None, out)
                    err = ((out.cpu().double() - want).norm() / want.norm()).item()
                    runs += 1
                    if not err <= 2e-3:
                        bad += 1
                        print(f"FAIL n={n} K={kdim} k={k} S={S} M={m} rep={rep} err={err}")
ops.force_mma_ksplit(0)
print(f"split_check: {runs} calls, {bad} failures")
sys.exit(1 if bad else 0)
