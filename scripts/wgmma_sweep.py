"""kbit::wgmma per forced configuration (tokens TN, warpgroups WG, K splits) against dequantize +
cuBLAS and fp16 cuBLAS, cold, CUDA-graph timed (device machine).
Usage: python scripts/wgmma_sweep.py [k] [M,M,...] [TN.WG.S[.T],... | auto] [shape,shape,..]
(shapes: the dense ones by default, "big" = 8192 x 28672; T: k = 5 table, 1 narrow, 2 wide;
S = -1: stream-K). The first two columns are automatic without and with stream-K."""
import sys

import torch

import kbit
from kbit import ops
from kbit.bench.linear_suite import DENSE, EXTRA
from kbit.bench.timing import copies_for_cold, graph_time_us

k = int(sys.argv[1]) if len(sys.argv) > 1 else 4
ms = [int(m) for m in (sys.argv[2] if len(sys.argv) > 2 else "16,64,256").split(",")]
forced = sys.argv[3] if len(sys.argv) > 3 else "64.1.1,64.1.4,128.1.1,256.1.1,128.2.1"
shapes = sys.argv[4].split(",") if len(sys.argv) > 4 else list(DENSE)
configs = [(0, 0, 0, "nosk"), (0, 0, 0)] + ([] if forced == "auto" else [tuple(int(v) for v in c.split(".")) for c in forced.split(",")])
# one stream-K workspace for every call, captured ones included (the sweep runs one call at a time)
# (the most any call takes: flags, then per SM 256 exponents and a 128 x 256 fp16 tile)
sms = torch.cuda.get_device_properties(0).multi_processor_count
ops.use_wgmma_workspace(torch.zeros(ops._FLAG_BYTES + sms * (256 * 4 + 128 * 256 * 2), dtype=torch.uint8, device="cuda"))
print("us per call (cold, graph); config = TN.WG.S, 0.0.0 = automatic")
print(f"{'shape':7} {'M':>5} {'fp16':>7} {'dq+cuB':>7} " + " ".join(f"{'.'.join(map(str, c)):>9}" for c in configs).replace("0.0.0.nosk", " auto-noSK"))
for name in shapes:
    K, N = (DENSE | EXTRA)[name]
    w = torch.randn(N, K, dtype=torch.float16, device="cuda") * 0.02
    q = kbit.repack(kbit.quantize(w, k=k))
    packs = [(q.packed.clone(), q.absmax.clone()) for _ in range(copies_for_cold(q.packed.numel() * 4))]
    ws = [w.clone() for _ in range(copies_for_cold(N * K * 2))]
    buf = torch.empty(N, K, dtype=torch.float16, device="cuda")
    for m in ms:
        x = torch.randn(m, K, dtype=torch.float16, device="cuda")
        y = torch.empty(m, N, dtype=torch.float16, device="cuda")
        f16 = graph_time_us(lambda i: torch.matmul(x, ws[i].T, out=y), len(ws))

        def dq(i):
            ops.dequantize_out(packs[i][0], packs[i][1], q.codebook, N, K, "tiled64", 0, buf)
            torch.matmul(x, buf.T, out=y)

        t_dq = graph_time_us(dq, len(packs))
        cells = []
        for cfg in configs:
            nosk = cfg[3:] == ("nosk",)
            ops._wgmma_streamk = not nosk
            ops.force_wgmma_config(*cfg[:3], *[list(ops._K5_TABLES)[t] for t in cfg[3:] if not nosk])
            try:
                cells.append(graph_time_us(
                    lambda i: ops.wgmma_out(x, packs[i][0], packs[i][1], q.codebook, N, K, 0, None, y), len(packs)))
            except RuntimeError:  # e.g. a variant build whose shared memory does not fit
                cells.append(float("nan"))
        ops.force_wgmma_config()
        ops._wgmma_streamk = True
        print(f"{name:7} {m:>5} {f16:>7.1f} {t_dq:>7.1f} " + " ".join(f"{c:>9.1f}" for c in cells))
