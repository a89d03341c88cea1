"""Check of mma.cu's block-column variant (COLS, M <= 2) on the CPU: one item of 8
mma.sync.m16n8k16 emulated from the PTX ISA's fragment layouts (A: lane (g, c) holds rows g,
g + 8 at k = 2c, 2c + 1, 2c + 8, 2c + 9; B: the same k of column g; D: rows g, g + 8 of columns
2c, 2c + 1), with x in B column 2c' + m only at lane c''s k, the block scales applied to the
lane's own D after the item and the quad's 4 block positions summed, against the direct sum
over blocks of scale * dot(block, x). Prints the largest difference per M (float64 rounding).
Usage: python scripts/cols_emulate.py"""
import numpy as np
rng = np.random.default_rng(0)

def mma(Afr, Bfr):
    # Afr[lane] = dict((row,k)->val); Bfr[lane] = dict((k,col)->val); returns D[16][8]
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for lane in range(32):
        for (r, k), v in Afr[lane].items(): A[r, k] = v
        for (k, n), v in Bfr[lane].items(): B[k, n] = v
    return A @ B

def dfrag(D, lane):
    g, c = lane >> 2, lane & 3
    return [D[g, 2*c], D[g, 2*c+1], D[g+8, 2*c], D[g+8, 2*c+1]]

for M in (1, 2):
    # 16 rows, 4 blocks (positions c) of 32 values; lane (g,c) owns block c of rows g, g+8
    W = rng.standard_normal((16, 4, 32))
    S = rng.random((16, 4)) + 0.5
    X = rng.standard_normal((M, 4, 32))
    # MMA s (0..7), slot u (0..3) -> position inside the block: any bijection works as long as
    # x uses the same one (the kernel's is slot_position); slots 0, 1 are k = 2c, 2c + 1, slots
    # 2, 3 are k = 2c + 8, 2c + 9
    pos = lambda s, u: 4*s + u
    acc = np.zeros((32, 4))
    for s in range(8):
        Afr, Bfr = [], []
        for lane in range(32):
            g, c = lane >> 2, lane & 3
            a = {}
            ks = [2*c, 2*c+1, 2*c+8, 2*c+9]
            for u, k in enumerate(ks):
                a[(g, k)] = W[g, c, pos(s, u)]
                a[(g + 8, k)] = W[g + 8, c, pos(s, u)]
            Afr.append(a)
            tok = g & 1
            ok = tok < M and (g >> 1) == c
            b = {(k, g): (X[tok, c, pos(s, u)] if ok else 0.0) for u, k in enumerate(ks)}
            Bfr.append(b)
        D = mma(Afr, Bfr)
        for lane in range(32):
            acc[lane] += np.array(dfrag(D, lane))  # per item accumulation (unscaled)
    # scale after the item, then quad-reduce
    out = np.zeros((M, 16))
    for lane in range(32):
        g, c = lane >> 2, lane & 3
        sc = [S[g, c], S[g, c], S[g + 8, c], S[g + 8, c]]
        acc[lane] *= sc
    for g in range(8):
        for i in range(4):
            v = sum(acc[4*g + c][i] for c in range(4))
            tok, row = i & 1, g + 8 * (i >> 1)
            if tok < M: out[tok, row] += v
    ref = np.einsum('rcp,rc,mcp->mr', W, S, X)
    err = np.abs(out - ref).max()
    print(f"M = {M}: largest difference {err:.1e}")
    assert err < 1e-9
