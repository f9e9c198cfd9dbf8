// CPU kernels of the JAX engine's decode path (XLA FFI custom calls; built and loaded by __init__.py here).
//
// Why: decoding a few tokens is bound by reading the weights once per step, and XLA:CPU's dot for an
// [M<=32, K] x [K, N] product reads them at 4-5 GB/s (it packs the weight into panels on every call);
// this machine streams ~15-25 GB/s. The weights are packed once, at weight load, into NB-column panels
// ([ceil(N/NB), K, NB], each panel contiguous; NB = HRL_PANEL, set from Python's PANEL), and each kernel
// streams every panel exactly once per call with a software prefetch ahead of it, keeping up to 6 rows x NB
// columns of fp32 accumulators in AVX2 registers. fp32 in, fp32 accumulate, fp32 out: the same math as the XLA path (summation order differs).
//
// Three targets:
//   hrl_matmul(x[..., K], w_panels[P, K, NB]) -> y[..., N]           (N from the result shape, N <= NB P)
//   hrl_moe(x[T, D], ids[T, Kt], gates[T, Kt], gate_up[E, 2, Pi, D, NB], down[E, Pd, I, NB]) -> y[T, D]
//     = sum_k gates[t,k] * (silu(x[t] @ Wg[e]) * (x[t] @ Wu[e])) @ Wd[e],  e = ids[t,k]
//     Only the experts some token picked are read (the dropless top-k MoE of moe.py, by expert).
//   hrl_attend(q[B,T,H,D], ctx_k/v[B,Kv,L,D], ctx_len[B], new_k/v[B,Kv,N,D], mask[B,T,N]) -> o[B,T,H,D]
//     research/models/decode.py's `_attend` (GQA; keys: the first ctx_len[b] cached positions + the buffer where mask).
// Work is split over XLA's intra-op thread pool (by panels for matmul, by expert for moe).

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

#ifndef HRL_PANEL
#error "build with -DHRL_PANEL=<PANEL>: the panel width has one source of truth, PANEL in __init__.py"
#endif
constexpr int NB = HRL_PANEL;  // panel width
static_assert(NB > 0 && NB % 8 == 0, "HRL_PANEL: a panel row must be whole 8-float AVX2 vectors");
constexpr int NV = NB / 8;  // AVX2 vectors per panel row. A 6-row tile holds 6 NV accumulators + NV weights +
                            // the broadcast: NB <= 16 fits the 16 ymm registers, wider panels spill.
constexpr int PREFETCH = 96;  // panel rows ahead of the one being read (one prefetch per row: a row is one
                              // 64-byte cache line at NB = 16)

// y[0:MR, n:n+NB] = x[0:MR, 0:K] @ panel[K, NB]; x rows are ldx apart, y rows ldy apart. S > 1 splits the
// k loop into S independent accumulator chains (a row or two alone would wait on the FMA latency).
template <int MR, int S>
inline void tile(const float* __restrict x, int64_t ldx, int64_t K, const float* __restrict panel,
                 float* __restrict y, int64_t ldy, int64_t n, int64_t N) {
  __m256 acc[S * MR * NV];
#pragma GCC unroll 32
  for (int i = 0; i < S * MR * NV; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += S) {
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s) {
      const float* p = panel + (k + s) * NB;
      _mm_prefetch(reinterpret_cast<const char*>(p + PREFETCH * NB), _MM_HINT_T0);
      __m256 w[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) w[v] = _mm256_loadu_ps(p + 8 * v);
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        const __m256 xb = _mm256_broadcast_ss(x + m * ldx + k + s);
        __m256* a = acc + (s * MR + m) * NV;
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) a[v] = _mm256_fmadd_ps(xb, w[v], a[v]);
      }
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) {
    __m256 r[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      r[v] = acc[m * NV + v];
#pragma GCC unroll 4
      for (int s = 1; s < S; ++s) r[v] = _mm256_add_ps(r[v], acc[(s * MR + m) * NV + v]);
    }
    float* out = y + m * ldy + n;
    if (n + NB <= N) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) _mm256_storeu_ps(out + 8 * v, r[v]);
    } else {  // the last, partial panel
      alignas(32) float buf[NB];
      for (int v = 0; v < NV; ++v) _mm256_store_ps(buf + 8 * v, r[v]);
      for (int64_t j = 0; j < N - n; ++j) out[j] = buf[j];
    }
  }
}

template <int MR>
inline void tile_rows(const float* x, int64_t ldx, int64_t K, const float* panel, float* y, int64_t ldy,
                      int64_t n, int64_t N) {
  if (MR <= 2 && K % 2 == 0) tile<MR, 2>(x, ldx, K, panel, y, ldy, n, N);
  else tile<MR, 1>(x, ldx, K, panel, y, ldy, n, N);
}

// y[M, N] = x[M, K] @ W for panels p0..p1-1 of W (columns NB p0 .. NB p1). Each panel is read from memory
// once; row tiles after the first find it in L1/L2.
void matmul_panels(const float* x, int64_t M, int64_t K, const float* w, float* y, int64_t N, int64_t p0,
                   int64_t p1) {
  for (int64_t p = p0; p < p1; ++p) {
    const float* panel = w + p * K * NB;
    const int64_t n = p * NB;
    for (int64_t m = 0; m < M;) {
      const float* xm = x + m * K;
      float* ym = y + m * N;
      switch (std::min<int64_t>(M - m, 6)) {
        case 6: tile_rows<6>(xm, K, K, panel, ym, N, n, N); m += 6; break;
        case 5: tile_rows<5>(xm, K, K, panel, ym, N, n, N); m += 5; break;
        case 4: tile_rows<4>(xm, K, K, panel, ym, N, n, N); m += 4; break;
        case 3: tile_rows<3>(xm, K, K, panel, ym, N, n, N); m += 3; break;
        case 2: tile_rows<2>(xm, K, K, panel, ym, N, n, N); m += 2; break;
        default: tile_rows<1>(xm, K, K, panel, ym, N, n, N); m += 1; break;
      }
    }
  }
}

// Runs f(0..parts-1) on the calling thread and XLA's intra-op pool. Parts are claimed from a shared counter,
// so the caller runs whatever no pool thread has started: it never waits on a task still queued (the caller
// may itself be a pool thread, and every other one may be busy). A pool task that starts after all parts
// are claimed touches only the shared state it holds a reference to.
struct Parts {
  std::atomic<int64_t> next{0}, done{0};
  int64_t total = 0;
  const std::function<void(int64_t)>* f = nullptr;
  void run() {
    for (int64_t p; (p = next.fetch_add(1, std::memory_order_relaxed)) < total;) {
      (*f)(p);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

void parallel(ffi::ThreadPool& pool, int64_t parts, const std::function<void(int64_t)>& f) {
  if (parts <= 1) {
    f(0);
    return;
  }
  auto state = std::make_shared<Parts>();
  state->total = parts;
  state->f = &f;
  for (int64_t p = 1; p < parts; ++p) pool.Schedule([state] { state->run(); });
  state->run();
  for (int spins = 0; state->done.load(std::memory_order_acquire) < parts; ++spins) {
    if (spins < 4096) _mm_pause();
    else std::this_thread::yield();
  }
}

// Splitting a call over the pool pays a hand-off, so only calls with at least g_min_flops of work are split,
// into at most g_max_threads parts (0: one per core; more parts than cores only queue behind each other).
// Measured on the engine's decode block (2 vCPUs, bench model): 2^17 and one part per core is best; a third
// part, or splitting only calls over 2^20 flops, costs 10-25% of a c8 step.
std::atomic<int64_t> g_min_flops{int64_t{1} << 17}, g_max_threads{0};

int64_t pool_parts(ffi::ThreadPool& pool, int64_t work_flops, int64_t max_parts) {
  static const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());  // a syscall: once
  const int64_t cap = g_max_threads.load() ? g_max_threads.load() : std::min<int64_t>(pool.num_threads() + 1, cores);
  if (work_flops < g_min_flops.load() || cap <= 1) return 1;
  return std::max<int64_t>(1, std::min<int64_t>(cap, max_parts));
}

ffi::Error Matmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                  ffi::ResultBuffer<ffi::F32> y) {
  const auto wd = w.dimensions();
  const auto yd = y->dimensions();
  if (wd.size() != 3 || wd[2] != NB) return ffi::Error::InvalidArgument("hrl_matmul: weight is not [P, K, HRL_PANEL]");
  const int64_t P = wd[0], K = wd[1], N = yd[yd.size() - 1];
  const auto xd = x.dimensions();
  const int64_t M = N ? y->element_count() / N : 0;
  if (xd[xd.size() - 1] != K || N > P * NB || N <= (P - 1) * NB || x.element_count() != static_cast<size_t>(M * K))
    return ffi::Error::InvalidArgument("hrl_matmul: x, weight panels and result shapes disagree");
  const float* xp = x.typed_data();
  const float* wp = w.typed_data();
  float* yp = y->typed_data();
  const int64_t parts = pool_parts(pool, 2 * M * K * N, P);
  parallel(pool, parts, [&](int64_t t) { matmul_panels(xp, M, K, wp, yp, N, P * t / parts, P * (t + 1) / parts); });
  return ffi::Error::Success();
}

inline float silu(float v) { return v / (1.0f + std::exp(-v)); }

// One expert on its rows: y_rows[m, :] += gate[m] * (silu(x_m Wg) * (x_m Wu)) Wd.
void expert_ffn(const float* xs, const float* gate, int64_t m, int64_t D, int64_t I, const float* gate_up,
                const float* down, float* ys, std::vector<float>& scratch) {
  const int64_t Pi = (I + NB - 1) / NB, Pd = (D + NB - 1) / NB;
  scratch.resize(static_cast<size_t>(m * (2 * I + D)));
  float* g = scratch.data();
  float* u = g + m * I;
  float* o = u + m * I;
  matmul_panels(xs, m, D, gate_up, g, I, 0, Pi);
  matmul_panels(xs, m, D, gate_up + Pi * D * NB, u, I, 0, Pi);
  for (int64_t i = 0; i < m * I; ++i) g[i] = silu(g[i]) * u[i];
  matmul_panels(g, m, I, down, o, D, 0, Pd);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t d = 0; d < D; ++d) ys[r * D + d] += gate[r] * o[r * D + d];
}

ffi::Error Moe(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S32> ids,
               ffi::Buffer<ffi::F32> gates, ffi::Buffer<ffi::F32> gate_up, ffi::Buffer<ffi::F32> down,
               ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), id = ids.dimensions(), gu = gate_up.dimensions(), dn = down.dimensions();
  if (xd.size() != 2 || id.size() != 2 || gu.size() != 5 || dn.size() != 4 || gu[1] != 2 || gu[4] != NB ||
      dn[3] != NB)
    return ffi::Error::InvalidArgument("hrl_moe: expected x[T,D], ids[T,K], gate_up[E,2,Pi,D,NB], down[E,Pd,I,NB]");
  const int64_t T = xd[0], D = xd[1], Kt = id[1], E = gu[0], I = dn[2];
  const auto gd = gates.dimensions();
  if (id[0] != T || gd.size() != 2 || gd[0] != T || gd[1] != Kt || gu[3] != D || dn[0] != E ||
      gu[2] != (I + NB - 1) / NB || dn[1] != (D + NB - 1) / NB)
    return ffi::Error::InvalidArgument("hrl_moe: x, ids and expert weight shapes disagree");
  const float* xp = x.typed_data();
  const int32_t* ip = ids.typed_data();
  const float* gp = gates.typed_data();
  float* yp = y->typed_data();
  // rows of each expert, in token order (a replayed routing may pick one expert twice for a token: both count)
  std::vector<std::vector<int64_t>> rows(E);
  for (int64_t a = 0; a < T * Kt; ++a) {
    const int32_t e = ip[a];
    if (e < 0 || e >= E) return ffi::Error::InvalidArgument("hrl_moe: expert id out of range");
    rows[e].push_back(a);
  }
  std::vector<int64_t> active;
  for (int64_t e = 0; e < E; ++e)
    if (!rows[e].empty()) active.push_back(e);
  const int64_t per_expert = 2 * D * I * 3;
  const int64_t parts = pool_parts(pool, per_expert * T * Kt, static_cast<int64_t>(active.size()));
  std::vector<std::vector<float>> partial(parts);
  parallel(pool, parts, [&](int64_t t) {
    float* acc = yp;
    if (t > 0) {
      partial[t].assign(static_cast<size_t>(T * D), 0.0f);
      acc = partial[t].data();
    } else {
      std::fill(yp, yp + T * D, 0.0f);
    }
    std::vector<float> xs, ys, gate, scratch;
    for (size_t j = t; j < active.size(); j += parts) {  // experts dealt round-robin: similar weight reads per part
      const int64_t e = active[j], m = static_cast<int64_t>(rows[e].size());
      xs.resize(static_cast<size_t>(m * D));
      gate.resize(static_cast<size_t>(m));
      ys.assign(static_cast<size_t>(m * D), 0.0f);
      for (int64_t r = 0; r < m; ++r) {
        const int64_t a = rows[e][r];
        std::copy(xp + (a / Kt) * D, xp + (a / Kt + 1) * D, xs.data() + r * D);
        gate[r] = gp[a];
      }
      expert_ffn(xs.data(), gate.data(), m, D, I, gate_up.typed_data() + e * 2 * gu[2] * D * NB,
                 down.typed_data() + e * dn[1] * I * NB, ys.data(), scratch);
      for (int64_t r = 0; r < m; ++r) {
        float* dst = acc + (rows[e][r] / Kt) * D;
        for (int64_t d = 0; d < D; ++d) dst[d] += ys[r * D + d];
      }
    }
  });
  for (int64_t t = 1; t < parts; ++t)
    for (int64_t i = 0; i < T * D; ++i) yp[i] += partial[t][i];
  return ffi::Error::Success();
}

// out[i] = q . keys[i] for 8 keys (rows D apart): 8 accumulators over D, then one transpose-and-add.
inline __m256 dot8(const float* q, const float* keys, int64_t D) {
  __m256 a[8];
  for (int i = 0; i < 8; ++i) a[i] = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 8 <= D; d += 8) {
    const __m256 qv = _mm256_loadu_ps(q + d);
    for (int i = 0; i < 8; ++i) a[i] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys + i * D + d), a[i]);
  }
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  __m256 r = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
  if (d < D) {  // head_dim not a multiple of 8
    alignas(32) float t[8];
    _mm256_store_ps(t, r);
    for (int i = 0; i < 8; ++i)
      for (int64_t e = d; e < D; ++e) t[i] += q[e] * keys[i * D + e];
    r = _mm256_load_ps(t);
  }
  return r;
}

inline float dot1(const float* a, const float* b, int64_t D) {
  float r = 0.0f;
  for (int64_t d = 0; d < D; ++d) r += a[d] * b[d];
  return r;
}

// s[j] = q . keys[j] * scale for j < n.
void scores(const float* q, const float* keys, int64_t n, int64_t D, float scale, float* s) {
  const __m256 sc = _mm256_set1_ps(scale);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(s + j, _mm256_mul_ps(dot8(q, keys + j * D, D), sc));
  for (; j < n; ++j) s[j] = dot1(q, keys + j * D, D) * scale;
}

// o += a * v over D.
inline void axpy(float a, const float* v, float* o, int64_t D) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t d = 0;
  for (; d + 8 <= D; d += 8) _mm256_storeu_ps(o + d, _mm256_fmadd_ps(av, _mm256_loadu_ps(v + d), _mm256_loadu_ps(o + d)));
  for (; d < D; ++d) o[d] += a * v[d];
}

// exp(x) for 8 floats: x = n ln2 + r (|r| <= ln2/2, ln2 split in two for exactness), e^r by a degree-6
// polynomial, 2^n by the exponent bits. Max error ~2 ulp (std::exp: ~1), exp(-inf) = 0; x <= -88 flushes to 0.
inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-88.0f), hi = _mm256_set1_ps(88.0f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

// s[j] = exp(s[j] - mx) for j < n; returns their sum.
float exp_sum(float* s, int64_t n, float mx) {
  const __m256 m = _mm256_set1_ps(mx);
  __m256 acc = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), m));
    _mm256_storeu_ps(s + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  alignas(32) float t[8];
  _mm256_store_ps(t, acc);
  float sum = ((t[0] + t[4]) + (t[1] + t[5])) + ((t[2] + t[6]) + (t[3] + t[7]));
  for (; j < n; ++j) sum += (s[j] = std::exp(s[j] - mx));
  return sum;
}

// One (row b, query t, head h): softmax over [ctx keys j < n_ctx] + [buffer keys n with mask[n]] of
// q.k / sqrt(D), then the weighted sum of values. No visible key: zeros (as the XLA path).
void attend_one(const float* q, const float* ck, const float* cv, int64_t n_ctx, const float* nk,
                const float* nv, const bool* mask, int64_t N, int64_t D, float* o, std::vector<float>& s) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  s.resize(static_cast<size_t>(n_ctx + N));
  scores(q, ck, n_ctx, D, scale, s.data());
  float mx = -INFINITY;
  for (int64_t j = 0; j < n_ctx; ++j) mx = std::max(mx, s[j]);
  for (int64_t n = 0; n < N; ++n)
    if (mask[n]) mx = std::max(mx, s[n_ctx + n] = dot1(q, nk + n * D, D) * scale);
  std::fill(o, o + D, 0.0f);
  if (mx == -INFINITY) return;
  float denom = exp_sum(s.data(), n_ctx, mx);
  for (int64_t n = 0; n < N; ++n) denom += (s[n_ctx + n] = mask[n] ? std::exp(s[n_ctx + n] - mx) : 0.0f);
  const float inv = 1.0f / denom;
  for (int64_t j = 0; j < n_ctx; ++j) axpy(s[j] * inv, cv + j * D, o, D);
  for (int64_t n = 0; n < N; ++n)
    if (mask[n]) axpy(s[n_ctx + n] * inv, nv + n * D, o, D);
}

ffi::Error Attend(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> ck, ffi::Buffer<ffi::F32> cv,
                  ffi::Buffer<ffi::S32> ctx_len, ffi::Buffer<ffi::F32> nk, ffi::Buffer<ffi::F32> nv,
                  ffi::Buffer<ffi::PRED> mask, ffi::ResultBuffer<ffi::F32> o) {
  const auto qd = q.dimensions(), kd = ck.dimensions(), nd = nk.dimensions(), md = mask.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || nd.size() != 4 || md.size() != 3)
    return ffi::Error::InvalidArgument("hrl_attend: expected q[B,T,H,D], ctx k/v[B,K,L,D], new k/v[B,K,N,D], mask[B,T,N]");
  const int64_t B = qd[0], T = qd[1], H = qd[2], D = qd[3], Kv = kd[1], L = kd[2], N = nd[2];
  if (kd[0] != B || kd[3] != D || nd[0] != B || nd[1] != Kv || nd[3] != D || md[0] != B || md[1] != T ||
      md[2] != N || Kv == 0 || H % Kv || ctx_len.element_count() != static_cast<size_t>(B))
    return ffi::Error::InvalidArgument("hrl_attend: q, key/value and mask shapes disagree");
  const float *qp = q.typed_data(), *ckp = ck.typed_data(), *cvp = cv.typed_data(), *nkp = nk.typed_data(),
              *nvp = nv.typed_data();
  const int32_t* lp = ctx_len.typed_data();
  const bool* mp = mask.typed_data();
  float* op = o->typed_data();
  const int64_t G = H / Kv, rows = B * Kv;
  const int64_t parts = pool_parts(pool, 4 * B * T * H * (L + N) * D, rows);
  parallel(pool, parts, [&](int64_t t) {
    std::vector<float> s;
    for (int64_t r = rows * t / parts; r < rows * (t + 1) / parts; ++r) {  // one (row, kv head) per task item
      const int64_t b = r / Kv, kv = r % Kv;
      const int64_t n_ctx = std::min<int64_t>(std::max<int32_t>(lp[b], 0), L);
      const float* ckr = ckp + (b * Kv + kv) * L * D;
      const float* cvr = cvp + (b * Kv + kv) * L * D;
      const float* nkr = nkp + (b * Kv + kv) * N * D;
      const float* nvr = nvp + (b * Kv + kv) * N * D;
      for (int64_t tq = 0; tq < T; ++tq)
        for (int64_t g = 0; g < G; ++g) {
          const int64_t h = kv * G + g, off = ((b * T + tq) * H + h) * D;
          attend_one(qp + off, ckr, cvr, n_ctx, nkr, nvr, mp + (b * T + tq) * N, N, D, op + off, s);
        }
    }
  });
  return ffi::Error::Success();
}

}  // namespace

extern "C" void hrl_set_threading(int64_t min_flops, int64_t max_threads) {
  g_min_flops.store(min_flops);
  g_max_threads.store(max_threads);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(HrlMatmul, Matmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(HrlMoe, Moe,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(HrlAttend, Attend,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
