#include "ops/indexer.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "core/arena.h"
#include "ops/cpu/attention.h"

namespace mt::ops::cpu {

void indexer_scores_forward(Context& ctx, const IndexerParams& p, const Tensor& q, const Tensor& k,
                            const Tensor& w, const Tensor& indices, Tensor& scores) {
  const int64_t T = p.tokens, H = p.heads, D = p.head_dim, K = p.kmax;
  const float* pq = q.f32();
  const float* pk = k.f32();
  const float* pw = w.f32();
  const int32_t* idx = indices.i32();
  float* ps = scores.f32();
  const float scale = p.eff_scale();
#pragma omp parallel for num_threads(ctx.threads()) schedule(dynamic, 8)
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < K; ++j) {
      const int32_t s = idx[t * K + j];
      float acc = 0.f;
      if (valid_slot(s, T)) {
        for (int64_t h = 0; h < H; ++h)
          acc += pw[t * H + h] * std::max(0.f, dotf(pq + (t * H + h) * D, pk + s * D, D));
        acc *= scale;
      }
      ps[t * K + j] = acc;
    }
  }
}

void indexer_scores_backward(Context& ctx, const IndexerParams& p, const Tensor& q, const Tensor& k,
                             const Tensor& w, const Tensor& indices, const Tensor& dscores,
                             Tensor& dq, Tensor& dk, Tensor& dw) {
  const int64_t T = p.tokens, H = p.heads, D = p.head_dim, K = p.kmax;
  const float* pq = q.f32();
  const float* pk = k.f32();
  const float* pw = w.f32();
  const float* pds = dscores.f32();
  const int32_t* idx = indices.i32();
  float* pdq = dq.f32();
  float* pdk = dk.f32();
  float* pdw = dw.f32();
  const float scale = p.eff_scale();
  const int nth = ctx.threads();

  // Per query: dw[t, j] = scale sum_s g ReLU(q.k_s), dq[t, j] = scale w sum_s g 1[q.k_s > 0] k_s.
#pragma omp parallel for num_threads(nth) schedule(dynamic, 8)
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const float* qr = pq + (t * H + h) * D;
      float* dqr = pdq + (t * H + h) * D;
      std::fill(dqr, dqr + D, 0.f);
      float dwa = 0.f;
      const float wg = pw[t * H + h] * scale;
      for (int64_t j = 0; j < K; ++j) {
        const int32_t s = idx[t * K + j];
        if (!valid_slot(s, T)) continue;
        const float* kr = pk + s * D;
        const float a = dotf(qr, kr, D);
        if (a <= 0.f) continue;
        const float g = pds[t * K + j];
        dwa += g * a;
        for (int64_t d = 0; d < D; ++d) dqr[d] += wg * g * kr[d];
      }
      pdw[t * H + h] = scale * dwa;
    }
  }

  // Per key: dk[s] = scale sum_{(t, j) -> s} g sum_h w 1[q.k_s > 0] q, gathered through the
  // transposed index table so no two threads write one row.
  ArenaScope scope(ctx.workspace());
  KeyLists kl = build_key_lists(indices, T, ctx.workspace());
  const int64_t* off = kl.offsets.i64();
  const int64_t* ent = kl.entries.i64();
#pragma omp parallel for num_threads(nth) schedule(dynamic, 4)
  for (int64_t s = 0; s < T; ++s) {
    float* dkr = pdk + s * D;
    std::fill(dkr, dkr + D, 0.f);
    const float* kr = pk + s * D;
    for (int64_t e = off[s]; e < off[s + 1]; ++e) {
      const int64_t t = ent[e] / K;
      const float g = pds[ent[e]] * scale;
      for (int64_t h = 0; h < H; ++h) {
        const float* qr = pq + (t * H + h) * D;
        if (dotf(qr, kr, D) <= 0.f) continue;
        const float c = g * pw[t * H + h];
        for (int64_t d = 0; d < D; ++d) dkr[d] += c * qr[d];
      }
    }
  }
}

void topk_select(Context& ctx, const Tensor& scores, const Tensor& candidates, int64_t topk,
                 Tensor& out) {
  const int64_t T = candidates.dim(0), K = candidates.dim(1);
  const float* ps = scores.f32();
  const int32_t* pc = candidates.i32();
  int32_t* po = out.i32();
  const int nt = ctx.threads();
  // Per-thread candidate lists from the workspace: a step allocates no heap memory.
  ArenaScope scope(ctx.workspace());
  Tensor lists = ctx.workspace().alloc({nt, K}, DType::I64);  // one ScoredPos per 8 bytes
#pragma omp parallel num_threads(nt)
  {
    ScoredPos* buf_begin = reinterpret_cast<ScoredPos*>(lists.i64()) + omp_get_thread_num() * K;
#pragma omp for schedule(dynamic, 8)
    for (int64_t t = 0; t < T; ++t) {
      size_t count = 0;
      for (int64_t j = 0; j < K; ++j) {
        const int32_t s = pc[t * K + j];
        if (valid_slot(s, T)) buf_begin[count++] = ScoredPos{ps[t * K + j], s};
      }
      select_topk_row(std::span<ScoredPos>(buf_begin, count), topk, po + t * topk);
    }
  }
}

void indexer_kl_forward(Context& ctx, const Tensor& scores, const Tensor& target,
                        const Tensor& indices, Tensor& softmax, Tensor& loss) {
  const int64_t T = indices.dim(0), K = indices.dim(1);
  const float* ps = scores.f32();
  const float* pt = target.f32();
  const int32_t* idx = indices.i32();
  float* pm = softmax.f32();
  // Per-row losses summed in row order afterwards: an OpenMP reduction would make the loss depend
  // on the thread schedule in its last bits.
  ArenaScope scope(ctx.workspace());
  Tensor row_kl = ctx.workspace().alloc({T}, DType::I64);  // storage for T doubles
  double* rkl = static_cast<double*>(row_kl.raw());
#pragma omp parallel for num_threads(ctx.threads()) schedule(dynamic, 8)
  for (int64_t t = 0; t < T; ++t) {
    rkl[t] = 0;
    const int32_t* row = idx + t * K;
    const float* srow = ps + t * K;
    const float* trow = pt + t * K;
    float* mrow = pm + t * K;
    float m = -std::numeric_limits<float>::infinity();
    double tsum = 0;
    for (int64_t j = 0; j < K; ++j) {
      if (!valid_slot(row[j], T)) continue;
      m = std::max(m, srow[j]);
      tsum += trow[j];
    }
    std::fill(mrow, mrow + K, 0.f);
    if (m == -std::numeric_limits<float>::infinity()) continue;
    double z = 0;
    for (int64_t j = 0; j < K; ++j)
      if (valid_slot(row[j], T)) z += std::exp(static_cast<double>(srow[j] - m));
    const double logz = m + std::log(z);
    double kl = 0;
    for (int64_t j = 0; j < K; ++j) {
      if (!valid_slot(row[j], T)) continue;
      const double logq = srow[j] - logz;
      mrow[j] = static_cast<float>(std::exp(logq));
      if (tsum > 0 && trow[j] > 0) {
        const double pj = trow[j] / tsum;
        kl += pj * (std::log(pj) - logq);
      }
    }
    rkl[t] = kl;
  }
  double total = 0;
  for (int64_t t = 0; t < T; ++t) total += rkl[t];
  loss.f64()[0] = T ? total / static_cast<double>(T) : 0.0;
}

void indexer_kl_backward(Context& ctx, const Tensor& softmax, const Tensor& target,
                         const Tensor& indices, double dloss, Tensor& dscores) {
  const int64_t T = indices.dim(0), K = indices.dim(1);
  const float* pm = softmax.f32();
  const float* pt = target.f32();
  const int32_t* idx = indices.i32();
  float* pd = dscores.f32();
  const double c = T ? dloss / static_cast<double>(T) : 0.0;
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* row = idx + t * K;
    double tsum = 0;
    for (int64_t j = 0; j < K; ++j)
      if (valid_slot(row[j], T)) tsum += pt[t * K + j];
    for (int64_t j = 0; j < K; ++j) {
      float g = 0.f;
      // A zero target contributes no loss, hence no gradient (softmax sums to 1 regardless).
      if (valid_slot(row[j], T) && tsum > 0)
        g = static_cast<float>(c * (pm[t * K + j] - pt[t * K + j] / tsum));
      pd[t * K + j] = g;
    }
  }
}

}  // namespace mt::ops::cpu
