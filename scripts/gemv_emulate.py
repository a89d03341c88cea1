"""Check of csrc/gemv.cu's index decode on the CPU: the k bit-planes of random blocks go through
the same nibble transpose, k = 5's byte-wide fields and shuffle-source arithmetic (source lane =
the low 5 bits of the field, lane L holding codebook entry L mod 2^k) as block_dot, against the
direct dot product of codebook[index] and x, for k = 2..5. Usage: python scripts/gemv_emulate.py"""
import numpy as np
rng = np.random.default_rng(1)
M32 = 0xffffffff
def delta_swap(a, b, d, mask):
    t = ((a >> d) ^ b) & mask
    b ^= t; a ^= (t << d) & M32
    return a & M32, b & M32
def nibble_transpose(n0, n1, n2, n3):
    n0, n2 = delta_swap(n0, n2, 2, 0x33333333); n1, n3 = delta_swap(n1, n3, 2, 0x33333333)
    n0, n1 = delta_swap(n0, n1, 1, 0x55555555); n2, n3 = delta_swap(n2, n3, 1, 0x55555555)
    return n0, n1, n2, n3
for k in (2, 3, 4, 5):
    for trial in range(200):
        idx = rng.integers(0, 2**k, 32)
        w = [int(sum(((int(idx[i]) >> b) & 1) << i for i in range(32))) for b in range(k)]
        cbv = rng.standard_normal(2**k)
        lanes = [cbv[L & (2**k - 1)] for L in range(32)]
        shfl = lambda src: lanes[src & 31]
        x = rng.standard_normal(32)
        t = list(nibble_transpose(w[0], w[1], w[2] if k > 2 else 0, w[3] if k > 3 else 0))
        s = 0.0
        for r in range(4):
            if k == 5:
                hi = w[4]
                e = (t[r] & 0x0f0f0f0f) | (((hi >> r) & 0x01010101) << 4)
                o = ((t[r] >> 4) & 0x0f0f0f0f) | (((hi >> (r + 4)) & 0x01010101) << 4)
                for i in range(4):
                    s += shfl(e >> (8 * i)) * x[8 * i + r] + shfl(o >> (8 * i)) * x[8 * i + 4 + r]
            else:
                for j in range(8):
                    s += shfl(t[r] >> (4 * j)) * x[4 * j + r]
        ref = float(np.dot(cbv[idx], x))
        assert abs(s - ref) < 1e-9, (k, trial, s, ref)
    print("k", k, "ok")
