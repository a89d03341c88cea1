"""The latency chain of one mma CTA: M = 1 calls on weights of N = 16..64 rows (one CTA, split-K
off) with K growing, weights hot in L2, in the bench's graph harness. K = 2048 gives each of
the 16 warps one item (16 rows x 128 k); every further 2048 of K adds one item per warp. The
intercept is what a CTA costs besides its items (launch, prologue, epilogue); the slope what
one round of items costs an SM. Compare with a 1-element fill_ (the harness's per-call floor).
Run on the device:  python scripts/cta_latency.py
"""

import torch

import kbit
from kbit import ops
from kbit.bench.timing import graph_time_us


def main() -> None:
    one = torch.empty(1, device="cuda")
    print(f"1-element fill_: {graph_time_us(lambda i: one.fill_(1.0), 1):.2f} us per call")
    Ks = (2048, 4096, 6144, 8192, 16384)
    print("| k | N | " + " | ".join(f"K={K}" for K in Ks) + " |")
    print("|---|---|" + "---|" * len(Ks))
    for k in (2, 4):
        for N in (16, 32, 64):
            row = []
            for K in Ks:
                q = kbit.repack(kbit.quantize(torch.randn(N, K, dtype=torch.float16, device="cuda"), k=k))
                x = torch.randn(1, K, dtype=torch.float16, device="cuda")
                y = torch.empty(1, N, dtype=torch.float16, device="cuda")
                ops.force_mma_ksplit(1)  # one CTA over all of K
                try:
                    t = graph_time_us(lambda i: ops.mma_out(x, q.packed, q.absmax, q.codebook, N, K, 0, None, y), 1)
                finally:
                    ops.force_mma_ksplit(0)
                row.append(f"{t:.2f}")
            print(f"| {k} | {N} | " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
