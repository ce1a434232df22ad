#include "ops/kda.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/arena.h"

namespace mt::ops::cpu {

namespace {

// Host view of the document layout; chunk0[n] is the first chunk (row of `saved`) of document n.
struct Docs {
  int64_t *off, *chunk0;  // workspace memory, [num_seqs + 1] each
};

// Offsets were validated by the entry (kda_saved_rows), so this only lays them out.
// From the workspace (the caller's ArenaScope releases it): a step allocates no heap memory.
Docs read_docs(Context& ctx, const KdaParams& p, const Tensor& cu) {
  const int32_t* c = cu.i32();
  Docs d{ctx.workspace().alloc({p.num_seqs + 1}, DType::I64).i64(),
         ctx.workspace().alloc({p.num_seqs + 1}, DType::I64).i64()};
  d.chunk0[0] = 0;
  for (int64_t n = 0; n <= p.num_seqs; ++n) {
    d.off[n] = c[n];
    if (n == 0) continue;
    const int64_t len = c[n] - c[n - 1];
    d.chunk0[n] = d.chunk0[n - 1] + (p.chunked ? (len + p.chunk - 1) / p.chunk : len);
  }
  return d;
}

struct Dims {
  int64_t H, K, V, C;
  float scale;
  int64_t KV() const { return K * V; }
};

struct Inputs {
  const float *q, *k, *v, *g, *beta;
};

struct Grads {
  float *dq, *dk, *dv, *dg, *dbeta;
};

// Per-thread scratch carved out of one workspace block.
struct Bump {
  float* p;
  float* take(int64_t n) {
    float* r = p;
    p += (n + 15) / 16 * 16;  // keep every buffer 64-byte aligned
    return r;
  }
  double* take_d(int64_t n) { return reinterpret_cast<double*>(take(2 * n)); }
};

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// fp32 exponential of a double-precision (cumsum) argument.
inline float exp32(double x) {
  return std::exp(static_cast<float>(x));
}

inline void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// ---------------------------------------------------------------------------------------------
// Recurrent form.

int64_t recurrent_scratch(const Dims& d) {
  return 3 * (d.KV() + 16) + 3 * (std::max(d.K, d.V) + 16);
}

void recurrent_forward_task(const Dims& d, const Inputs& in, int64_t t0, int64_t t1, int64_t h,
                            const float* h0, float* o, float* hT, float* saved, Bump buf) {
  const int64_t K = d.K, V = d.V, KV = d.KV();
  float* S = buf.take(KV);
  float* u = buf.take(V);
  if (h0)
    std::memcpy(S, h0, sizeof(float) * KV);
  else
    std::fill(S, S + KV, 0.f);
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t r = t * d.H + h;
    const float *qt = in.q + r * K, *kt = in.k + r * K, *gt = in.g + r * K, *vt = in.v + r * V;
    const float b = in.beta[r];
    std::memcpy(saved + r * KV, S, sizeof(float) * KV);
    for (int64_t i = 0; i < K; ++i) {
      const float e = std::exp(gt[i]);
      for (int64_t j = 0; j < V; ++j) S[i * V + j] *= e;
    }
    std::memcpy(u, vt, sizeof(float) * V);
    for (int64_t i = 0; i < K; ++i) axpy(-kt[i], S + i * V, u, V);
    for (int64_t i = 0; i < K; ++i) axpy(b * kt[i], u, S + i * V, V);
    float* ot = o + r * V;
    std::fill(ot, ot + V, 0.f);
    for (int64_t i = 0; i < K; ++i) axpy(d.scale * qt[i], S + i * V, ot, V);
  }
  if (hT) std::memcpy(hT, S, sizeof(float) * KV);
}

// Reverse sweep; S' = diag(exp g_t) S_{t-1} and delta = v - S'^T k are recomputed from the saved
// S_{t-1}, S_t = S' + beta k delta^T is never materialised.
void recurrent_backward_task(const Dims& d, const Inputs& in, const Grads& gr, int64_t t0,
                             int64_t t1, int64_t h, const float* saved, const float* dout,
                             const float* dhT, float* dh0, Bump buf) {
  const int64_t K = d.K, V = d.V, KV = d.KV();
  float* dS = buf.take(KV);
  float* Sp = buf.take(KV);
  float* delta = buf.take(V);
  float* ddelta = buf.take(V);
  float* rowdot = buf.take(K);
  if (dhT)
    std::memcpy(dS, dhT, sizeof(float) * KV);
  else
    std::fill(dS, dS + KV, 0.f);
  for (int64_t t = t1 - 1; t >= t0; --t) {
    const int64_t r = t * d.H + h;
    const float *qt = in.q + r * K, *kt = in.k + r * K, *gt = in.g + r * K, *vt = in.v + r * V;
    const float* dot_ = dout + r * V;
    const float b = in.beta[r];
    const float* Sprev = saved + r * KV;
    for (int64_t i = 0; i < K; ++i) {
      const float e = std::exp(gt[i]);
      for (int64_t j = 0; j < V; ++j) Sp[i * V + j] = e * Sprev[i * V + j];
    }
    std::memcpy(delta, vt, sizeof(float) * V);
    for (int64_t i = 0; i < K; ++i) axpy(-kt[i], Sp + i * V, delta, V);

    // dS_tot = dS + scale q do^T
    for (int64_t i = 0; i < K; ++i) axpy(d.scale * qt[i], dot_, dS + i * V, V);
    const float delta_do = dot(delta, dot_, V);
    float* dqt = gr.dq + r * K;
    for (int64_t i = 0; i < K; ++i)
      dqt[i] = d.scale * (dot(Sp + i * V, dot_, V) + b * kt[i] * delta_do);

    std::fill(ddelta, ddelta + V, 0.f);
    for (int64_t i = 0; i < K; ++i) axpy(b * kt[i], dS + i * V, ddelta, V);
    float db = 0.f;
    float* dkt = gr.dk + r * K;
    for (int64_t i = 0; i < K; ++i) {
      rowdot[i] = dot(dS + i * V, delta, V);
      db += kt[i] * rowdot[i];
      dkt[i] = b * rowdot[i] - dot(Sp + i * V, ddelta, V);
    }
    gr.dbeta[r] = db;
    std::memcpy(gr.dv + r * V, ddelta, sizeof(float) * V);

    // dS' = dS_tot - k ddelta^T; dg = rowwise <S', dS'>; dS_{t-1} = diag(exp g) dS'.
    float* dgt = gr.dg + r * K;
    for (int64_t i = 0; i < K; ++i) {
      float* row = dS + i * V;
      axpy(-kt[i], ddelta, row, V);
      dgt[i] = dot(Sp + i * V, row, V);
      const float e = std::exp(gt[i]);
      for (int64_t j = 0; j < V; ++j) row[j] *= e;
    }
  }
  if (dh0) std::memcpy(dh0, dS, sizeof(float) * KV);
}

// ---------------------------------------------------------------------------------------------
// Chunked form. Within a chunk of L tokens, Gam = inclusive cumsum of g (per channel), S0 the
// state entering it:
//   Aqk_ij = scale sum_d q_id k_jd e^(Gam_id - Gam_jd)   (j <= i)
//   A_ij   = beta_i sum_d k_id k_jd e^(Gam_id - Gam_jd)  (j < i)
//   Delta  = (I + A)^-1 (beta v - (beta k e^Gam) S0)     (forward substitution)
//   o      = scale (q e^Gam) S0 + Aqk Delta
//   S_next = diag(e^Gam_L) S0 + (k e^(Gam_L - Gam))^T Delta
// Exponents are always differences Gam_i - Gam_j with i >= j (or Gam_i alone), hence <= 0.

struct ChunkBuf {
  float *q, *k, *v, *b;  // gathered chunk rows
  // In-chunk cumsum of g in double: exponents are differences Gam_i - Gam_j of cumsums that can
  // reach the thousands under strong decay, and in fp32 the difference would lose its digits.
  double* gam;
  float *aqk, *a;  // [C, C], row stride C
  float* delta;    // [C, V]
};

ChunkBuf take_chunk(const Dims& d, Bump& buf) {
  ChunkBuf c;
  c.q = buf.take(d.C * d.K);
  c.k = buf.take(d.C * d.K);
  c.v = buf.take(d.C * d.V);
  c.gam = buf.take_d(d.C * d.K);
  c.b = buf.take(d.C);
  c.aqk = buf.take(d.C * d.C);
  c.a = buf.take(d.C * d.C);
  c.delta = buf.take(d.C * d.V);
  return c;
}

int64_t pad16(int64_t n) {
  return (n + 15) / 16 * 16;
}

int64_t chunk_buf_floats(const Dims& d) {
  return 2 * pad16(d.C * d.K) + pad16(2 * d.C * d.K) + pad16(d.C * d.V) * 2 + pad16(d.C) +
         2 * pad16(d.C * d.C);
}

// Gathers the chunk, builds Gam, Aqk, A and Delta for the state S0 entering it.
void chunk_prepare(const Dims& d, const Inputs& in, int64_t c0, int64_t L, int64_t h,
                   const float* S0, ChunkBuf& c) {
  const int64_t K = d.K, V = d.V, C = d.C;
  for (int64_t i = 0; i < L; ++i) {
    const int64_t r = (c0 + i) * d.H + h;
    std::memcpy(c.q + i * K, in.q + r * K, sizeof(float) * K);
    std::memcpy(c.k + i * K, in.k + r * K, sizeof(float) * K);
    std::memcpy(c.v + i * V, in.v + r * V, sizeof(float) * V);
    c.b[i] = in.beta[r];
    const float* gr = in.g + r * K;
    for (int64_t x = 0; x < K; ++x) c.gam[i * K + x] = (i ? c.gam[(i - 1) * K + x] : 0.0) + gr[x];
  }
  for (int64_t i = 0; i < L; ++i) {
    const float *qi = c.q + i * K, *ki = c.k + i * K;
    const double* gi = c.gam + i * K;
    for (int64_t j = 0; j <= i; ++j) {
      const float* kj = c.k + j * K;
      const double* gj = c.gam + j * K;
      float sqk = 0.f, skk = 0.f;
      for (int64_t x = 0; x < K; ++x) {
        const float e = exp32(gi[x] - gj[x]);
        sqk += qi[x] * kj[x] * e;
        skk += ki[x] * kj[x] * e;
      }
      c.aqk[i * C + j] = d.scale * sqk;
      c.a[i * C + j] = j < i ? c.b[i] * skk : 0.f;
    }
  }
  for (int64_t i = 0; i < L; ++i) {
    float* di = c.delta + i * V;
    std::fill(di, di + V, 0.f);
    for (int64_t x = 0; x < K; ++x)
      axpy(c.k[i * K + x] * exp32(c.gam[i * K + x]), S0 + x * V, di, V);
    for (int64_t j = 0; j < V; ++j) di[j] = c.b[i] * (c.v[i * V + j] - di[j]);
    for (int64_t j = 0; j < i; ++j) axpy(-c.a[i * C + j], c.delta + j * V, di, V);
  }
}

int64_t chunked_scratch(const Dims& d) {
  return chunk_buf_floats(d) + pad16(d.KV()) + pad16(d.V);
}

void chunked_forward_task(const Dims& d, const Inputs& in, int64_t t0, int64_t t1, int64_t h,
                          int64_t chunk0, const float* h0, float* o, float* hT, float* saved,
                          Bump buf) {
  const int64_t K = d.K, V = d.V, C = d.C, KV = d.KV();
  ChunkBuf c = take_chunk(d, buf);
  float* S = buf.take(KV);
  float* acc = buf.take(V);
  if (h0)
    std::memcpy(S, h0, sizeof(float) * KV);
  else
    std::fill(S, S + KV, 0.f);
  for (int64_t c0 = t0, ci = chunk0; c0 < t1; c0 += C, ++ci) {
    const int64_t L = std::min(C, t1 - c0);
    std::memcpy(saved + (ci * d.H + h) * KV, S, sizeof(float) * KV);
    chunk_prepare(d, in, c0, L, h, S, c);
    for (int64_t i = 0; i < L; ++i) {
      std::fill(acc, acc + V, 0.f);
      for (int64_t x = 0; x < K; ++x)
        axpy(d.scale * c.q[i * K + x] * exp32(c.gam[i * K + x]), S + x * V, acc, V);
      for (int64_t j = 0; j <= i; ++j) axpy(c.aqk[i * C + j], c.delta + j * V, acc, V);
      std::memcpy(o + ((c0 + i) * d.H + h) * V, acc, sizeof(float) * V);
    }
    const double* gl = c.gam + (L - 1) * K;
    for (int64_t x = 0; x < K; ++x) {
      float* row = S + x * V;
      const float e = exp32(gl[x]);
      for (int64_t j = 0; j < V; ++j) row[j] *= e;
      for (int64_t i = 0; i < L; ++i)
        axpy(c.k[i * K + x] * exp32(gl[x] - c.gam[i * K + x]), c.delta + i * V, row, V);
    }
  }
  if (hT) std::memcpy(hT, S, sizeof(float) * KV);
}

int64_t chunked_bwd_scratch(const Dims& d) {
  return chunk_buf_floats(d) + 3 * pad16(d.C * d.K) + pad16(2 * d.C * d.K) + 4 * pad16(d.C * d.V) +
         pad16(d.C) + pad16(d.KV()) + 2 * pad16(2 * d.K);
}

// Reverse over chunks; everything but S0 is recomputed. dS is the gradient wrt the state leaving
// the chunk on entry and wrt S0 on exit.
void chunked_backward_task(const Dims& d, const Inputs& in, const Grads& gr, int64_t t0, int64_t t1,
                           int64_t h, int64_t chunk0, const float* saved, const float* dout,
                           const float* dhT, float* dh0, Bump buf) {
  const int64_t K = d.K, V = d.V, C = d.C, KV = d.KV();
  ChunkBuf c = take_chunk(d, buf);
  float* kgl = buf.take(C * K);
  float* dQ = buf.take(C * K);
  float* dK = buf.take(C * K);
  // Gam gradients in double: each pairwise term is added to row i and subtracted from row j, and
  // the reverse cumsum into dg must see those pairs cancel exactly.
  double* dGam = buf.take_d(C * K);
  float* dO = buf.take(C * V);
  float* dDelta = buf.take(C * V);
  float* dR = buf.take(C * V);
  float* dV = buf.take(C * V);
  float* dB = buf.take(C);
  float* dS = buf.take(KV);
  double* dGamL = buf.take_d(K);
  double* acc = buf.take_d(K);
  if (dhT)
    std::memcpy(dS, dhT, sizeof(float) * KV);
  else
    std::fill(dS, dS + KV, 0.f);
  const int64_t nc = (t1 - t0 + C - 1) / C;
  for (int64_t cc = nc - 1; cc >= 0; --cc) {
    const int64_t c0 = t0 + cc * C, L = std::min(C, t1 - c0);
    const float* S0 = saved + ((chunk0 + cc) * d.H + h) * KV;
    chunk_prepare(d, in, c0, L, h, S0, c);
    const double* gl = c.gam + (L - 1) * K;
    for (int64_t i = 0; i < L; ++i) {
      std::memcpy(dO + i * V, dout + ((c0 + i) * d.H + h) * V, sizeof(float) * V);
      for (int64_t x = 0; x < K; ++x)
        kgl[i * K + x] = c.k[i * K + x] * exp32(gl[x] - c.gam[i * K + x]);
    }
    // dDelta = Aqk^T dO + kgl dS_next
    for (int64_t i = 0; i < L; ++i) {
      float* r = dDelta + i * V;
      std::fill(r, r + V, 0.f);
      for (int64_t i2 = i; i2 < L; ++i2) axpy(c.aqk[i2 * C + i], dO + i2 * V, r, V);
      for (int64_t x = 0; x < K; ++x) axpy(kgl[i * K + x], dS + x * V, r, V);
    }
    // dR = (I + A)^-T dDelta by back substitution.
    for (int64_t i = L - 1; i >= 0; --i) {
      float* r = dR + i * V;
      std::memcpy(r, dDelta + i * V, sizeof(float) * V);
      for (int64_t i2 = i + 1; i2 < L; ++i2) axpy(-c.a[i2 * C + i], dR + i2 * V, r, V);
    }

    std::fill(dQ, dQ + L * K, 0.f);
    std::fill(dK, dK + L * K, 0.f);
    std::fill(dGam, dGam + L * K, 0.0);
    std::fill(dGamL, dGamL + K, 0.0);
    // Terms through qg = q e^Gam, kb = beta k e^Gam, kgl, and beta v.
    for (int64_t i = 0; i < L; ++i) {
      const float bi = c.b[i];
      const float *dRi = dR + i * V, *dOi = dO + i * V, *Di = c.delta + i * V;
      for (int64_t j = 0; j < V; ++j) dV[i * V + j] = bi * dRi[j];
      float db = dot(c.v + i * V, dRi, V);
      for (int64_t x = 0; x < K; ++x) {
        const int64_t ix = i * K + x;
        const float eg = exp32(c.gam[ix]);
        const float *S0r = S0 + x * V, *dSr = dS + x * V;
        const float dqg = d.scale * dot(dOi, S0r, V);
        const float dkb = -dot(dRi, S0r, V);
        const float dkgl = dot(Di, dSr, V);
        dQ[ix] += dqg * eg;
        dGam[ix] += dqg * c.q[ix] * eg;
        db += dkb * c.k[ix] * eg;
        dK[ix] += bi * eg * dkb;
        dGam[ix] += dkb * bi * c.k[ix] * eg;
        dK[ix] += dkgl * exp32(gl[x] - c.gam[ix]);
        dGam[ix] -= dkgl * kgl[ix];
        dGamL[x] += dkgl * kgl[ix];
      }
      dB[i] = db;
    }
    for (int64_t x = 0; x < K; ++x) dGamL[x] += exp32(gl[x]) * dot(S0 + x * V, dS + x * V, V);
    // Pairwise terms of Aqk (dAqk = dO Delta^T) and A (dA = -dR Delta^T).
    for (int64_t i = 0; i < L; ++i) {
      const float *qi = c.q + i * K, *ki = c.k + i * K;
      const double* gi = c.gam + i * K;
      float* dQi = dQ + i * K;
      float* dKi = dK + i * K;
      double* dGi = dGam + i * K;
      for (int64_t j = 0; j <= i; ++j) {
        const float* kj = c.k + j * K;
        const double* gj = c.gam + j * K;
        float* dKj = dK + j * K;
        double* dGj = dGam + j * K;
        const float tq = d.scale * dot(dO + i * V, c.delta + j * V, V);
        const float ta = j < i ? -dot(dR + i * V, c.delta + j * V, V) : 0.f;
        const float tb = ta * c.b[i];
        float dbi = 0.f;
        for (int64_t x = 0; x < K; ++x) {
          const float e = exp32(gi[x] - gj[x]);
          const float eq = tq * e, eb = tb * e;
          const float qk = qi[x] * kj[x], kk = ki[x] * kj[x];
          dQi[x] += eq * kj[x];
          dKj[x] += eq * qi[x] + eb * ki[x];
          dKi[x] += eb * kj[x];
          dbi += e * kk;
          const float dgam = eq * qk + eb * kk;
          dGi[x] += dgam;
          dGj[x] -= dgam;
        }
        dB[i] += ta * dbi;
      }
    }
    for (int64_t x = 0; x < K; ++x) dGam[(L - 1) * K + x] += dGamL[x];

    // dS0 = diag(e^Gam_L) dS_next + scale qg^T dO - kb^T dR (after every use of dS_next).
    for (int64_t x = 0; x < K; ++x) {
      float* row = dS + x * V;
      const float e = exp32(gl[x]);
      for (int64_t j = 0; j < V; ++j) row[j] *= e;
      for (int64_t i = 0; i < L; ++i) {
        const float eg = exp32(c.gam[i * K + x]);
        axpy(d.scale * c.q[i * K + x] * eg, dO + i * V, row, V);
        axpy(-c.b[i] * c.k[i * K + x] * eg, dR + i * V, row, V);
      }
    }

    // g enters only through the inclusive cumsum: dg = reverse cumsum of dGam.
    std::fill(acc, acc + K, 0.0);
    for (int64_t i = L - 1; i >= 0; --i) {
      const int64_t r = (c0 + i) * d.H + h;
      float* dgr = gr.dg + r * K;
      for (int64_t x = 0; x < K; ++x) {
        acc[x] += dGam[i * K + x];
        dgr[x] = static_cast<float>(acc[x]);
      }
      std::memcpy(gr.dq + r * K, dQ + i * K, sizeof(float) * K);
      std::memcpy(gr.dk + r * K, dK + i * K, sizeof(float) * K);
      std::memcpy(gr.dv + r * V, dV + i * V, sizeof(float) * V);
      gr.dbeta[r] = dB[i];
    }
  }
  if (dh0) std::memcpy(dh0, dS, sizeof(float) * KV);
}

Dims make_dims(const KdaParams& p) {
  return {p.heads, p.head_k, p.head_v, p.chunked ? p.chunk : 1, p.qk_scale()};
}

int thread_count(const Context& ctx, int64_t tasks) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(ctx.threads(), tasks)));
}

}  // namespace

namespace {

int64_t scratch_per_thread(const KdaParams& p, const Dims& d, bool backward) {
  if (!p.chunked) return recurrent_scratch(d);
  return backward ? chunked_bwd_scratch(d) : chunked_scratch(d);
}

int64_t scratch_threads(int threads, const KdaParams& p) {
  return std::max<int64_t>(1, std::min<int64_t>(threads, p.num_seqs * p.heads));
}

}  // namespace

int64_t kda_scratch_floats(const KdaParams& p, int threads, bool backward) {
  // read_docs' two [num_seqs + 1] int64 tables come first, each an arena footprint of its own.
  const auto docs = static_cast<int64_t>(
      2 * arena_footprint(static_cast<size_t>(p.num_seqs + 1) * sizeof(int64_t)) / sizeof(float));
  return docs + scratch_threads(threads, p) * scratch_per_thread(p, make_dims(p), backward);
}

namespace {

// Runs fn(document, head, state offset, scratch) for every (document, head) pair in parallel;
// each thread carves its scratch from one workspace block sized by scratch_per_thread.
template <typename Fn>
void for_each_doc_head(Context& ctx, const KdaParams& p, const Dims& d, bool backward, Fn&& fn) {
  const int64_t per = scratch_per_thread(p, d, backward);
  const int64_t tasks = p.num_seqs * p.heads;
  const int nt = thread_count(ctx, tasks);
  ArenaScope scope(ctx.workspace());
  Tensor scratch = ctx.workspace().alloc({nt, per});
  float* base = scratch.f32();
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
  for (int64_t task = 0; task < tasks; ++task) {
    Bump buf{base + omp_get_thread_num() * per};
    fn(task / p.heads, task % p.heads, task * d.KV(), buf);
  }
}

}  // namespace

void kda_forward(Context& ctx, const KdaParams& p, const Tensor& cu_seqlens, const Tensor& q,
                 const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                 const Tensor& h0, Tensor& o, Tensor& hT, Tensor& saved, Tensor& /*prepared*/) {
  ArenaScope scope(ctx.workspace());
  const Docs docs = read_docs(ctx, p, cu_seqlens);
  const Dims d = make_dims(p);
  const Inputs in{q.f32(), k.f32(), v.f32(), g.f32(), beta.f32()};
  const float* ph0 = h0.defined() ? h0.f32() : nullptr;
  float* phT = hT.defined() ? hT.f32() : nullptr;
  float* po = o.f32();
  float* ps = saved.f32();

  for_each_doc_head(
      ctx, p, d, /*backward=*/false, [&](int64_t n, int64_t h, int64_t st, Bump& buf) {
        if (p.chunked)
          chunked_forward_task(d, in, docs.off[n], docs.off[n + 1], h, docs.chunk0[n],
                               ph0 ? ph0 + st : nullptr, po, phT ? phT + st : nullptr, ps, buf);
        else
          recurrent_forward_task(d, in, docs.off[n], docs.off[n + 1], h, ph0 ? ph0 + st : nullptr,
                                 po, phT ? phT + st : nullptr, ps, buf);
      });
}

void kda_backward(Context& ctx, const KdaParams& p, const Tensor& cu_seqlens, const Tensor& q,
                  const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                  const Tensor& saved, Tensor& /*prepared*/, const Tensor& dout, const Tensor& dhT,
                  Tensor& dq, Tensor& dk, Tensor& dv, Tensor& dg, Tensor& dbeta, Tensor& dh0) {
  ArenaScope scope(ctx.workspace());
  const Docs docs = read_docs(ctx, p, cu_seqlens);
  const Dims d = make_dims(p);
  const Inputs in{q.f32(), k.f32(), v.f32(), g.f32(), beta.f32()};
  const Grads gr{dq.f32(), dk.f32(), dv.f32(), dg.f32(), dbeta.f32()};
  const float* pdhT = dhT.defined() ? dhT.f32() : nullptr;
  float* pdh0 = dh0.defined() ? dh0.f32() : nullptr;
  const float* pdo = dout.f32();
  const float* ps = saved.f32();

  for_each_doc_head(ctx, p, d, /*backward=*/true, [&](int64_t n, int64_t h, int64_t st, Bump& buf) {
    if (p.chunked)
      chunked_backward_task(d, in, gr, docs.off[n], docs.off[n + 1], h, docs.chunk0[n], ps, pdo,
                            pdhT ? pdhT + st : nullptr, pdh0 ? pdh0 + st : nullptr, buf);
    else
      recurrent_backward_task(d, in, gr, docs.off[n], docs.off[n + 1], h, ps, pdo,
                              pdhT ? pdhT + st : nullptr, pdh0 ? pdh0 + st : nullptr, buf);
  });
}

}  // namespace mt::ops::cpu
