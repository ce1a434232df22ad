#include "ops/kda.h"

#include "ops/kda_chunk_layout.h"
#include "ops/kda_prep_path.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <utility>

#include "ops/dispatch.h"

namespace mt::ops {

namespace {

void check_params(const KdaParams& p, const Tensor& cu) {
  MT_CHECK(p.tokens >= 0 && p.heads > 0 && p.head_k > 0 && p.head_v > 0 && p.num_seqs >= 0,
           ValueError, "kda: bad dims tokens ", p.tokens, " heads ", p.heads, " head_k ", p.head_k,
           " head_v ", p.head_v, " num_seqs ", p.num_seqs);
  MT_CHECK(!p.chunked || p.chunk > 0, ValueError, "kda: chunk must be positive, got ", p.chunk);
  expect_shape(cu, {p.num_seqs + 1}, "kda cu_seqlens");
}

void check_inputs(const KdaParams& p, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& g, const Tensor& beta) {
  expect_shape(q, {p.tokens, p.heads, p.head_k}, "kda q");
  expect_shape(k, {p.tokens, p.heads, p.head_k}, "kda k");
  expect_shape(v, {p.tokens, p.heads, p.head_v}, "kda v");
  expect_shape(g, {p.tokens, p.heads, p.head_k}, "kda g");
  expect_shape(beta, {p.tokens, p.heads}, "kda beta");
}

Shape state_shape(const KdaParams& p) {
  return {p.num_seqs, p.heads, p.head_k, p.head_v};
}

// What the host can check of `saved` without reading device offsets: its row dims, and a row
// count that some documents of these tokens could need (exactly the tokens for the recurrence;
// for chunks, between ceil(T / C) and min(T, (T + N (C - 1)) / C)). The kernels never write past
// the rows they are given.
[[maybe_unused]] void check_saved_bounds(const KdaParams& p, const Tensor& saved) {
  const int64_t lo = p.chunked ? (p.tokens + p.chunk - 1) / p.chunk : p.tokens;
  const int64_t hi =
      p.chunked ? std::min(p.tokens, (p.tokens + p.num_seqs * (p.chunk - 1)) / p.chunk) : p.tokens;
  MT_CHECK(saved.ndim() == 4 && saved.dim(1) == p.heads && saved.dim(2) == p.head_k &&
               saved.dim(3) == p.head_v && saved.dim(0) >= lo && saved.dim(0) <= hi,
           ShapeError, "kda saved has shape ", saved.shape(), ", expected [rows, ", p.heads, ", ",
           p.head_k, ", ", p.head_v, "] with rows in [", lo, ", ", hi, "]");
}

// `saved` f32, or bf16 where the tensor-core path rounds the chunk states (kda_bf16_states_fit,
// ops/kda_prep_path.h: the one rule; the CUDA entries of ops/cuda/kda.cu check it too).
[[maybe_unused]] void check_saved_dtype(const KdaParams& p, const Tensor& saved, DType dtype) {
  MT_CHECK(saved.dtype() == DType::F32 ||
               (saved.dtype() == DType::BF16 && kda_bf16_states_fit(p, dtype)),
           ShapeError, "kda saved is ", dtype_name(saved.dtype()), ": f32, or bf16 on the ",
           "tensor-core path only (bf16 q, k, v at chunk 64, head dims 64 or 128)");
}

// `prepared`, where given, fits the kernels that read it: f32, one float per prepared product of
// every saved row (the chunk count comes from `saved`, checked above).
[[maybe_unused]] void check_prepared(const KdaParams& p, const Tensor& saved,
                                     const Tensor& prepared, DType dtype) {
  if (!prepared.defined()) return;
  MT_CHECK(kda_chunk_kernel_fits(p), ShapeError,
           "kda prepared given for params the chunked kernels do not take (chunked ", p.chunked,
           ", chunk ", p.chunk, ", head_k ", p.head_k, ", head_v ", p.head_v, ")");
  MT_CHECK(prepared.dtype() == DType::F32 &&
               prepared.numel() == kda_prepared_floats(p, saved.dim(0), dtype),
           ShapeError, "kda prepared has shape ", prepared.shape(), " ",
           dtype_name(prepared.dtype()), ", expected ", kda_prepared_floats(p, saved.dim(0), dtype),
           " f32 for ", saved.dim(0), " saved rows");
}

}  // namespace

float KdaParams::qk_scale() const {
  return scale != 0.f ? scale : 1.f / std::sqrt(static_cast<float>(head_k));
}

// Reads the offsets, so they must be in host memory; the entries check `saved` with it on the CPU
// path only, after the dispatch.
int64_t kda_saved_rows(const KdaParams& p, const Tensor& cu_seqlens) {
  check_params(p, cu_seqlens);
  const int32_t* c = cu_seqlens.i32();
  MT_CHECK(c[0] == 0, ValueError, "kda: cu_seqlens[0] is ", c[0], ", expected 0");
  int64_t rows = 0;
  for (int64_t n = 1; n <= p.num_seqs; ++n) {
    MT_CHECK(c[n] >= c[n - 1], ValueError, "kda: cu_seqlens decreases at ", n);
    const int64_t len = c[n] - c[n - 1];
    rows += p.chunked ? (len + p.chunk - 1) / p.chunk : len;
  }
  MT_CHECK(c[p.num_seqs] == p.tokens, ValueError, "kda: cu_seqlens ends at ", c[p.num_seqs],
           ", expected tokens ", p.tokens);
  return rows;
}

bool kda_chunk_kernel_fits(const KdaParams& p) {
  return p.kernels.chunk_kernels && p.chunked && p.chunk <= 64 && p.head_k <= 128 &&
         p.head_v <= 128;
}

namespace {
// KdaKernels' fields by name, in declaration order: the one list parse and name read.
constexpr std::pair<const char*, bool KdaKernels::*> kKdaKernelFields[] = {
    {"chunk_kernels", &KdaKernels::chunk_kernels},
    {"tensor_core_prep", &KdaKernels::tensor_core_prep},
    {"bf16_prepared", &KdaKernels::bf16_prepared},
    {"bf16_states", &KdaKernels::bf16_states},
    {"keep_prepared", &KdaKernels::keep_prepared},
    {"fused_delta", &KdaKernels::fused_delta},
    {"fused_pre", &KdaKernels::fused_pre},
    {"prep_v2", &KdaKernels::prep_v2},
    {"forward_state_v2", &KdaKernels::forward_state_v2},
    {"forward_overlap", &KdaKernels::forward_overlap},
    {"forward_overlap_waves", &KdaKernels::forward_overlap_waves},
    {"forward_longest_first", &KdaKernels::forward_longest_first},
    {"backward_state_v2", &KdaKernels::backward_state_v2},
    {"grads_v2", &KdaKernels::grads_v2},
    {"products_v2", &KdaKernels::products_v2},
    {"products_prefetch", &KdaKernels::products_prefetch},
};
static_assert(sizeof(KdaKernels) == std::size(kKdaKernelFields), "a KdaKernels field is unnamed");

std::string kda_kernel_names() {
  std::string all;
  for (const auto& [name, field] : kKdaKernelFields) {
    if (!all.empty()) all += ", ";
    all += name;
  }
  return all;
}
}  // namespace

KdaKernels parse_kda_kernels(const std::string& s) {
  KdaKernels k;
  if (s == "default") return k;
  MT_CHECK(!s.empty(), ValueError,
           "KDA kernels: empty (\"default\", or name=on|off joined by ':')");
  for (size_t at = 0; at <= s.size();) {
    const size_t end = std::min(s.find(':', at), s.size());
    const std::string part = s.substr(at, end - at);
    const size_t eq = part.find('=');
    const std::string name = part.substr(0, eq),
                      value = eq == std::string::npos ? "" : part.substr(eq + 1);
    const auto* f = std::find_if(std::begin(kKdaKernelFields), std::end(kKdaKernelFields),
                                 [&](const auto& e) { return name == e.first; });
    MT_CHECK(f != std::end(kKdaKernelFields), ValueError, "KDA kernels \"", s,
             "\": unknown choice \"", name, "\" (one of ", kda_kernel_names(),
             ", each =on or =off)");
    MT_CHECK(value == "on" || value == "off", ValueError, "KDA kernels \"", s, "\": \"", part,
             "\" must end in =on or =off");
    k.*(f->second) = value == "on";
    at = end + 1;
  }
  return k;
}

std::string kda_kernels_name(const KdaKernels& k) {
  const KdaKernels d;
  std::string out;
  for (const auto& [name, field] : kKdaKernelFields) {
    if (k.*field == d.*field) continue;
    if (!out.empty()) out += ':';
    out += name;
    out += k.*field ? "=on" : "=off";
  }
  return out.empty() ? "default" : out;
}

int64_t kda_chunk_workspace_floats(const KdaParams& p, int64_t chunks, bool backward, bool prepared,
                                   DType dtype) {
  const KdaChunkLayout lay{p.chunk, p.head_k, p.head_v};
  const int64_t table = kda_chunk_table_ints(chunks, p.num_seqs, p.heads);  // i32 in f32 slots
  // Backward: Delta, dR and the outgoing dS per chunk (forward's state pass forms each chunk's
  // output in the same step, so it keeps nothing per chunk but the prepared blocks).
  const int64_t back = backward ? chunks * p.heads * (lay.back_block() + p.head_k * p.head_v) : 0;
  return table + (prepared ? 0 : kda_prepared_floats(p, chunks, dtype)) + back;
}

int64_t kda_prepared_floats(const KdaParams& p, int64_t chunks, DType dtype) {
  return chunks * p.heads * kda_chunk_layout(p, dtype).block();
}

int64_t kda_scratch_floats(const KdaParams& p, int threads, bool backward) {
  return cpu::kda_scratch_floats(p, threads, backward);
}

void kda_forward(Context& ctx, const KdaParams& p, const Tensor& cu_seqlens, const Tensor& q,
                 const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                 const Tensor& h0, Tensor& o, Tensor& hT, Tensor& saved, Tensor& prepared) {
  check_params(p, cu_seqlens);
  check_inputs(p, q, k, v, g, beta);
  expect_shape(o, {p.tokens, p.heads, p.head_v}, "kda o");
  if (h0.defined()) expect_shape(h0, state_shape(p), "kda h0");
  if (hT.defined()) expect_shape(hT, state_shape(p), "kda hT");
  if (op_device("kda_forward", {&cu_seqlens, &q, &k, &v, &g, &beta, &h0, &o, &hT, &saved,
                                &prepared}) == Device::CUDA) {
#if MOETRAIN_WITH_CUDA
    check_saved_bounds(p, saved);
    check_saved_dtype(p, saved, q.dtype());
    check_prepared(p, saved, prepared, q.dtype());
    return cuda::kda_forward(ctx, p, cu_seqlens, q, k, v, g, beta, h0, o, hT, saved, prepared);
#else
    no_cuda_backend("kda_forward");
#endif
  }
  expect_shape(saved, {kda_saved_rows(p, cu_seqlens), p.heads, p.head_k, p.head_v}, "kda saved");
  cpu::kda_forward(ctx, p, cu_seqlens, q, k, v, g, beta, h0, o, hT, saved, prepared);
}

void kda_backward(Context& ctx, const KdaParams& p, const Tensor& cu_seqlens, const Tensor& q,
                  const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                  const Tensor& saved, Tensor& prepared, const Tensor& dout, const Tensor& dhT,
                  Tensor& dq, Tensor& dk, Tensor& dv, Tensor& dg, Tensor& dbeta, Tensor& dh0) {
  check_params(p, cu_seqlens);
  check_inputs(p, q, k, v, g, beta);
  expect_shape(dout, {p.tokens, p.heads, p.head_v}, "kda dout");
  if (dhT.defined()) expect_shape(dhT, state_shape(p), "kda dhT");
  if (dh0.defined()) expect_shape(dh0, state_shape(p), "kda dh0");
  expect_shape(dq, q.shape(), "kda dq");
  expect_shape(dk, k.shape(), "kda dk");
  expect_shape(dv, v.shape(), "kda dv");
  expect_shape(dg, g.shape(), "kda dg");
  expect_shape(dbeta, beta.shape(), "kda dbeta");
  if (op_device("kda_backward", {&cu_seqlens, &q, &k, &v, &g, &beta, &saved, &prepared, &dout, &dhT,
                                 &dq, &dk, &dv, &dg, &dbeta, &dh0}) == Device::CUDA) {
#if MOETRAIN_WITH_CUDA
    check_saved_bounds(p, saved);
    check_saved_dtype(p, saved, q.dtype());
    check_prepared(p, saved, prepared, q.dtype());
    return cuda::kda_backward(ctx, p, cu_seqlens, q, k, v, g, beta, saved, prepared, dout, dhT, dq,
                              dk, dv, dg, dbeta, dh0);
#else
    no_cuda_backend("kda_backward");
#endif
  }
  expect_shape(saved, {kda_saved_rows(p, cu_seqlens), p.heads, p.head_k, p.head_v}, "kda saved");
  cpu::kda_backward(ctx, p, cu_seqlens, q, k, v, g, beta, saved, prepared, dout, dhT, dq, dk, dv,
                    dg, dbeta, dh0);
}

}  // namespace mt::ops
