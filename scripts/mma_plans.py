"""The mma launch plan's K split and workspace per model shape, M and k on this GPU (what
csrc/mma.cu's plan_of picks: kbit_mma_ksplit, kbit_mma_workspace_bytes).
Usage (device): python3 scripts/mma_plans.py [M,M,...]"""
import sys

import torch

from kbit import _lib, ops
from kbit.bench import MODEL_SHAPES

ms = [int(m) for m in sys.argv[1].split(",")] if len(sys.argv) > 1 else [1, 2, 4, 5, 8, 12, 16, 17, 24, 32, 33, 48, 64]
dev = torch.cuda.current_device()
print("| shape | k | " + " | ".join(f"M={m}" for m in ms) + " |  (S, workspace KB)")
for name, (kdim, n) in MODEL_SHAPES.items():
    for k in (2, 3, 4, 5):
        cells = []
        for m in ms:
            s = ops.mma_ksplit(m, kdim, n, k, "cuda")
            ws = _lib._lib.kbit_mma_workspace_bytes(dev, k, m, n, kdim)
            cells.append("-" if s == 0 else f"{s}, {ws // 1024}")
        print(f"| {name} | {k} | " + " | ".join(cells) + " |")
