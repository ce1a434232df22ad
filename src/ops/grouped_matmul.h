// Grouped matmul: rows sorted by group (ops/moe_dispatch.h sorts token rows by expert), group g
// owning rows [offsets[g], offsets[g+1]), one weight matrix per group in one tensor W [G, out, in].
// It is the only way expert weights meet activations, so a GEMM is never called per expert from
// outside the op (a CUDA path runs all groups in one launch). Three forms, per group g:
//   XWt : C_g = alpha * A_g W_g^T + beta * C_g    A = X [N, in],   B = W [G, out, in], C [N, out]
//   DyW : C_g = alpha * A_g W_g   + beta * C_g    A = dY [N, out], B = W [G, out, in], C [N, in]
//   DytX: C_g = alpha * A_g^T B_g + beta * C_g    A = dY [N, out], B = X [N, in],  C = dW [G, out,
//   in]
// XWt is the forward, DyW the input gradient (written with beta = 0), DytX the weight gradient
// (accumulated with beta = 1). An empty group leaves its rows alone and, in DytX, only scales its
// C_g by beta. Row operands ([N, *]) may be row-strided views (cols() of a fused buffer); dW is
// contiguous, and so is W on the CPU; a GPU's W may be a row-pitched block of a larger buffer
// (stride(2) = 1, any row pitch and group stride: the K-concatenated expert LoRA weights of
// ops/grouped_ffn.h).
#pragma once

#include <algorithm>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/context.h"
#include "core/tensor.h"
#include "ops/backends.h"

namespace mt::ops {

enum class GroupedForm { XWt, DyW, DytX };

// The GPU's grouped GEMM configuration (ops/cuda/cutlass/grouped_gemm_sm90.h), for tuning: the
// compiled kernel of the bf16 forward form, optionally another for the input gradient and one of
// the weight gradient's kernels, and the tile scheduler's swizzle and raster order, named
// "kernel[:sN][:n][:dx=kernel][:dw=wgrad][:down=kernel][:swiglu[=fwd|=bwd|=off]][:narrow]" (e.g.
// "pingpong128x128c2x1:s4:n": swizzle 4, rastered along N;
// "coop128x256c2x1:dw=pingpong128x128c1x1": the default forward and input-gradient kernel, a
// ping-pong weight gradient). `down` is the grouped SwiGLU FFN's (ops/grouped_ffn.h) for its down
// projection's forward, whose K (the FFN width, 1,024 at issue 14's shapes) is half the gate/up
// projection's: a tile's MMAs are shorter beside its epilogue, which the ping-pong kernel (its
// default) runs under the other warpgroup's MMAs. The swizzle and raster apply to all forms; the
// CPU and the other GPU paths ignore the configuration.
inline constexpr const char* kGroupedGemmKernels[] = {"coop128x256c2x1", "coop128x256c1x2",
                                                      "coop256x128c2x1", "pingpong128x128c2x1",
                                                      "pingpong64x256c2x1"};
// The weight gradient's kernels (dW f32, both operands read from the row buffers; the rows of a
// group are the reduction): tiles over dW's [out, in].
inline constexpr const char* kGroupedWgradKernels[] = {"coop128x256c2x1",     "pingpong128x128c2x1",
                                                       "pingpong128x128c1x1", "coop256x128c2x1",
                                                       "coop128x256c1x2",     "coop128x256c2x1e16"};
struct GroupedGemmConfig {
  int kernel = 0;      // the forward form's: index into kGroupedGemmKernels
  int dx_kernel = -1;  // the input gradient's: index into kGroupedGemmKernels; -1: `kernel`
  int wgrad = 0;       // the weight gradient's: index into kGroupedWgradKernels
  int swizzle = 1;     // 1, 2, 4 or 8
  bool along_n = false;
  // grouped_ffn's down projection forward: index into kGroupedGemmKernels, or kAutoDownKernel:
  // by the mean rows per expert, the ping-pong 128 x 128 kernel where they are many, `kernel`
  // where they are few. Ping-pong runs a tile's epilogue under the other warpgroup's MMAs, which
  // pays where each expert's rows fill many tiles (session 15, shape A, 2,048 rows per expert: 0.87
  // ms against the cooperative kernel's 1.01, ncu); at 256 rows per expert (shape B) the
  // cooperative kernel's forward is the faster (session 14 1.56-1.59 ms against ping-pong's
  // 1.60-1.62 in sessions 15-17; session 17's sweep in one run: 1.585 against 1.610).
  static constexpr int kAutoDownKernel = -1;
  static constexpr int kPingpongDownKernel = 3;       // pingpong128x128c2x1
  static constexpr int64_t kPingpongDownRows = 1024;  // mean rows per expert from which it runs
  int down_kernel = kAutoDownKernel;
  // grouped_ffn's SwiGLU in the epilogues of its base path's GEMMs (ops/cuda/cutlass/
  // grouped_gemm_sm90_swiglu.h), forward and backward apart: part ":swiglu" (both), ":swiglu=fwd",
  // ":swiglu=bwd" or ":swiglu=off" (neither: the separate SwiGLU passes), named where they differ
  // from the defaults.
  static constexpr bool kDefaultSwigluFwd = false, kDefaultSwigluBwd = false;
  bool swiglu_fwd = kDefaultSwigluFwd, swiglu_bwd = kDefaultSwigluBwd;
  // Their direct loads and stores as 4-byte pairs, where the quad's 16-byte parts are the default
  // (part ":narrow", to compare).
  bool swiglu_narrow = false;
  // The configuration of grouped_ffn's down projection forward over `rows` rows of `experts`
  // experts: `kernel` replaced by down_kernel's choice.
  GroupedGemmConfig down(int64_t rows, int64_t experts) const {
    GroupedGemmConfig c = *this;
    c.kernel = down_kernel != kAutoDownKernel                              ? down_kernel
               : rows >= kPingpongDownRows * std::max<int64_t>(experts, 1) ? kPingpongDownKernel
                                                                           : kernel;
    return c;
  }
};
// Throws ValueError naming `name` and the choices unless it names a configuration.
GroupedGemmConfig parse_grouped_gemm_config(std::string_view name);
std::string grouped_gemm_config_name(const GroupedGemmConfig& c);
// The calls' configuration unless they carry their own: MOETRAIN_GROUPED_GEMM's (the one
// environment read of the op, at the first call; unset or empty: the default), thrown on
// (ValueError) at every call while it does not parse.
const GroupedGemmConfig& grouped_gemm_config_from_env();

struct GroupedMatmulParams {
  GroupedForm form = GroupedForm::XWt;
  float alpha = 1.f, beta = 0.f;
  std::optional<GroupedGemmConfig> gemm;  // unset: grouped_gemm_config_from_env()
};

// Bytes of workspace one call may take at most (the GPU's per-group address tables and CUTLASS's
// scratch: about 100 KB for 256 groups on the H200); the planner reserves it
// (plan/model_stats.cpp).
constexpr size_t kGroupedMatmulScratchBytes = size_t{1} << 20;

// offsets: i32 [G+1] in host memory (the routing plan's host copy), offsets[0] = 0,
// non-decreasing, offsets[G] = N; G, N, in and out are read from the operands.
using GroupedMatmul = void(Context& ctx, const GroupedMatmulParams& p, const Tensor& a,
                           const Tensor& offsets, const Tensor& b, Tensor& c);
GroupedMatmul grouped_matmul;

// Throws ValueError naming `op` unless offsets is a host i32 [groups+1] partition of [0, rows).
void expect_group_offsets(const Tensor& offsets, int64_t groups, int64_t rows, const char* op);

// The backends' bodies, called by the entries above once they validated:
// ops/cpu/grouped_matmul.cpp, and ops/cuda/grouped_matmul.cu in CUDA builds.
MT_OP_BACKENDS(GroupedMatmul grouped_matmul;)

}  // namespace mt::ops
