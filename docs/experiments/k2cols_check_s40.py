"""fp16 check of mma at k = 2 with the 16-column table (AB_ONLY library, fp16 + E4M4 only):
model and odd shapes, M = 1..64 (register ring NT = 1..8, the bulk variant on the 14336-row
weight, automatic K splits), contiguous and strided x, against the fp32 reference."""
import sys

import torch

sys.path.insert(0, "tests")
import kbit
from kbit import ops
from kbit import reference as ref
from conftest import random_weight

rng = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,)).item()))
worst, n_calls = 0.0, 0
shapes = [(5120, 2048), (2048, 5120), (4096, 2048), (2048, 4096), (512, 2048), (200, 4128),
          (14336, 1024), (136, 5120), (200, 96)]
for k in (2, 4):
    for n, kdim in shapes if k == 2 else shapes[:3]:
        q = kbit.repack(kbit.quantize(random_weight(n, kdim, gen=rng, device="cuda", spread=0.5), k=k))
        w = ref.dequantize(q.packed.cpu(), q.absmax.cpu(), q.codebook.cpu(), q.shape, q.layout,
                           q.absmax_exponent, torch.float32)
        for m in (1, 2, 3, 4, 5, 8, 9, 12, 16, 17, 24, 32, 33, 48, 64):
            if not ops.mma_supports(m, kdim, n, k, "cuda"):
                continue
            for off in (None, 8):
                xs = torch.randn(m, kdim + (0 if off is None else 16), generator=rng).half().cuda()
                x = xs if off is None else xs[:, off:off + kdim]
                out = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
                ops.mma_out(x, q.packed, q.absmax, q.codebook, n, kdim, q.absmax_exponent, None, out)
                want = ref.linear(x.cpu(), w, None).double()
                err = ((out.cpu().double() - want).norm() / want.norm()).item()
                worst = max(worst, err)
                n_calls += 1
                assert err <= 2e-3, (k, n, kdim, m, off, err)
torch.cuda.synchronize()
print(f"k2cols_check OK, {n_calls} calls, worst rel err {worst:.2e}")
