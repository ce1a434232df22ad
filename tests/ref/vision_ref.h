// Double-precision references of the vision-tower ops (kimi_k25 / MoonViT), written from the
// math and from transformers' module structure, never calling mt::ops. Used only by tests.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace mt::ref {

using DVec = std::vector<double>;
using Grids = std::vector<std::array<int64_t, 2>>;  // (rows, cols) of each image, packed in order

inline DVec gelu(const DVec& x, bool tanh_approx) {
  DVec y(x.size());
  const double pi = std::acos(-1.0);
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    y[i] = tanh_approx ? 0.5 * v * (1 + std::tanh(std::sqrt(2 / pi) * (v + 0.044715 * v * v * v)))
                       : 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
  }
  return y;
}

// y [rows, n] + b [n] on every row.
inline DVec bias_add(DVec y, const DVec& b) {
  const size_t n = b.size();
  for (size_t i = 0; i < y.size(); ++i) y[i] += b[i % n];
  return y;
}

// Conv2d(C, D, kernel = stride = P) applied to each patch [C, P, P]: one output pixel per patch.
inline DVec patch_embed(const DVec& px, const DVec& w, const DVec& b, int64_t N, int64_t C,
                        int64_t P, int64_t D) {
  DVec y(static_cast<size_t>(N * D));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < D; ++o) {
      double s = b[o];
      for (int64_t c = 0; c < C; ++c)
        for (int64_t u = 0; u < P; ++u)
          for (int64_t v = 0; v < P; ++v)
            s += w[((o * C + c) * P + u) * P + v] * px[((n * C + c) * P + u) * P + v];
      y[n * D + o] = s;
    }
  return y;
}

// 1-D resampling weights of F.interpolate(align_corners=False) from `side` samples to `size`:
// m[i][s] is the weight of source sample s in output i (out-of-range taps fold onto the edge).
inline std::vector<DVec> resample_matrix(int64_t side, int64_t size, bool bicubic) {
  std::vector<DVec> m(static_cast<size_t>(size), DVec(static_cast<size_t>(side), 0.0));
  auto kernel = [&](double d) {
    d = std::abs(d);
    if (!bicubic) return d < 1 ? 1 - d : 0.0;
    const double a = -0.75;
    if (d <= 1) return (a + 2) * d * d * d - (a + 3) * d * d + 1;
    if (d < 2) return a * d * d * d - 5 * a * d * d + 8 * a * d - 4 * a;
    return 0.0;
  };
  for (int64_t i = 0; i < size; ++i) {
    const double src = (i + 0.5) * static_cast<double>(side) / static_cast<double>(size) - 0.5;
    const int64_t f = static_cast<int64_t>(std::floor(src));
    for (int64_t s = f - 1; s <= f + 2; ++s) {
      const int64_t c = s < 0 ? 0 : (s >= side ? side - 1 : s);
      m[i][c] += kernel(src - static_cast<double>(s));
    }
  }
  return m;
}

// x [N, D] + the [R, Cc, D] table resampled to each image's grid (rows first, then columns).
inline DVec pos_embed(const DVec& x, const DVec& table, const Grids& grids, int64_t R, int64_t Cc,
                      int64_t D, bool bicubic) {
  DVec y = x;
  int64_t base = 0;
  for (const auto& g : grids) {
    const auto mr = resample_matrix(R, g[0], bicubic);
    const auto mc = resample_matrix(Cc, g[1], bicubic);
    // Pass 1: along rows, [g0, Cc, D].
    DVec tmp(static_cast<size_t>(g[0] * Cc * D), 0.0);
    for (int64_t i = 0; i < g[0]; ++i)
      for (int64_t s = 0; s < R; ++s)
        for (int64_t c = 0; c < Cc; ++c)
          for (int64_t d = 0; d < D; ++d)
            tmp[(i * Cc + c) * D + d] += mr[i][s] * table[(s * Cc + c) * D + d];
    // Pass 2: along columns, added to the patches.
    for (int64_t i = 0; i < g[0]; ++i)
      for (int64_t j = 0; j < g[1]; ++j)
        for (int64_t c = 0; c < Cc; ++c)
          for (int64_t d = 0; d < D; ++d)
            y[(base + i * g[1] + j) * D + d] += mc[j][c] * tmp[(i * Cc + c) * D + d];
    base += g[0] * g[1];
  }
  return y;
}

// transformers' Kimi_K25VisionRotaryEmbedding + apply_rotary_pos_emb_vision, step by step:
// freqs (2, d/4) for (h, w), transposed, flipped to (w, h), flattened, doubled; then
// x * cos + rotate_half(x) * sin over the whole head. pos [T, 2] = (row, col).
inline DVec rope2d(const DVec& x, const DVec& pos, int64_t T, int64_t H, int64_t Dh, double theta) {
  const int64_t sd = Dh / 2;
  DVec inv;
  for (int64_t i = 0; i < sd; i += 2) inv.push_back(1.0 / std::pow(theta, double(i) / sd));
  const int64_t q = static_cast<int64_t>(inv.size());
  DVec y(x.size());
  for (int64_t t = 0; t < T; ++t) {
    DVec ang(static_cast<size_t>(Dh));
    for (int64_t i = 0; i < q; ++i) {
      const double wh[2] = {pos[2 * t + 1] * inv[i], pos[2 * t] * inv[i]};  // flip(-1)
      for (int a = 0; a < 2; ++a) ang[2 * i + a] = ang[sd + 2 * i + a] = wh[a];
    }
    for (int64_t h = 0; h < H; ++h) {
      const double* xi = &x[(t * H + h) * Dh];
      for (int64_t j = 0; j < Dh; ++j) {
        const double rot = j < sd ? -xi[j + sd] : xi[j - sd];
        y[(t * H + h) * Dh + j] = xi[j] * std::cos(ang[j]) + rot * std::sin(ang[j]);
      }
    }
  }
  return y;
}

// Non-causal softmax attention inside each document [offsets[i], offsets[i+1]); q, k, v, o
// [T, H, Dh].
inline DVec full_attention(const DVec& q, const DVec& k, const DVec& v,
                           const std::vector<int64_t>& offsets, int64_t H, int64_t Dh,
                           double scale) {
  DVec o(q.size(), 0.0);
  for (size_t d = 0; d + 1 < offsets.size(); ++d)
    for (int64_t t = offsets[d]; t < offsets[d + 1]; ++t)
      for (int64_t h = 0; h < H; ++h) {
        DVec s;
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t u = offsets[d]; u < offsets[d + 1]; ++u) {
          double dot = 0;
          for (int64_t e = 0; e < Dh; ++e) dot += q[(t * H + h) * Dh + e] * k[(u * H + h) * Dh + e];
          s.push_back(dot * scale);
          m = std::max(m, s.back());
        }
        double z = 0;
        for (double& e : s) z += (e = std::exp(e - m));
        for (int64_t u = offsets[d]; u < offsets[d + 1]; ++u)
          for (int64_t e = 0; e < Dh; ++e)
            o[(t * H + h) * Dh + e] += s[u - offsets[d]] / z * v[(u * H + h) * Dh + e];
      }
  return o;
}

// [N, D] raster-ordered patches -> [N / (kh kw), kh kw D] merged tokens (transformers'
// temporal_merge for t = 1).
inline DVec patch_merge(const DVec& x, const Grids& grids, int64_t kh, int64_t kw, int64_t D) {
  DVec y(x.size());
  int64_t base = 0, m = 0;
  for (const auto& g : grids) {
    for (int64_t r = 0; r < g[0]; ++r)
      for (int64_t c = 0; c < g[1]; ++c) {
        const int64_t tok = m + (r / kh) * (g[1] / kw) + c / kw;
        const int64_t slot = (r % kh) * kw + c % kw;
        for (int64_t d = 0; d < D; ++d)
          y[(tok * kh * kw + slot) * D + d] = x[(base + r * g[1] + c) * D + d];
      }
    base += g[0] * g[1];
    m += (g[0] / kh) * (g[1] / kw);
  }
  return y;
}

// transformers' masked_scatter of the image rows: embeds [T, D] with the rows of the tokens whose
// id is `image_token` replaced, in token order, by the rows of src [placeholders, D].
inline DVec masked_scatter(DVec embeds, const std::vector<int32_t>& ids, int32_t image_token,
                           const DVec& src, int64_t D) {
  size_t next = 0;
  for (size_t t = 0; t < ids.size(); ++t)
    if (ids[t] == image_token) {
      for (int64_t d = 0; d < D; ++d)
        embeds[t * static_cast<size_t>(D) + static_cast<size_t>(d)] =
            src[next * static_cast<size_t>(D) + static_cast<size_t>(d)];
      ++next;
    }
  return embeds;
}

}  // namespace mt::ref
