// CPU model of gemv_tc_kernel's data flow (csrc/gemv.cu), lane by lane: prmt, nibble_transpose,
// E4M4 decode, T rounding and the m16n8k16 fragment layout as PTX documents them, against an
// fp64 reference of the same T-rounded weights; every (GR, WG) form, k = 2..4 (k = 4: symmetric
// ascending, asymmetric, symmetric descending codebooks), fp16 / bf16, odd N and K, U forced to 1.
// Written in session 59 (no device) to check the kernel before it ran on a GPU; keep it in step
// with the kernel when either changes. Build and run (CPU only):
//   g++ -O2 -std=c++17 scripts/gemv_tc_emu.cpp -o /tmp/gemv_tc_emu && /tmp/gemv_tc_emu
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cmath>
#include <vector>
#include <random>
#include <algorithm>
using u32 = uint32_t; using u16 = uint16_t;
static bool BF = false;  // T = bf16 if true
static u16 f2t(float f) {
  if (!BF) { _Float16 h = (_Float16)f; u16 b; memcpy(&b, &h, 2); return b; }
  u32 u; memcpy(&u, &f, 4); u32 r = u + 0x7fff + ((u >> 16) & 1); return u16(r >> 16);
}
static float t2f(u16 b) {
  if (!BF) { _Float16 h; memcpy(&h, &b, 2); return (float)h; }
  u32 u = u32(b) << 16; float f; memcpy(&f, &u, 4); return f;
}
static u32 pack(float lo, float hi) { return u32(f2t(lo)) | u32(f2t(hi)) << 16; }
static u32 mul2(u32 a, u32 b) {
  return pack(t2f(a & 0xffff) * t2f(b & 0xffff), t2f(a >> 16) * t2f(b >> 16));
}
static u32 prmt(u32 a, u32 b, u32 c) {
  uint64_t t = (uint64_t(b) << 32) | a; u32 d = 0;
  for (int i = 0; i < 4; i++) {
    u32 s = (c >> (4 * i)) & 0xf; u32 byte = (t >> (8 * (s & 7))) & 0xff;
    if (s & 8) byte = (byte & 0x80) ? 0xff : 0;
    d |= byte << (8 * i);
  }
  return d;
}
static void delta_swap(u32& a, u32& b, int d, u32 mask) { u32 t = ((a >> d) ^ b) & mask; b ^= t; a ^= t << d; }
static void nibble_transpose(u32& n0, u32& n1, u32& n2, u32& n3) {
  delta_swap(n0, n2, 2, 0x33333333u); delta_swap(n1, n3, 2, 0x33333333u);
  delta_swap(n0, n1, 1, 0x55555555u); delta_swap(n2, n3, 1, 0x55555555u);
}
static float e4m4_decode(u32 code) {
  u32 e = code >> 4, m = code & 15u; u32 bits = ((e + 116u) << 23) | (m << 19); float normal; memcpy(&normal, &bits, 4);
  return e ? normal : float(m) * 0x1p-14f;
}
static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Prob { int KB; int64_t N, K, KT; std::vector<u32> packed; std::vector<uint8_t> absmax; std::vector<float> cb; std::vector<u16> x, bias; };

// emulated kernel; returns out as float (T-rounded)
static std::vector<float> run_kernel(const Prob& P_, int KBITS, int GR, int WG, int U, bool vec_x, bool use_bias, float shift_up) {
  const int64_t N = P_.N, K = P_.K, KT = P_.KT;
  const int kTileLen = 68, P = WG * 8;
  std::vector<float> out(N, NAN);
  const int64_t grid = cdiv(N, 8 * GR);
  const int nthreads = 32 * GR * WG;
  bool sym = KBITS == 4;
  if (KBITS == 4) for (int i = 0; i < 8; i++) sym = sym && P_.cb[15 - i] == -P_.cb[i];
  int kPairs = 1 << (KBITS - 1), kTab = 1 << (KBITS - 2);
  for (int64_t bx = 0; bx < grid; bx++) {
    std::vector<u16> xs(KT * kTileLen, 0xDEAD);  // garbage in pads
    for (int tid = 0; tid < nthreads; tid++)
      for (int64_t i = int64_t(tid) * 8; i < KT * 64; i += int64_t(nthreads) * 8) {
        u32 e[8];
        for (int j = 0; j < 8; j++) e[j] = i + j < K ? P_.x[i + j] : 0u;  // vec path identical values
        (void)vec_x;
        u32 wv[4] = {e[0] | e[1] << 16, e[2] | e[3] << 16, e[4] | e[5] << 16, e[6] | e[7] << 16};
        int q8 = int(i & 31) >> 3;
        int64_t dst = (i >> 6) * kTileLen + (i & 32) + 16 * (q8 >> 1) + 2 * (q8 & 1);
        for (int e2 = 0; e2 < 8; e2++) xs[dst + 4 * (e2 & 3) + (e2 >> 2)] = u16(wv[e2 >> 1] >> (16 * (e2 & 1)));
      }
    std::vector<float> red(GR * WG * 8, NAN);
    for (int warp = 0; warp < GR * WG; warp++) {
      const int group = warp / WG, wig = warp - group * WG;
      // per-lane state
      struct Tile { u32 w[2][4]; u32 sb[2]; };
      std::vector<std::vector<std::vector<Tile>>> tile(32, std::vector<std::vector<Tile>>(U, std::vector<Tile>(2)));
      std::vector<std::vector<std::vector<float>>> acc(32, std::vector<std::vector<float>>(U, std::vector<float>(16, 0.f)));
      auto load_round = [&](int lane, int64_t base) {
        int g = lane >> 2, c = lane & 3;
        int64_t n = (bx * GR + group) * 8 + g; bool row_ok = n < N;
        int64_t warp_phase = wig * 8, phase0 = warp_phase + c;
        for (int u = 0; u < U; u++) {
          if (base + u * P >= KT) break;
          for (int p = 0; p < 2; p++) {
            int64_t kt = base + u * P + phase0 + 4 * p; bool ok = row_ok && kt < KT;
            if (base + u * P + warp_phase + 4 * p >= KT) {
              for (int h = 0; h < 2; h++) { for (int b = 0; b < 4; b++) tile[lane][u][p].w[h][b] = 0; tile[lane][u][p].sb[h] = 0; }
              continue;
            }
            int64_t blk = ok ? (kt * N + n) * 2 : 0;
            for (int h = 0; h < 2; h++) {
              for (int b = 0; b < KBITS; b++) tile[lane][u][p].w[h][b] = P_.packed[(blk + h) * KBITS + b];
              for (int b = KBITS; b < 4; b++) tile[lane][u][p].w[h][b] = 0xBADBADu;  // not loaded
              tile[lane][u][p].sb[h] = ok ? P_.absmax[blk + h] : 0;
            }
          }
        }
      };
      for (int64_t base = 0; base < KT; base += P * U) {
        for (int lane = 0; lane < 32; lane++) load_round(lane, base);
        for (int u = 0; u < U; u++) {
          if (base + u * P >= KT) break;
          for (int h = 0; h < 2; h++) {
            // per lane: t, lo, hi
            u32 t[32][2][4], lo[32][2][4], hi[32][2][4]; int64_t xqoff[32];
            bool kSym = KBITS == 4 && sym; int kT = kSym ? 2 : kTab;
            for (int lane = 0; lane < 32; lane++) {
              int g = lane >> 2, c = lane & 3; int64_t phase0 = wig * 8 + c;
              int64_t ktx = base + u * P + phase0 + 4 * (g & 1);
              xqoff[lane] = (ktx < KT ? ktx : 0) * kTileLen;
              u32 cb2[8];
              for (int i = 0; i < kPairs; i++) cb2[i] = pack(16.f * P_.cb[2 * i], 16.f * P_.cb[2 * i + 1]);
              for (int p = 0; p < 2; p++) {
                const Tile& T_ = tile[lane][u][p];
                u32 w3 = KBITS > 3 ? T_.w[h][KBITS - 1] : 0u;
                t[lane][p][0] = T_.w[h][0]; t[lane][p][1] = T_.w[h][1];
                t[lane][p][2] = KBITS > 2 ? T_.w[h][KBITS > 2 ? 2 : 0] : 0u; t[lane][p][3] = w3;
                if (kSym) { for (int b = 0; b < 3; b++) t[lane][p][b] = ~(t[lane][p][b] ^ w3); t[lane][p][3] = ~w3; }
                if (KBITS == 2) {  // the kernel's two-plane form
                  u32 w0 = t[lane][p][0], w1 = t[lane][p][1];
                  u32 z = (w0 & 0x55555555u) | ((w1 << 1) & 0xaaaaaaaau);
                  u32 zo = ((w0 >> 1) & 0x55555555u) | (w1 & 0xaaaaaaaau);
                  t[lane][p][0] = z & 0x33333333u; t[lane][p][1] = zo & 0x33333333u;
                  t[lane][p][2] = (z >> 2) & 0x33333333u; t[lane][p][3] = (zo >> 2) & 0x33333333u;
                } else {
                  nibble_transpose(t[lane][p][0], t[lane][p][1], t[lane][p][2], t[lane][p][3]);
                }
                // e4m4_pair_div16: the code's bits << 6 as fp16 (= value / 16); bf16 via float
                u32 s2 = T_.sb[h] * 0x00400040u;
                if (BF) { _Float16 hf; u16 b = u16(T_.sb[h] << 6); memcpy(&hf, &b, 2); s2 = pack((float)hf, (float)hf); }
                for (int j = 0; j < kT; j++) {
                  int e = kSym ? 4 + 2 * j : 2 * j;
                  u32 e01 = mul2(cb2[e], s2), e23 = mul2(cb2[e + 1], s2);
                  lo[lane][p][j] = prmt(e01, e23, 0x6420u); hi[lane][p][j] = prmt(e01, e23, 0x7531u);
                }
              }
            }
            for (int r = 0; r < 4; r++)
              for (int hf = 0; hf < 2; hf++) {
                u32 A[32][4], B[32][2];
                for (int lane = 0; lane < 32; lane++) {
                  u32 m[2], nb[2];
                  for (int p = 0; p < 2; p++) { m[p] = KBITS > 3 ? t[lane][p][r] & 0x77777777u : t[lane][p][r]; nb[p] = KBITS > 3 ? (t[lane][p][r] >> 1) & 0x44444444u : 0u; }
                  int64_t o = xqoff[lane] + 32 * h + 16 * hf + 4 * r;
                  B[lane][0] = xs[o] | u32(xs[o + 1]) << 16; B[lane][1] = xs[o + 2] | u32(xs[o + 3]) << 16;
                  for (int p = 0; p < 2; p++) {
                    u32 ms = hf ? m[p] >> 16 : m[p]; u32 lb, hb;
                    auto& L = lo[lane][p]; auto& H = hi[lane][p];
                    if (KBITS <= 3) { lb = prmt(L[0], L[kT - 1], ms); hb = prmt(H[0], H[kT - 1], ms); }
                    else if (kSym) { u32 neg = prmt(0u, 0x80808080u, hf ? nb[p] >> 16 : nb[p]); lb = prmt(L[0], L[1], ms); hb = prmt(H[0], H[1], ms) ^ neg; }
                    else { u32 half = (hf ? nb[p] >> 16 : nb[p]) | 0x3210u;
                      lb = prmt(prmt(L[0], L[1], ms), prmt(L[2], L[3], ms), half); hb = prmt(prmt(H[0], H[1], ms), prmt(H[2], H[3], ms), half); }
                    A[lane][p] = prmt(lb, hb, 0x5140u); A[lane][p + 2] = prmt(lb, hb, 0x7362u);
                  }
                }
                // mma m16n8k16 per PTX layout
                float Am[16][16], Bm[16][8];
                for (int lane = 0; lane < 32; lane++) {
                  int g = lane >> 2, c = lane & 3;
                  for (int j = 0; j < 2; j++) {
                    Am[g][2 * c + j] = t2f(A[lane][0] >> (16 * j)); Am[g + 8][2 * c + j] = t2f(A[lane][1] >> (16 * j));
                    Am[g][2 * c + 8 + j] = t2f(A[lane][2] >> (16 * j)); Am[g + 8][2 * c + 8 + j] = t2f(A[lane][3] >> (16 * j));
                    Bm[2 * c + j][g] = t2f(B[lane][0] >> (16 * j)); Bm[2 * c + 8 + j][g] = t2f(B[lane][1] >> (16 * j));
                  }
                }
                int ch = 2 * h + hf;
                for (int lane = 0; lane < 32; lane++) {
                  int g = lane >> 2, c = lane & 3;
                  int rr[4] = {g, g, g + 8, g + 8}, cc[4] = {2 * c, 2 * c + 1, 2 * c, 2 * c + 1};
                  for (int i = 0; i < 4; i++) { float s = 0; for (int k = 0; k < 16; k++) s += Am[rr[i]][k] * Bm[k][cc[i]]; acc[lane][u][ch * 4 + i] += s; }
                }
              }
          }
        }
      }
      for (int lane = 0; lane < 32; lane++) {
        int g = lane >> 2, c = lane & 3; float d = 0;
        for (int u = 0; u < U; u++) for (int ch = 0; ch < 4; ch++) d += acc[lane][u][ch * 4 + 0] + acc[lane][u][ch * 4 + 3];
        if (c == 0) red[warp * 8 + g] = d;
      }
    }
    for (int tid = 0; tid < 8 * GR; tid++) {
      int gg = tid >> 3, r = tid & 7; int64_t row = (bx * GR + gg) * 8 + r; float v = 0;
      for (int w = 0; w < WG; w++) v += red[(gg * WG + w) * 8 + r];
      if (row < N) out[row] = t2f(f2t(v * shift_up + (use_bias ? t2f(P_.bias[row]) : 0.f)));
    }
  }
  return out;
}

int main() {
  std::mt19937_64 rng(1);
  int fails = 0, tests = 0;
  double worst = 0;
  struct Cfg { int gr, wg; };
  Cfg cfgs[] = {{5, 2}, {4, 2}, {2, 4}, {2, 5}, {1, 4}, {1, 8}};
  int64_t Ns[] = {8, 13, 40, 41, 100};
  int64_t Ks[] = {1, 7, 31, 32, 33, 64, 100, 257, 1000, 2048, 2600, 5120};
  for (int bf = 0; bf < 2; bf++)
  for (int KBITS = 2; KBITS <= 4; KBITS++)
  for (int symcb = 0; symcb < (KBITS == 4 ? 3 : 1); symcb++)
  for (auto cfg : cfgs) for (int64_t N : Ns) for (int64_t K : Ks) {
    if ((rng() % 3) != 0 && !(K == 5120 || K == 33)) continue;  // subsample
    BF = bf;
    Prob P; P.N = N; P.K = K; P.KB = int(cdiv(K, 32)); P.KT = cdiv(P.KB, 2);
    int nc = 1 << KBITS; P.cb.resize(nc);
    std::normal_distribution<float> nd(0, 1);
    if (symcb || KBITS < 4) {  // nf-like symmetric sorted
      for (int i = 0; i < nc / 2; i++) P.cb[nc / 2 + i] = (i + 0.5f + 0.1f * i * i) / (nc / 2 + 0.1f * (nc/2-1)*(nc/2-1));
      for (int i = 0; i < nc / 2; i++) P.cb[nc / 2 - 1 - i] = -P.cb[nc / 2 + i];
      if (symcb == 2) std::reverse(P.cb.begin(), P.cb.end());  // descending, still entry 15 - i = -entry i
      if (KBITS < 4 && !symcb) { for (int i = 0; i < nc; i++) P.cb[i] = -1.f + 2.f * i / (nc - 1) + (i == 1 ? 0.03f : 0); }
    } else {
      for (int i = 0; i < nc; i++) P.cb[i] = -1.f + 2.f * i / (nc - 1) + (i == 3 ? 0.05f : 0);  // asym
    }
    P.packed.assign(P.KT * N * 2 * KBITS, 0); P.absmax.assign(P.KT * N * 2, 0);
    std::vector<int> idx(N * P.KT * 64); std::vector<float> scale(N * P.KT * 2);
    for (int64_t kt = 0; kt < P.KT; kt++) for (int64_t n = 0; n < N; n++) for (int j = 0; j < 2; j++) {
      int64_t kb = 2 * kt + j; int64_t blk = (kt * N + n) * 2 + j;
      if (kb >= P.KB) continue;  // missing block zero
      uint8_t code = uint8_t(rng() % 256); P.absmax[blk] = code; scale[n * P.KT * 2 + kb] = e4m4_decode(code);
      for (int i = 0; i < 32; i++) { int v = int(rng() % nc); idx[n * P.KT * 64 + kb * 32 + i] = v;
        for (int b = 0; b < KBITS; b++) P.packed[blk * KBITS + b] |= u32((v >> b) & 1) << i; }
    }
    P.x.resize(K); for (auto& v : P.x) v = f2t(nd(rng));
    P.bias.resize(N); for (auto& v : P.bias) v = f2t(nd(rng));
    int64_t units = cdiv(P.KT, int64_t(cfg.wg) * 8); int U = units <= 1 ? 1 : units == 2 ? 2 : 3;
    for (int U2 : {U, 1}) {
      float shift = 0.5f;
      auto out = run_kernel(P, KBITS, cfg.gr, cfg.wg, U2, true, true, shift);
      tests++;
      for (int64_t n = 0; n < N; n++) {
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < K; k++) {
          float w = t2f(f2t(t2f(f2t(P.cb[idx[n * P.KT * 64 + k]])) * t2f(f2t(scale[n * P.KT * 2 + k / 32]))));
          ref += double(w) * t2f(P.x[k]); mag += fabs(double(w) * t2f(P.x[k]));
        }
        ref = ref * shift + t2f(P.bias[n]);
        double err = fabs(out[n] - ref) / (mag * shift + fabs(ref) + 1e-3);
        worst = std::max(worst, err);
        if (!(err < (bf ? 1e-2 : 2e-3))) { if (fails < 20) printf("FAIL bf%d k%d sym%d gr%d wg%d U%d N%ld K%ld n%ld out %g ref %g\n", bf, KBITS, symcb, cfg.gr, cfg.wg, U2, N, K, n, out[n], ref); fails++; break; }
      }
    }
  }
  printf("tests %d fails %d worst rel %g\n", tests, fails, worst);
}
