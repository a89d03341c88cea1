"""Small quantize runs over every k, dtype and absmax format (for compute-sanitizer)."""
import torch

import kbit
from kbit import reference as ref

g = torch.Generator().manual_seed(0)
for dtype in (torch.float16, torch.bfloat16, torch.float32):
    for k in (2, 3, 4, 5):
        for fmt in ("e4m4", "fp16", "fp32"):
            for n, kd in ((3, 33), (17, 4128), (64, 512)):
                w = (torch.randn(n, kd, generator=g) * 0.02).to(dtype)
                q = kbit.quantize(w.cuda(), k=k, absmax_format=fmt)
                r = kbit.quantize(w, k=k, absmax_format=fmt)
                ok = torch.equal(q.packed.cpu(), r.packed) and torch.equal(q.absmax.cpu(), r.absmax)
                if not ok:
                    print("MISMATCH", dtype, k, fmt, n, kd)
print("quant smoke done")
