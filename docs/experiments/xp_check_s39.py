"""fp16 check of x in two phases (AB_ONLY library): model shapes and odd shapes at M = 9..16,
automatic and forced splits (unequal slices: the last slice runs one phase), non-contiguous x."""
import torch, sys
sys.path.insert(0, "tests")
import kbit
from kbit import ops
from kbit import reference as ref
from conftest import random_weight
rng = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,)).item()))
worst = 0.0
cases = [(5120, 2048, (9, 12, 16), 0), (2048, 5120, (9, 12, 16), 0), (4096, 2048, (9, 13, 16), 0),
         (2048, 4096, (10, 16), 0), (512, 2048, (12, 16), 0), (200, 4128, (9, 12, 16), 0),
         (200, 4128, (9, 16), 2), (200, 4128, (11, 16), 4), (64, 4096, (16,), 0), (136, 5120, (9, 16), 0),
         (200, 96, (9, 16), 0), (2049, 4021, (12,), 0)]
n_calls = 0
for k in (2, 3, 4, 5):
    for n, kdim, ms, S in cases:
        q = kbit.repack(kbit.quantize(random_weight(n, kdim, gen=rng, device="cuda", spread=0.5), k=k))
        w = ref.dequantize(q.packed.cpu(), q.absmax.cpu(), q.codebook.cpu(), q.shape, q.layout, q.absmax_exponent, torch.float32)
        ops.force_mma_ksplit(S)
        for m in ms:
            for off in (None, 3, 8):  # contiguous; misaligned (one phase); aligned with a row stride
                if S == 0 and not ops.mma_supports(m, kdim, n, k, "cuda"):
                    continue
                xs = torch.randn(m, kdim + (0 if off is None else 16), generator=rng).half().cuda()
                x = xs if off is None else xs[:, off:off + kdim]
                bias = torch.randn(n, generator=rng).half().cuda()
                out = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
                ops.mma_out(x, q.packed, q.absmax, q.codebook, n, kdim, q.absmax_exponent, bias, out)
                want = ref.linear(x.cpu(), w, bias.cpu()).double()
                err = ((out.cpu().double() - want).norm() / want.norm()).item()
                worst = max(worst, err)
                n_calls += 1
                assert err <= 2e-3, (k, n, kdim, m, S, off, ops.mma_ksplit(m, kdim, n, k, "cuda"), err)
        ops.force_mma_ksplit(0)
torch.cuda.synchronize()
held = [ws for key, ws in ops._workspaces.items() if key[0] == "mma"]
assert all(not ws.any() for ws in held)
print(f"xp_check OK, {n_calls} calls, worst rel err {worst:.2e}")
