"""Small run of every CUDA kernel, for compute-sanitizer (memcheck, racecheck, initcheck).
`python3 scripts/sanitize_ops.py rows` runs only the GEMV's coalesced variant, `... tc` only its
tensor-core M = 1 form."""
import sys

import torch

import kbit
from kbit import ops

# the tensor-core GEMV (gemv_tc_kernel, forced) at M = 1, k = 2..4 on its CTA forms (gateup 5 x 2,
# Q 4 x 2, O 2 x 4, down 2 x 5, KV 1 x 4 warps; k = 3 gateup 2 x 4) and odd shapes; k = 4 with an
# asymmetric codebook too (the full-table path)
if sys.argv[1:] == ["tc"]:
    ops.force_gemv_tc(1)
    for k in (2, 3, 4, 0):
        cb = torch.linspace(-1.0, 1.0, 17)[1:] ** 3 if k == 0 else None
        for n, kdim in ((5120, 2048), (4096, 2048), (2048, 4096), (2048, 5120), (512, 2048), (1040, 4021), (9, 256)):
            t = kbit.repack(kbit.quantize(torch.randn(n, kdim, device="cuda") * 0.1, k=k or 4, codebook=cb))
            for dtype in (torch.float16, torch.bfloat16):
                ops.gemv(torch.randn(1, kdim, device="cuda").to(dtype), t.packed, t.absmax, t.codebook, n, kdim,
                         t.absmax_exponent)
    ops.force_gemv_tc(-1)
    torch.cuda.synchronize()
    print("sanitize_ops: done (tc)")
    sys.exit(0)

# the GEMV's coalesced variant (gemv_rows_kernel) at M = 1, 3 in several CTA shapes (rows, warps,
# row groups; groups at M = 1 only),
# N not a multiple of its rows, K past the last full tile; K = 4500 with 16 rows on 8 warps takes
# rounds of 5 tiles per lane at M = 1
for rows, warps, groups in ((8, 1, 1), (16, 8, 1), (32, 3, 1), (8, 10, 5), (8, 20, 5), (0, 0, 1)):
    ops.force_gemv_rows(rows, warps, groups)
    for k in (2, 3, 4, 5):
        for n, kdim in ((9, 256), (1040, 4021), (1040, 4500)):
            t = kbit.repack(kbit.quantize(torch.randn(n, kdim, device="cuda") * 0.1, k=k))
            for m in (1, 3):
                ops.gemv(torch.randn(m, kdim, device="cuda").half(), t.packed, t.absmax, t.codebook, n, kdim,
                         t.absmax_exponent)
ops.force_gemv_rows(0, 0)
if sys.argv[1:] == ["rows"]:
    print("sanitize_ops: done (rows)")
    sys.exit(0)

for k in (2, 3, 4, 5):
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for fmt in ("e4m4", "fp16", "fp32"):
            for n, kdim in ((1, 1), (3, 33), (5, 100), (9, 256)):
                w = (torch.randn(n, kdim, device="cuda") * 0.1).to(dtype)
                q = kbit.quantize(w, k=k, absmax_format=fmt)
                t = kbit.repack(q)
                u = kbit.unrepack(t)
                for out in (torch.float32, torch.float16, torch.bfloat16):
                    kbit.dequantize(q, out)
                    kbit.dequantize(t, out)
                if dtype != torch.float32:
                    bias = torch.randn(n, device="cuda").to(dtype)
                    args = (t.packed, t.absmax, t.codebook, n, kdim, t.absmax_exponent, bias)
                    for m in (1, 2, 3, 4):
                        ops.gemv(torch.randn(m, kdim, device="cuda").to(dtype), *args)
                    for m in (1, 2, 5, 9, 16):
                        ops.mma(torch.randn(m, kdim, device="cuda").to(dtype), *args)
                    kbit.linear(torch.randn(17, kdim, device="cuda").to(dtype), t, bias)
# mma with few row groups and many k steps per CTA, M <= 8 and M = 9..16
for k in (2, 4):
    for n, kdim in ((40, 2048), (512, 4096)):
        t = kbit.repack(kbit.quantize(torch.randn(n, kdim, device="cuda") * 0.1, k=k))
        for m in (1, 12):
            ops.mma(torch.randn(m, kdim, device="cuda").half(), t.packed, t.absmax, t.codebook,
                    n, kdim, t.absmax_exponent)
# mma's bulk-copy variant (>= 6 row groups per CTA on 132 SMs; K = 320: odd k-tile count)
for k in (3, 4):
    for fmt in ("e4m4", "fp32"):
        t = kbit.repack(kbit.quantize(torch.randn(12288, 320, device="cuda") * 0.1, k=k, absmax_format=fmt))
        for m in (1, 12):
            ops.mma(torch.randn(m, 320, device="cuda").half(), t.packed, t.absmax, t.codebook,
                    12288, 320, t.absmax_exponent)
# mma split over K (2, 4, 8 CTAs adding partial sums through the workspace; each call twice:
# the second reuses the workspace the first left zeroed): NT = 4 and 8, unequal slices (K =
# 4128), and the bulk variant with a split (N = 12288)
for k in (3, 5):
    for n, kdim, ms in ((200, 4128, (12, 17, 40)), (512, 2048, (16, 64)), (12288, 320, (9, 33))):
        t = kbit.repack(kbit.quantize(torch.randn(n, kdim, device="cuda") * 0.1, k=k))
        for S in (2, 4, 8):
            ops.force_mma_ksplit(S)
            for m in ms:
                if ops.mma_ksplit(m, kdim, n, k, "cuda") == S:
                    for _ in range(2):
                        ops.mma(torch.randn(m, kdim, device="cuda").half(), t.packed, t.absmax, t.codebook,
                                n, kdim, t.absmax_exponent)
        ops.force_mma_ksplit(0)
# mma at M = 28 and 56 on model shapes: the slot flush's tiles behind the table, x rows in
# front of it (gateup with a 2-way split, KV with 8)
for k in (2, 4):
    for n, kdim in ((5120, 2048), (512, 2048)):
        t = kbit.repack(kbit.quantize(torch.randn(n, kdim, device="cuda") * 0.1, k=k))
        for m in (28, 56):
            ops.mma(torch.randn(m, kdim, device="cuda").half(), t.packed, t.absmax, t.codebook, n, kdim,
                    t.absmax_exponent)
# mma with its first weights requested before the PDL wait (KBIT_MMA_WEIGHTS_STABLE: the
# second and later calls on unchanged weights), back to back, NT = 1 (M <= 8) on a model shape
# and an odd one, then a write to the weights and the call again (the flag is withheld)
for k in (2, 3, 4, 5):
    for n, kdim in ((2048, 4096), (200, 4128)):
        t = kbit.repack(kbit.quantize(torch.randn(n, kdim, device="cuda") * 0.1, k=k))
        args = (t.packed, t.absmax, t.codebook, n, kdim, t.absmax_exponent)
        for m in (1, 3, 8):
            for _ in range(3):
                ops.mma(torch.randn(m, kdim, device="cuda").half(), *args)
        t.absmax.copy_(t.absmax.clone())
        ops.mma(torch.randn(1, kdim, device="cuda").half(), *args)
# wgmma (compute capability 9.0): every tile width and warpgroup count, split-K clusters (3: a
# split with fewer steps), rows past N (200), a half last k-tile (K = 4128), tokens past the
# CTA's tile, every k and absmax format, k = 5's two codebook tables; every call after a
# tensor set's first takes the early path (KBIT_WEIGHTS_STABLE: the codebook read before the
# PDL wait), the first waits
if ops.wgmma_supports(1, 64, 64, 4, "cuda"):
    for k in (2, 3, 4, 5):
        fmt = ("e4m4", "fp16", "fp32")[k % 3]
        t = kbit.repack(kbit.quantize(torch.randn(200, 4128, device="cuda") * 0.1, k=k, absmax_format=fmt))
        for table in ("narrow", "wide") if k == 5 else ("auto",):  # k = 5: both codebook tables
            for cfg in ((32, 1, 1), (64, 1, 3), (128, 1, 1), (256, 1, 2), (32, 2, 4), (128, 2, 1), (256, 2, 1),
                        (256, 2, 3)):
                ops.force_wgmma_config(*cfg, k5_table=table)
                for m in (5, 70):
                    ops.wgmma(torch.randn(m, 4128, device="cuda").to((torch.float16, torch.bfloat16)[m % 2]),
                              t.packed, t.absmax, t.codebook, 200, 4128, t.absmax_exponent)
        ops.force_wgmma_config()
    # stream-K (forced; N a multiple of the CTA's rows): tails, heads, tiles with several
    # contributors, two token tiles, both warpgroup counts
    for k in (4, 5):
        t = kbit.repack(kbit.quantize(torch.randn(512, 8224, device="cuda") * 0.1, k=k))
        for cfg in ((64, 1, -1), (256, 1, -1), (128, 2, -1)):
            ops.force_wgmma_config(*cfg)
            for m in (5, 70):
                ops.wgmma(torch.randn(m, 8224, device="cuda").half(), t.packed, t.absmax, t.codebook, 512, 8224,
                          t.absmax_exponent)
                assert ops.wgmma_last_streamk(), cfg
        ops.force_wgmma_config()
torch.cuda.synchronize()
print("sanitize_ops: done")
