// Decode attention that reads each row's cache only up to its own last allowed key: an XLA FFI
// handler for the CPU (star_haiku_xmap.kernels.ragged). One query per row (a decode step).
//
//   q      (B, H, K)    f32   the step's queries (H query heads; H = G * R, grouped-query attention)
//   k, v   (B, G, S, K) f32   the rows' caches (G key/value heads, S slots)
//   allow  (B, S)       pred  the slots each row's query may read (causal, real, in its window)
//   pk, pv (G, P, K)    f32   keys/values of a prefix every row continues (P may be 0)
//   pallow (B, P)       pred  the prefix keys each row may read
//   out    (B, H, K)    f32   softmax(q k^T / sqrt(K)) v over the allowed keys, prefix first
//
// A row reads its cache up to its last allowed slot, not the S slots a dense attention reads.
// Arithmetic is fp32 in a fixed order (built with -ffp-contract=off, no fast-math): a score is
// its 16-lane products summed in a fixed tree (blocks of 16 keys at once), divided by sqrt(K);
// exp is Cephes' expf polynomial (within 2 ulp of the exact value); the weights are summed in 16
// lanes and those in a fixed tree, each weight divided by that sum (as jax.nn.softmax divides),
// and the weighted values summed key by key, the prefix's first.
//
// Speed: a head size that is a multiple of 16 up to 256 is compiled in (the query held in
// registers), and the weighted values of up to 8 heads of a row are summed side by side, each
// head's key by key as above (one head's sum alone waits on each addition's latency). The
// results are those of the one-head-at-a-time loop, bit for bit (docs/performance.md §3.8).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t i16 __attribute__((vector_size(64)));

inline v16 Load(const float* p) {
  v16 x;
  std::memcpy(&x, p, sizeof x);
  return x;
}

inline v16 LoadPart(const float* p, int64_t n) {  // the first n < 16 lanes from p, zeros after
  float lane[16] = {};
  std::memcpy(lane, p, sizeof(float) * n);
  return Load(lane);
}

inline v16 Splat(float x) { return v16{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }

// exp(x) for x <= 0 (scores minus their maximum): the range reduction and degree-5 polynomial of
// Cephes' single-precision expf (S. L. Moshier's Cephes Math Library; the same constants as
// Eigen's and sse_mathfun's cephes_exp_*), with an explicit floor.
inline v16 Exp(v16 x) {
  x = x < Splat(-87.3f) ? Splat(-87.3f) : x;  // below: exp underflows to (nearly) 0
  const v16 fx = x * Splat(1.44269504088896341f) + Splat(0.5f);
  const i16 n0 = __builtin_convertvector(fx, i16);
  const v16 n1 = __builtin_convertvector(n0, v16);
  const v16 n = n1 > fx ? n1 - Splat(1.f) : n1;  // floor
  v16 r = x - n * Splat(0.693359375f);
  r = r - n * Splat(-2.12194440e-4f);
  const v16 r2 = r * r;
  v16 y = Splat(1.9875691500e-4f);
  y = y * r + Splat(1.3981999507e-3f);
  y = y * r + Splat(8.3334519073e-3f);
  y = y * r + Splat(4.1665795894e-2f);
  y = y * r + Splat(1.6666665459e-1f);
  y = y * r + Splat(5.0000001201e-1f);
  y = y * r2 + r + Splat(1.f);
  const i16 e = (__builtin_convertvector(n, i16) + 127) << 23;
  v16 scale;
  std::memcpy(&scale, &e, sizeof scale);
  const v16 out = y * scale;
  return x <= Splat(-87.3f) ? Splat(0.f) : out;
}

// Sums of 16 vectors' lanes, one a lane: a fixed tree of lane-pair additions.
inline v16 Add8(v16 a, v16 b) {  // lanes i and i+8 of a (low half), of b (high half)
  return __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
         __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
}
inline v16 Add4(v16 a, v16 b) {
  return __builtin_shufflevector(a, b, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) +
         __builtin_shufflevector(a, b, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
}
inline v16 Add2(v16 a, v16 b) {
  return __builtin_shufflevector(a, b, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
         __builtin_shufflevector(a, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
}
inline v16 Add1(v16 a, v16 b) {
  return __builtin_shufflevector(a, b, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30) +
         __builtin_shufflevector(a, b, 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
}
// The four levels leave vector i's sum in lane bit-reverse(i): a key's products go in at its
// bit-reversed index, so that lane j ends up holding key j's score.
constexpr int kBitReversed[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
inline v16 LaneSums(const v16* p) {  // lane j: the sum of p[bit-reverse(j)]'s lanes
  const v16 a0 = Add8(p[0], p[1]), a1 = Add8(p[2], p[3]), a2 = Add8(p[4], p[5]), a3 = Add8(p[6], p[7]);
  const v16 a4 = Add8(p[8], p[9]), a5 = Add8(p[10], p[11]), a6 = Add8(p[12], p[13]), a7 = Add8(p[14], p[15]);
  const v16 b0 = Add4(a0, a1), b1 = Add4(a2, a3), b2 = Add4(a4, a5), b3 = Add4(a6, a7);
  const v16 c0 = Add2(b0, b1), c1 = Add2(b2, b3);
  return Add1(c0, c1);
}

typedef uint8_t b16 __attribute__((vector_size(16)));

// Lanes [0, w) of a block of 16 keys' allow flags as a vector mask (-1: allowed), 0 after.
inline i16 Allowed(const bool* allow, int64_t w) {
  b16 bytes = {};
  std::memcpy(&bytes, allow, static_cast<size_t>(w));  // a bool is one byte, 0 or 1
  return __builtin_convertvector(bytes, i16) != 0;
}

// The scores of one query against keys [0, n) of `keys` (n x K), divided by `scale`, into
// `out`; -inf where not allowed. Returns their maximum. KV > 0: K = 16 KV, known when compiled
// (the query's vectors held in registers); KV = 0: any K. A key's score is its products summed
// lane-wise over K's 16-lane vectors in order, then over the lanes in a fixed tree.
template <int KV>
float Scores(const float* q, const float* keys, const bool* allow, int64_t n, int64_t K, float scale, float* out) {
  v16 qv[KV > 0 ? KV : 1];
  for (int c = 0; c < KV; ++c) qv[c] = Load(q + 16 * c);
  v16 prod[16];
  v16 best = Splat(-INFINITY);
  for (int64_t s0 = 0; s0 < n; s0 += 16) {
    const int64_t w = std::min<int64_t>(16, n - s0);
    for (int j = 0; j < 16; ++j) {
      v16 acc = v16{};
      if (j < w) {
        const float* key = keys + (s0 + j) * K;
        if constexpr (KV > 0) {
          acc = qv[0] * Load(key);  // (0 + x differs from x only in a zero's sign: no score changes)
          for (int c = 1; c < KV; ++c) acc += qv[c] * Load(key + 16 * c);
        } else {
          int64_t d = 0;
          for (; d + 16 <= K; d += 16) acc += Load(q + d) * Load(key + d);
          if (d < K) acc += LoadPart(q + d, K - d) * LoadPart(key + d, K - d);
        }
      }
      prod[kBitReversed[j]] = acc;
    }
    const v16 x = LaneSums(prod) / Splat(scale);
    const v16 masked = Allowed(allow + s0, w) ? x : Splat(-INFINITY);
    best = best > masked ? best : masked;
    float lane[16];
    std::memcpy(lane, &masked, sizeof lane);
    std::memcpy(out + s0, lane, sizeof(float) * w);
  }
  float m = -INFINITY;
  for (int j = 0; j < 16; ++j) m = std::max(m, best[j]);
  return m;
}

// Scores [0, nt) of `w` (maximum m) into their softmax: exp(score - m), each divided by the sum.
void Softmax(float* w, int64_t nt, float m) {
  v16 sums = v16{};  // the weights summed in 16 lanes, then the lanes in a fixed tree
  for (int64_t s0 = 0; s0 < nt; s0 += 16) {
    v16 e = Exp(Load(w + s0) - Splat(m));
    if (s0 + 16 > nt) {  // past the last key: no weight
      i16 in;
      for (int j = 0; j < 16; ++j) in[j] = s0 + j < nt ? -1 : 0;
      e = in ? e : v16{};
    }
    std::memcpy(w + s0, &e, sizeof e);
    sums += e;
  }
  const v16 s8 = Add8(sums, sums), s4 = Add4(s8, s8), s2 = Add2(s4, s4), s1 = Add1(s2, s2);
  const v16 total = Splat(s1[0]);
  for (int64_t s0 = 0; s0 < nt; s0 += 16) {
    const v16 p = Load(w + s0) / total;
    std::memcpy(w + s0, &p, sizeof p);
  }
}

// o[h] += sum over keys s < n of w[h][s] values[h][s] for NH heads at once, key by key in order
// for each head (their sums are independent chains, run side by side); a zero weight (a key not
// allowed) adds nothing, whatever its value holds. K = 16 KV.
template <int KV, int NH>
void Accumulate(const float* const* w, const float* const* values, int64_t n, float* const* o) {
  constexpr int64_t K = 16 * KV;
  v16 acc[NH][KV];
  for (int h = 0; h < NH; ++h)
    for (int c = 0; c < KV; ++c) acc[h][c] = Load(o[h] + 16 * c);
  for (int64_t s = 0; s < n; ++s)
    for (int h = 0; h < NH; ++h) {
      const v16 ws = Splat(w[h][s]);
      const i16 live = ws != v16{};
      for (int c = 0; c < KV; ++c) {
        const v16 t = ws * Load(values[h] + s * K + 16 * c);
        acc[h][c] += live ? t : v16{};  // (acc never holds -0, so adding +0 leaves it as it is)
      }
    }
  for (int h = 0; h < NH; ++h)
    for (int c = 0; c < KV; ++c) std::memcpy(o[h] + 16 * c, &acc[h][c], sizeof(v16));
}

// Any K: one head, its 16-lane vectors one after another, then the last lanes one by one.
void AccumulateAny(const float* w, const float* values, int64_t n, int64_t K, float* o) {
  int64_t d = 0;
  for (; d + 16 <= K; d += 16) {
    v16 acc = Load(o + d);
    for (int64_t s = 0; s < n; ++s)
      if (w[s] != 0.f) acc += Splat(w[s]) * Load(values + s * K + d);
    std::memcpy(o + d, &acc, sizeof acc);
  }
  for (; d < K; ++d)
    for (int64_t s = 0; s < n; ++s)
      if (w[s] != 0.f) o[d] += w[s] * values[s * K + d];
}

int64_t LastAllowed(const bool* allow, int64_t n) {  // one past the last true entry
  while (n > 0 && !allow[n - 1]) --n;
  return n;
}

struct Problem {
  int64_t B, H, K, G, S, P, R;
  float scale;
  const float *Q, *Kc, *Vc, *PK, *PV;
  const bool *A, *PA;
  float* O;
};

// Heads [h0, h0 + NH) of row b: each head's scores and softmax, then their weighted values.
template <int KV, int NH>
void Heads(const Problem& p, int64_t b, int64_t h0, int64_t n, int64_t np, float* wbuf) {
  const int64_t nt = np + n, stride = p.P + p.S + 16;
  const float* w[NH];
  const float* pvals[NH];
  const float* vals[NH];
  float* o[NH];
  for (int i = 0; i < NH; ++i) {
    const int64_t h = h0 + i, g = h / p.R;
    float* wh = wbuf + i * stride;
    const float* qv = p.Q + (b * p.H + h) * p.K;
    o[i] = p.O + (b * p.H + h) * p.K;
    std::fill(o[i], o[i] + p.K, 0.f);
    const float m = std::max(Scores<KV>(qv, p.PK + g * p.P * p.K, p.PA + b * p.P, np, p.K, p.scale, wh),
                             Scores<KV>(qv, p.Kc + (b * p.G + g) * p.S * p.K, p.A + b * p.S, n, p.K, p.scale, wh + np));
    Softmax(wh, nt, m);
    w[i] = wh;
    pvals[i] = p.PV + g * p.P * p.K;
    vals[i] = p.Vc + (b * p.G + g) * p.S * p.K;
  }
  if constexpr (KV > 0) {
    Accumulate<KV, NH>(w, pvals, np, o);
    const float* wo[NH];
    for (int i = 0; i < NH; ++i) wo[i] = w[i] + np;
    Accumulate<KV, NH>(wo, vals, n, o);
  } else {
    for (int i = 0; i < NH; ++i) {
      AccumulateAny(w[i], pvals[i], np, p.K, o[i]);
      AccumulateAny(w[i] + np, vals[i], n, p.K, o[i]);
    }
  }
}

// Every row; KV > 0: K = 16 KV, heads in groups of NH (about 8 independent sums in flight).
template <int KV>
void Rows(const Problem& p) {
  constexpr int NH = KV == 0 ? 1 : (KV >= 8 ? 1 : 8 / KV);
  std::vector<float> wbuf(static_cast<size_t>(NH * (p.P + p.S + 16)));
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t n = LastAllowed(p.A + b * p.S, p.S), np = LastAllowed(p.PA + b * p.P, p.P);
    if (n == 0 && np == 0) {  // no key allowed (a padding row): zeros, never read
      std::fill(p.O + b * p.H * p.K, p.O + (b + 1) * p.H * p.K, 0.f);
      continue;
    }
    int64_t h = 0;
    for (; h + NH <= p.H; h += NH) Heads<KV, NH>(p, b, h, n, np, wbuf.data());
    for (; h < p.H; ++h) Heads<KV, 1>(p, b, h, n, np, wbuf.data());
  }
}

ffi::Error RaggedDecodeImpl(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                            ffi::Buffer<ffi::PRED> allow, ffi::Buffer<ffi::F32> pk, ffi::Buffer<ffi::F32> pv,
                            ffi::Buffer<ffi::PRED> pallow, ffi::ResultBuffer<ffi::F32> out) {
  const auto qd = q.dimensions(), kd = k.dimensions(), pd = pk.dimensions();
  if (qd.size() != 3 || kd.size() != 4 || pd.size() != 3)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "ragged_decode: q (B,H,K), k (B,G,S,K), pk (G,P,K)");
  const int64_t B = qd[0], H = qd[1], K = qd[2], G = kd[1], S = kd[2], P = pd[1];
  if (kd[0] != B || kd[3] != K || G <= 0 || H % G != 0 || pd[0] != G || pd[2] != K)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "ragged_decode: mismatched shapes");
  const Problem p{B, H, K, G, S, P, H / G, std::sqrt(static_cast<float>(K)),
                  q.typed_data(), k.typed_data(), v.typed_data(), pk.typed_data(), pv.typed_data(),
                  allow.typed_data(), pallow.typed_data(), out->typed_data()};
  switch (K) {
    case 16: Rows<1>(p); break;
    case 32: Rows<2>(p); break;
    case 64: Rows<4>(p); break;
    case 128: Rows<8>(p); break;
    case 256: Rows<16>(p); break;
    default: Rows<0>(p);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(StarRaggedDecode, RaggedDecodeImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
