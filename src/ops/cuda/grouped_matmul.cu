// Grouped matmul on the GPU: one grouped GEMM launch per call for all non-empty groups. The bf16
// forms (the weight gradient into f32 dW) go to CUTLASS's Hopper grouped kernels (cutlass/
// grouped_gemm_sm90.h: TMA + wgmma, about twice cuBLAS's grouped GEMM there, which ran an sm80
// kernel, and one launch where the bf16 weight gradient took one cuBLASLt call per group); the
// rest (f32, rows TMA cannot address) to cuBLAS's grouped GEMM (cublasGemmGroupedBatchedEx). The
// host holds the group offsets (the routing plan's host copy, read once per MoE layer), so it lays
// out the per-group problem sizes; the per-group matrix addresses are formed on the device by a
// small kernel from the same offsets, passed by value (no host-to-device copy, no wait). dW is f32
// (a parameter gradient). More groups than one launch's table holds fall back to one cuBLASLt call
// per group. bf16 calls where one dimension is a LoRA rank (at most 64) go first to the skinny
// kernels of lora_grouped.h.
#include <algorithm>
#include <iterator>
#include <vector>

#include "core/cuda/resources.h"
#include "ops/cuda/blas.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cutlass/grouped_gemm_sm90.h"
#include "ops/cuda/cutlass/grouped_gemm_sm90_swiglu.h"
#include "ops/cuda/grouped_matmul.h"
#include "ops/cuda/lora_grouped.h"
#include "ops/grouped_matmul.h"

namespace mt::ops::cuda {

static_assert(kSm90Kernels == std::size(kGroupedGemmKernels) &&
                  kSm90WgradKernels == std::size(kGroupedWgradKernels),
              "every named grouped GEMM kernel is compiled (cutlass/grouped_gemm_sm90.h)");

namespace {

// C_g *= beta for the empty groups of a weight-gradient call (C_g = beta C_g + nothing), all in
// one launch (blockIdx.y: the group): one launch per empty expert cost a launch each where a
// skewed routing leaves many idle.
struct EmptyGroups {
  int32_t group[kMaxGroups];
};

__global__ void scale_groups_kernel(EmptyGroups e, int64_t n, float beta, float* c) {
  float* block = c + static_cast<int64_t>(e.group[blockIdx.y]) * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    block[i] = beta == 0.f ? 0.f : beta * block[i];
}

// The weight-gradient form's empty groups of dW [G, out, in] (f32, contiguous): scaled by beta,
// kMaxGroups per launch.
void scale_empty_groups(Context& ctx, const int32_t* off, int64_t G, int64_t wsize, float beta,
                        float* c) {
  EmptyGroups e;
  int n = 0;
  const auto launch = [&] {
    const auto per_group = std::max<int64_t>(1, 1024 / n);
    scale_groups_kernel<<<dim3(blocks_for(wsize, 256, per_group), static_cast<unsigned>(n)), 256, 0,
                          stream(ctx)>>>(e, wsize, beta, c);
    MT_CUDA_LAUNCH_CHECK();
    n = 0;
  };
  for (int64_t g = 0; g < G; ++g) {
    if (off[g + 1] != off[g]) continue;
    e.group[n++] = static_cast<int32_t>(g);
    if (n == kMaxGroups) launch();
  }
  if (n > 0) launch();
}

MatRef rows_of(const Tensor& t, int64_t r0) {
  const auto* base = static_cast<const char*>(t.raw());
  return {base + r0 * t.stride(0) * static_cast<int64_t>(dtype_size(t.dtype())), t.dtype(),
          t.stride(0)};
}

// Group g's [out, in] block of W [G, out, in] (a row-pitched view, or contiguous).
MatRef weight_of(const Tensor& w, int64_t g) {
  return {static_cast<const char*>(w.raw()) +
              g * w.stride(0) * static_cast<int64_t>(dtype_size(w.dtype())),
          w.dtype(), w.stride(1)};
}

void* rows_ptr(const Tensor& t, int64_t r0) {
  return static_cast<char*>(t.raw()) +
         r0 * t.stride(0) * static_cast<int64_t>(dtype_size(t.dtype()));
}

// Where one operand of group g starts: base + row0 * row_bytes + g * group_bytes (rows of the
// packed operands, or whole [out, in] blocks of W).
struct Operand {
  const char* base;
  int64_t row_bytes, group_bytes;
  __device__ const char* at(int32_t g, int32_t r0) const {
    return base + r0 * row_bytes + static_cast<int64_t>(g) * group_bytes;
  }
};

__global__ void addresses_kernel(GroupRows t, int n, Operand a, Operand b, Operand c,
                                 const void** pa, const void** pb, void** pc) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  pa[i] = a.at(t.group[i], t.row0[i]);
  pb[i] = b.at(t.group[i], t.row0[i]);
  pc[i] = const_cast<char*>(c.at(t.group[i], t.row0[i]));
}

cudaDataType_t blas_type(DType t) {
  return t == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

// cuBLAS is column-major: row-major C = op(A) op(B) is C^T = op(B)^T op(A)^T, so cuBLAS's A is
// our B and its B our A (as in blas.cu). Per group: our op dims (m, n, k), our A / B / C.
struct Problem {
  bool trans_a, trans_b;
  Operand a, b, c;
  int64_t lda, ldb, ldc;
  DType ab, ct;
};

void grouped_call(Context& ctx, const Problem& pr, const GroupRows& table,
                  const std::vector<int>& m, const std::vector<int>& n, const std::vector<int>& k,
                  float alpha, float beta) {
  const int count = static_cast<int>(m.size());
  CudaResources& cr = cuda_resources(ctx);
  ArenaScope scope(ctx.workspace());
  Tensor ptrs = ctx.workspace().alloc({3 * static_cast<int64_t>(count)}, DType::I64);
  auto** base = static_cast<void**>(ptrs.raw());
  const void** pa = const_cast<const void**>(base);
  const void** pb = const_cast<const void**>(base + count);
  void** pc = base + 2 * count;
  // cuBLAS's A is our B, its B our A.
  addresses_kernel<<<blocks_for(count, 128), 128, 0, cr.stream>>>(table, count, pr.b, pr.a, pr.c,
                                                                  pa, pb, pc);
  MT_CUDA_LAUNCH_CHECK();
  const std::vector<cublasOperation_t> opa(count, pr.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N),
      opb(count, pr.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  const std::vector<int> lda(count, static_cast<int>(pr.ldb)), ldb(count, static_cast<int>(pr.lda)),
      ldc(count, static_cast<int>(pr.ldc)), ones(count, 1);
  const std::vector<float> alphas(count, alpha), betas(count, beta);
  MT_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
      cr.blas, opa.data(), opb.data(), n.data(), m.data(), k.data(), alphas.data(), pa,
      blas_type(pr.ab), lda.data(), pb, blas_type(pr.ab), ldb.data(), betas.data(), pc,
      blas_type(pr.ct), ldc.data(), count, ones.data(), CUBLAS_COMPUTE_32F));
}

// The non-empty groups of `off` [G + 1] into `table`; their count, or -1 past kMaxGroups.
int group_rows(const int32_t* off, int64_t G, GroupRows& table) {
  int i = 0;
  for (int64_t g = 0; g < G; ++g)
    if (off[g + 1] > off[g]) {
      if (i == kMaxGroups) return -1;
      table.group[i] = static_cast<int32_t>(g);
      table.row0[i] = off[g];
      table.rows[i++] = off[g + 1] - off[g];
    }
  return i;
}

Sm90Launch sm90_launch(Context& ctx, const GroupedGemmConfig& cfg) {
  CudaResources& cr = cuda_resources(ctx);
  return {cr.stream,
          cr.device,
          cr.multiprocessors,
          {cfg.kernel, cfg.dx_kernel, cfg.wgrad, cfg.swizzle, cfg.along_n}};
}

// Runs `launch(scratch)` with `bytes` of 256-byte aligned workspace scratch; `what()` names the
// call in errors (formed only then).
template <typename What, typename Launch>
void with_sm90_scratch(Context& ctx, size_t bytes, const What& what, const Launch& launch) {
  MT_CHECK(bytes + 256 <= kGroupedMatmulScratchBytes, InternalError, what(), ": needs ",
           bytes + 256, " bytes of scratch, over the ", kGroupedMatmulScratchBytes,
           " the planner reserves");
  ArenaScope scope(ctx.workspace());
  // +256 to align the start: the arena aligns to 64 bytes, TMA descriptors want more.
  Tensor scratch = ctx.workspace().alloc({static_cast<int64_t>(bytes / 8 + 33)}, DType::I64);
  const auto base = (reinterpret_cast<uintptr_t>(scratch.raw()) + 255) / 256 * 256;
  const char* failed = launch(reinterpret_cast<void*>(base));
  MT_CHECK(failed == nullptr, InternalError, what(), ": ", failed ? failed : "");
}

// The forward forms' W operand: group stride and row pitch of W [G, rows, cols] (set whatever W's
// layout, so that a block of its rows can be passed by moving the base).
void set_weight(Sm90Grouped& g, const Tensor& w) {
  g.b = w.raw();
  g.ldw = w.stride(1);
  g.w_group = w.stride(0);
}

// The bf16 forms on CUTLASS's Hopper kernels; false when their alignment rules refuse the
// operands (the caller then takes cuBLAS).
bool sm90_grouped(Context& ctx, const GroupedMatmulParams& p, const Tensor& a, const Tensor& b,
                  Tensor& c, const GroupRows& table, int count) {
  Sm90Grouped g;
  g.a = a.raw();
  g.lda = a.stride(0);
  g.b = b.raw();
  g.c = c.raw();
  g.alpha = p.alpha;
  g.beta = p.beta;
  switch (p.form) {
    case GroupedForm::XWt:    // W [G, n, k]
    case GroupedForm::DyW: {  // W [G, k, n]
      const bool fwd = p.form == GroupedForm::XWt;
      g.form = fwd ? Sm90Form::Forward : Sm90Form::InputGrad;
      g.n = b.dim(fwd ? 1 : 2);
      g.k = b.dim(fwd ? 2 : 1);
      g.ldc = c.stride(0);
      if (!b.is_contiguous()) {  // a block of a padded buffer (grouped_matmul.h)
        g.ldw = b.stride(1);
        g.w_group = b.stride(0);
      }
      break;
    }
    case GroupedForm::DytX:  // dW [G, m, n] f32
      if (c.dtype() != DType::F32 || !c.is_contiguous()) return false;
      g.form = Sm90Form::WeightGrad;
      g.ldb = b.stride(0);
      g.m = c.dim(1);
      g.n = c.dim(2);
      break;
  }
  if (!sm90_grouped_fits(g, count)) return false;
  const GroupedGemmConfig& cfg = p.gemm ? *p.gemm : grouped_gemm_config_from_env();
  const Sm90Launch at = sm90_launch(ctx, cfg);
  with_sm90_scratch(
      ctx, sm90_grouped_scratch(g, table, count, at),
      [&] {
        return cat("grouped_matmul (CUTLASS sm90 ", grouped_gemm_config_name(cfg), ", ", count,
                   " groups, m ", g.m, ", n ", g.n, ", k ", g.k, ")");
      },
      [&](void* scratch) { return sm90_grouped_gemm(g, table, count, at, scratch); });
  return true;
}

// The fused SwiGLU GEMM `g` with its epilogue `s` (a plain GEMM first where `first` is set).
bool sm90_swiglu(Context& ctx, const GroupedGemmConfig& cfg, const Tensor& offsets,
                 const Sm90Grouped* first, const Sm90Grouped& g, const Sm90Swiglu& s) {
  if (g.a == nullptr || offsets.dim(0) < 2) return false;
  GroupRows table;
  const int count = group_rows(offsets.i32(), offsets.dim(0) - 1, table);
  if (count == 0) return true;  // no rows: nothing to write
  if (count < 0 || (first && !sm90_grouped_fits(*first, count)) || !sm90_swiglu_fits(g, s, count))
    return false;
  const Sm90Launch at = sm90_launch(ctx, cfg);
  if (first)
    with_sm90_scratch(
        ctx, sm90_grouped_scratch(*first, table, count, at),
        [&] {
          return cat("grouped_ffn gate half (CUTLASS sm90 ", grouped_gemm_config_name(cfg), ", ",
                     count, " groups, n ", first->n, ", k ", first->k, ")");
        },
        [&](void* scratch) { return sm90_grouped_gemm(*first, table, count, at, scratch); });
  with_sm90_scratch(
      ctx, sm90_swiglu_scratch(g, s, table, count, at),
      [&] {
        return cat("grouped_ffn SwiGLU epilogue (CUTLASS sm90, ", count, " groups, n ", g.n, ", k ",
                   g.k, ")");
      },
      [&](void* scratch) { return sm90_swiglu_gemm(g, s, table, count, at, scratch); });
  return true;
}

// A forward form over A's and C's rows and W [G, ...] at its strides (set_weight: a block of a
// padded buffer too), n and k given (alpha 1, beta 0).
Sm90Grouped rows_gemm(Sm90Form form, const Tensor& a, const Tensor& w, Tensor& c, int64_t n,
                      int64_t k) {
  Sm90Grouped g;
  g.form = form;
  g.a = a.raw();
  g.lda = a.stride(0);
  set_weight(g, w);
  g.c = c.raw();
  g.ldc = c.stride(0);
  g.n = n;
  g.k = k;
  return g;
}

}  // namespace

bool grouped_gate_up_lora_xa(Context& ctx, const Tensor& xp, const Tensor& offsets,
                             const Tensor& w_gu, int64_t rank, Tensor& gate_up, Tensor* h) {
  if (xp.dtype() != DType::BF16 || w_gu.dtype() != DType::BF16 || gate_up.dtype() != DType::BF16 ||
      w_gu.ndim() != 3 || w_gu.stride(2) != 1 || offsets.dim(0) != w_gu.dim(0) + 1)
    return false;
  // h: the interleaved layout's SwiGLU in the epilogue, 16-byte rows, 2F whole 32-column sub-tiles.
  if (h && (h->dtype() != DType::BF16 || h->stride(1) != 1 || h->stride(0) % 8 != 0 ||
            reinterpret_cast<uintptr_t>(h->raw()) % 16 != 0 || w_gu.dim(1) % 32 != 0))
    return false;
  const int64_t E = w_gu.dim(0), n = w_gu.dim(1), k = w_gu.dim(2);
  // xa goes into xp's columns k - rank .. (its padding), A_gu comes from the buffer's rows n ..
  // n + rank - 1 past the block: both must be there.
  if (xp.dim(1) != k || w_gu.stride(1) < k || w_gu.stride(0) != (n + rank) * w_gu.stride(1))
    return false;
  const Sm90Grouped g = rows_gemm(Sm90Form::Forward, xp, w_gu, gate_up, n, k);
  // A_gu: the rows after the block, 16-byte aligned for the side pack's loads.
  const auto* a_rows = static_cast<const char*>(w_gu.raw()) + n * w_gu.stride(1) * 2;
  if (reinterpret_cast<uintptr_t>(a_rows) % 16 != 0 || w_gu.stride(1) % 8 != 0 ||
      w_gu.stride(0) % 8 != 0)
    return false;
  GroupRows table;
  const int count = group_rows(offsets.i32(), E, table);
  if (count == 0) return true;  // no rows: nothing to write
  if (count < 0 || !sm90_lora_xa_fits(g, k - rank, rank, count)) return false;
  const Sm90Launch at = sm90_launch(ctx, GroupedGemmConfig{});
  ArenaScope scope(ctx.workspace());
  Tensor side = ctx.workspace().alloc({sm90_lora_xa_side_elems(E, k)}, DType::BF16);
  const char* failed = sm90_lora_xa_side_pack(a_rows, w_gu.stride(1), w_gu.stride(0), E, k - rank,
                                              k, false, side.raw(), at.stream);
  MT_CHECK(failed == nullptr, InternalError, "grouped_ffn gate/up with xa: ", failed);
  with_sm90_scratch(
      ctx, sm90_lora_xa_scratch(g, table, count, at, h != nullptr),
      [&] {
        return cat("grouped_ffn gate/up with xa", h ? " and SwiGLU" : "", " (CUTLASS sm90, ", count,
                   " groups, n ", n, ", k ", k, ")");
      },
      [&](void* scratch) {
        return sm90_lora_xa_gemm(g, side.raw(), sm90_lora_xa_side_elems(1, k), table, count, at,
                                 scratch, h ? h->raw() : nullptr, h ? h->stride(0) : 0);
      });
  return true;
}

bool grouped_dx_lora_dr(Context& ctx, const Tensor& dyp, const Tensor& offsets, const Tensor& w_dx,
                        int64_t rank, const Tensor& r_rows, float scale, Tensor& db, Tensor& dx) {
  if (dyp.dtype() != DType::BF16 || w_dx.dtype() != DType::BF16 || dx.dtype() != DType::BF16 ||
      r_rows.dtype() != DType::BF16 || db.dtype() != DType::F32 || w_dx.ndim() != 3 ||
      w_dx.stride(2) != 1 || offsets.dim(0) != w_dx.dim(0) + 1)
    return false;
  const int64_t E = w_dx.dim(0), k = w_dx.dim(1), n = w_dx.dim(2), out = k - rank;
  // dr goes into dyp's columns out .. (its padding), s B comes from the buffer's columns n .. n +
  // rank - 1 past the block, A from its rows out ..: all must be there.
  if (dyp.dim(1) != k || w_dx.stride(1) < n + rank || w_dx.stride(0) != k * w_dx.stride(1) ||
      r_rows.dim(0) != dyp.dim(0) || r_rows.dim(1) != rank || r_rows.stride(1) != 1 ||
      r_rows.stride(0) % 8 != 0 || reinterpret_cast<uintptr_t>(r_rows.raw()) % 16 != 0 ||
      db.ndim() != 3 || db.dim(0) != E || db.dim(1) != out || db.dim(2) != rank ||
      !db.is_contiguous())
    return false;
  const Sm90Grouped g = rows_gemm(Sm90Form::InputGrad, dyp, w_dx, dx, n, k);
  GroupRows table;
  const int count = group_rows(offsets.i32(), E, table);
  if (count == 0) return true;  // no rows: nothing to write
  if (count < 0 || !sm90_lora_dr_fits(g, out, rank, count) || !sm90_lora_dr_pays(g, table, count))
    return false;
  const Sm90Launch at = sm90_launch(ctx, GroupedGemmConfig{});
  ArenaScope scope(ctx.workspace());
  Tensor side = ctx.workspace().alloc({sm90_lora_xa_side_elems(E, k)}, DType::BF16);
  const auto* sb_cols = static_cast<const char*>(w_dx.raw()) + n * 2;
  const char* failed = sm90_lora_xa_side_pack(sb_cols, w_dx.stride(1), w_dx.stride(0), E, out, k,
                                              true, side.raw(), at.stream);
  MT_CHECK(failed == nullptr, InternalError, "grouped_ffn dX with dr: ", failed);
  const Sm90LoraDb dbt{.r = r_rows.raw(),
                       .ldr = r_rows.stride(0),
                       .db = static_cast<float*>(db.raw()),
                       .db_group = out * rank,
                       .scale = scale};
  with_sm90_scratch(
      ctx, sm90_lora_dr_scratch(g, table, count, at),
      [&] {
        return cat("grouped_ffn dX with dr and dB (CUTLASS sm90, ", count, " groups, n ", n, ", k ",
                   k, ")");
      },
      [&](void* scratch) {
        return sm90_lora_dr_gemm(g, side.raw(), sm90_lora_xa_side_elems(1, k), dbt, table, count,
                                 at, scratch);
      });
  return true;
}

void grouped_matmul(Context& ctx, const GroupedMatmulParams& p, const Tensor& a,
                    const Tensor& offsets, const Tensor& b, Tensor& c) {
  const bool dw = p.form == GroupedForm::DytX;
  const Tensor& w = dw ? c : b;
  const int64_t G = w.dim(0), out = w.dim(1), in = w.dim(2);
  expect_same_dtype("grouped_matmul", a, b, dw ? "X" : "W");
  if (dw)
    expect_f32("grouped_matmul", c, "dW");
  else
    expect_same_dtype("grouped_matmul", a, c, "C");
  const int32_t* off = offsets.i32();
  const int64_t wsize = out * in;
  // Empty groups: the weight-gradient form still scales its block by beta.
  if (dw && p.beta != 1.f && wsize > 0)
    scale_empty_groups(ctx, off, G, wsize, p.beta, ptr<float>(c));

  int count = 0;
  for (int64_t g = 0; g < G; ++g) count += off[g + 1] > off[g];
  if (count == 0) return;
  // Expert LoRA's rank-r products (one dimension at most 64) on the skinny kernels.
  if (a.dtype() == DType::BF16 && skinny_grouped_matmul(ctx, p, a, offsets, b, c)) return;
  GroupRows table;
  if (count <= kMaxGroups) {
    group_rows(off, G, table);
    if (a.dtype() == DType::BF16 && sm90_grouped(ctx, p, a, b, c, table, count)) return;
  }
  // cuBLAS's grouped GEMM takes one type for A, B and C (bf16 or f32): the bf16 weight-gradient
  // form (f32 dW) that CUTLASS refused goes group by group through cuBLASLt.
  const bool same_types = !(dw && a.dtype() != DType::F32);
  const bool fits = same_types && count <= kMaxGroups && out <= INT32_MAX && in <= INT32_MAX &&
                    a.stride(0) <= INT32_MAX && b.stride(0) <= INT32_MAX &&
                    b.stride(1) <= INT32_MAX && c.stride(0) <= INT32_MAX;
  if (!fits) {  // one cuBLASLt call per group
    for (int64_t g = 0; g < G; ++g) {
      const int64_t r0 = off[g], m = off[g + 1] - off[g];
      if (m == 0) continue;
      switch (p.form) {
        case GroupedForm::XWt:
          lt_matmul(ctx, false, true, m, out, in, p.alpha, rows_of(a, r0), weight_of(b, g), p.beta,
                    rows_ptr(c, r0), c.dtype(), c.stride(0));
          break;
        case GroupedForm::DyW:
          lt_matmul(ctx, false, false, m, in, out, p.alpha, rows_of(a, r0), weight_of(b, g), p.beta,
                    rows_ptr(c, r0), c.dtype(), c.stride(0));
          break;
        case GroupedForm::DytX:
          lt_matmul(ctx, true, false, out, in, m, p.alpha, rows_of(a, r0), rows_of(b, r0), p.beta,
                    ptr<float>(c) + g * wsize, DType::F32, in);
          break;
      }
    }
    return;
  }

  std::vector<int> M, N, K;
  for (int i = 0; i < count; ++i) {
    const int64_t m = table.rows[i];
    switch (p.form) {
      case GroupedForm::XWt:  // C_g [m, out] = A_g [m, in] W_g^T
        M.push_back(static_cast<int>(m));
        N.push_back(static_cast<int>(out));
        K.push_back(static_cast<int>(in));
        break;
      case GroupedForm::DyW:  // C_g [m, in] = A_g [m, out] W_g
        M.push_back(static_cast<int>(m));
        N.push_back(static_cast<int>(in));
        K.push_back(static_cast<int>(out));
        break;
      case GroupedForm::DytX:  // dW_g [out, in] = A_g^T [out, m] X_g [m, in]
        M.push_back(static_cast<int>(out));
        N.push_back(static_cast<int>(in));
        K.push_back(static_cast<int>(m));
        break;
    }
  }
  const auto rows = [](const Tensor& t) {
    return Operand{static_cast<const char*>(t.raw()),
                   t.stride(0) * static_cast<int64_t>(dtype_size(t.dtype())), 0};
  };
  const auto blocks = [&](const Tensor& t) {  // W's groups (any stride), or dW's (contiguous)
    return Operand{static_cast<const char*>(t.raw()), 0,
                   t.stride(0) * static_cast<int64_t>(dtype_size(t.dtype()))};
  };
  Problem pr{};
  pr.ab = a.dtype();
  pr.ct = c.dtype();
  switch (p.form) {
    case GroupedForm::XWt:
      pr = {false,       true,        rows(a),     blocks(b), rows(c),
            a.stride(0), b.stride(1), c.stride(0), a.dtype(), c.dtype()};
      break;
    case GroupedForm::DyW:
      pr = {false,       false,       rows(a),     blocks(b), rows(c),
            a.stride(0), b.stride(1), c.stride(0), a.dtype(), c.dtype()};
      break;
    case GroupedForm::DytX:
      pr = {true,        false,       rows(a), rows(b),   blocks(c),
            a.stride(0), b.stride(0), in,      a.dtype(), DType::F32};
      break;
  }
  grouped_call(ctx, pr, table, M, N, K, p.alpha, p.beta);
}

bool grouped_gate_up_swiglu(Context& ctx, const GroupedGemmConfig& cfg, const Tensor& x,
                            const Tensor& offsets, const Tensor& w_gu, Tensor& gate_up, Tensor& h) {
  if (x.dtype() != DType::BF16 || w_gu.dtype() != DType::BF16 || gate_up.dtype() != DType::BF16 ||
      h.dtype() != DType::BF16 || w_gu.ndim() != 3 || w_gu.stride(2) != 1 ||
      gate_up.stride(1) != 1 || h.stride(1) != 1)
    return false;
  const int64_t F = w_gu.dim(1) / 2;
  const auto esize = static_cast<int64_t>(dtype_size(DType::BF16));
  // g = X W_g^T into gate_up's first F columns
  Sm90Grouped gate = rows_gemm(Sm90Form::Forward, x, w_gu, gate_up, F, w_gu.dim(2));
  Sm90Grouped up = gate;  // u = X W_u^T into the last F, h beside it
  up.b = static_cast<const char*>(w_gu.raw()) + F * w_gu.stride(1) * esize;
  up.c = static_cast<char*>(gate_up.raw()) + F * esize;
  const Sm90Swiglu s{Sm90SwigluForm::Up, gate_up.raw(),    gate_up.stride(0), h.raw(),
                     h.stride(0),        cfg.swiglu_narrow};
  return sm90_swiglu(ctx, cfg, offsets, &gate, up, s);
}

bool grouped_gate_up_swiglu_interleaved(Context& ctx, const GroupedGemmConfig& cfg, const Tensor& x,
                                        const Tensor& offsets, const Tensor& w_gu, Tensor& gate_up,
                                        Tensor& h) {
  if (x.dtype() != DType::BF16 || w_gu.dtype() != DType::BF16 || gate_up.dtype() != DType::BF16 ||
      h.dtype() != DType::BF16 || w_gu.ndim() != 3 || w_gu.stride(2) != 1 ||
      gate_up.stride(1) != 1 || h.stride(1) != 1)
    return false;
  const Sm90Grouped g = rows_gemm(Sm90Form::Forward, x, w_gu, gate_up, w_gu.dim(1), w_gu.dim(2));
  const Sm90Swiglu s{Sm90SwigluForm::UpInterleaved, nullptr, 0, h.raw(), h.stride(0), false};
  return sm90_swiglu(ctx, cfg, offsets, nullptr, g, s);
}

bool grouped_down_swiglu_backward(Context& ctx, const GroupedGemmConfig& cfg, const Tensor& dy,
                                  const Tensor& offsets, const Tensor& w_down,
                                  const Tensor& gate_up, Tensor& dgate_up, const Tensor& h) {
  const bool has_h = h.defined();
  if (dy.dtype() != DType::BF16 || w_down.dtype() != DType::BF16 ||
      gate_up.dtype() != DType::BF16 || dgate_up.dtype() != DType::BF16 ||
      (has_h && h.dtype() != DType::BF16) || w_down.ndim() != 3 || w_down.stride(2) != 1 ||
      gate_up.stride(1) != 1 || dgate_up.stride(1) != 1 || (has_h && h.stride(1) != 1))
    return false;
  // dh = dY W_down, never written: the epilogue turns it into dgate_up
  const Sm90Grouped g =
      rows_gemm(Sm90Form::InputGrad, dy, w_down, dgate_up, w_down.dim(2), w_down.dim(1));
  const Sm90Swiglu s{Sm90SwigluForm::DownBackward, gate_up.raw(),           gate_up.stride(0),
                     has_h ? h.raw() : nullptr,    has_h ? h.stride(0) : 0, cfg.swiglu_narrow};
  return sm90_swiglu(ctx, cfg, offsets, nullptr, g, s);
}

}  // namespace mt::ops::cuda
