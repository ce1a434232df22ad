#include "ops/grouped_matmul.h"

#include <algorithm>
#include <cstdlib>

#include "ops/dispatch.h"
#include "ops/gemm.h"

namespace mt::ops {

namespace {

// bf16 weights are for the GPU path; the CPU path computes on f32 storage.
bool gpu_bf16(const Tensor& t) {
  return t.device() != Device::CPU && t.dtype() == DType::BF16;
}

template <size_t N>
std::string choices_of(const char* const (&names)[N]) {
  std::string s;
  for (const char* k : names) s += cat(s.empty() ? "" : ", ", k);
  return s;
}

// The index of `name` in `names`, or -1.
template <size_t N>
int index_of(const char* const (&names)[N], std::string_view name) {
  for (int i = 0; i < static_cast<int>(N); ++i)
    if (name == names[i]) return i;
  return -1;
}

}  // namespace

static_assert(std::string_view(kGroupedGemmKernels[GroupedGemmConfig::kPingpongDownKernel]) ==
                  "pingpong128x128c2x1",
              "the down projection's many-rows kernel is the ping-pong 128 x 128 one");

GroupedGemmConfig parse_grouped_gemm_config(std::string_view name) {
  constexpr const char* kParts =
      ":s1, :s2, :s4, :s8, :n, :dx=<kernel>, :dw=<wgrad kernel>, :down=<kernel>, :swiglu, "
      ":swiglu=fwd, :swiglu=bwd, :swiglu=off, :narrow";
  GroupedGemmConfig c;
  const std::string_view kernel = name.substr(0, name.find(':'));
  c.kernel = index_of(kGroupedGemmKernels, kernel);
  MT_CHECK(c.kernel >= 0, ValueError, "grouped GEMM configuration \"", name,
           "\": unknown kernel \"", kernel, "\" (one of ", choices_of(kGroupedGemmKernels),
           ", then optionally ", kParts, ")");
  for (size_t at = kernel.size(); at < name.size();) {
    const size_t end = std::min(name.find(':', at + 1), name.size());
    const std::string_view part = name.substr(at + 1, end - at - 1);
    if (part == "n") {
      c.along_n = true;
    } else if (part == "s1" || part == "s2" || part == "s4" || part == "s8") {
      c.swizzle = part[1] - '0';
    } else if (part.starts_with("dx=")) {
      c.dx_kernel = index_of(kGroupedGemmKernels, part.substr(3));
      MT_CHECK(c.dx_kernel >= 0, ValueError, "grouped GEMM configuration \"", name,
               "\": unknown input-gradient kernel \"", part.substr(3), "\" (one of ",
               choices_of(kGroupedGemmKernels), ")");
    } else if (part.starts_with("dw=")) {
      c.wgrad = index_of(kGroupedWgradKernels, part.substr(3));
      MT_CHECK(c.wgrad >= 0, ValueError, "grouped GEMM configuration \"", name,
               "\": unknown weight-gradient kernel \"", part.substr(3), "\" (one of ",
               choices_of(kGroupedWgradKernels), ")");
    } else if (part.starts_with("down=")) {
      c.down_kernel = index_of(kGroupedGemmKernels, part.substr(5));
      MT_CHECK(c.down_kernel >= 0, ValueError, "grouped GEMM configuration \"", name,
               "\": unknown down-projection kernel \"", part.substr(5), "\" (one of ",
               choices_of(kGroupedGemmKernels), ")");
    } else if (part == "swiglu" || part == "swiglu=fwd" || part == "swiglu=bwd" ||
               part == "swiglu=off") {
      c.swiglu_fwd = part == "swiglu" || part == "swiglu=fwd";
      c.swiglu_bwd = part == "swiglu" || part == "swiglu=bwd";
    } else if (part == "narrow") {
      c.swiglu_narrow = true;
    } else {
      MT_THROW(ValueError, "grouped GEMM configuration \"", name, "\": unknown part \"", part,
               "\" (", kParts, ")");
    }
    at = end;
  }
  return c;
}

std::string grouped_gemm_config_name(const GroupedGemmConfig& c) {
  std::string s = kGroupedGemmKernels[c.kernel];
  if (c.swizzle != 1) s += cat(":s", c.swizzle);
  if (c.along_n) s += ":n";
  if (c.dx_kernel >= 0 && c.dx_kernel != c.kernel)
    s += cat(":dx=", kGroupedGemmKernels[c.dx_kernel]);
  if (c.wgrad != 0) s += cat(":dw=", kGroupedWgradKernels[c.wgrad]);
  if (c.down_kernel != GroupedGemmConfig::kAutoDownKernel)
    s += cat(":down=", kGroupedGemmKernels[c.down_kernel]);
  if (c.swiglu_fwd != GroupedGemmConfig::kDefaultSwigluFwd ||
      c.swiglu_bwd != GroupedGemmConfig::kDefaultSwigluBwd)
    s += c.swiglu_fwd && c.swiglu_bwd ? ":swiglu"
         : c.swiglu_fwd               ? ":swiglu=fwd"
         : c.swiglu_bwd               ? ":swiglu=bwd"
                                      : ":swiglu=off";
  if (c.swiglu_narrow) s += ":narrow";
  return s;
}

const GroupedGemmConfig& grouped_gemm_config_from_env() {
  static const GroupedGemmConfig config = [] {
    const char* v = std::getenv("MOETRAIN_GROUPED_GEMM");
    return v && *v ? parse_grouped_gemm_config(v) : GroupedGemmConfig{};
  }();
  return config;
}

void expect_group_offsets(const Tensor& offsets, int64_t groups, int64_t rows, const char* op) {
  expect_shape(offsets, {groups + 1}, op);
  MT_CHECK(offsets.dtype() == DType::I32 && offsets.device() == Device::CPU, ValueError, op,
           ": group offsets must be a host i32 tensor, got ", dtype_name(offsets.dtype()), " on ",
           device_name(offsets.device()));
  const int32_t* off = offsets.i32();
  MT_CHECK(off[0] == 0 && off[groups] == rows, ValueError, op, ": group offsets span [", off[0],
           ", ", off[groups], "), expected [0, ", rows, ")");
  for (int64_t g = 0; g < groups; ++g)
    MT_CHECK(off[g] <= off[g + 1], ValueError, op, ": group offsets decrease at group ", g);
}

void grouped_matmul(Context& ctx, const GroupedMatmulParams& p, const Tensor& a,
                    const Tensor& offsets, const Tensor& b, Tensor& c) {
  const bool dw = p.form == GroupedForm::DytX;
  const Tensor& w = dw ? c : b;
  MT_CHECK(w.ndim() == 3 && (w.dtype() == DType::F32 || (!dw && gpu_bf16(w))), ShapeError,
           "grouped_matmul: ", dw ? "dW" : "W", " must be an f32 [groups, out, in] tensor, got ",
           w.shape());
  const int64_t G = w.dim(0), out = w.dim(1), in = w.dim(2), N = a.dim(0);
  // A GPU's W may be a block of a padded buffer (the expert LoRA's K-concatenated weights,
  // ops/grouped_ffn.h): rows of `in` contiguous elements at any pitch, groups at any stride.
  if (!dw && w.device() != Device::CPU && !w.is_contiguous())
    MT_CHECK(w.stride(2) == 1 && w.stride(1) >= in && w.stride(0) >= out * w.stride(1), ShapeError,
             "grouped_matmul W ", w.shape(), ": strides ", w.strides(),
             " are not a row-pitched block");
  else
    expect_shape(w, {G, out, in}, dw ? "grouped_matmul dW" : "grouped_matmul W");
  expect_matrix(a, "grouped_matmul", "A");
  const Tensor& rows_out = dw ? b : c;  // the other [N, *] operand
  expect_matrix(rows_out, "grouped_matmul", dw ? "X" : "C");
  switch (p.form) {
    case GroupedForm::XWt:
      expect_dims(a, {N, in}, "grouped_matmul X");
      expect_dims(c, {N, out}, "grouped_matmul Y");
      break;
    case GroupedForm::DyW:
      expect_dims(a, {N, out}, "grouped_matmul dY");
      expect_dims(c, {N, in}, "grouped_matmul dX");
      break;
    case GroupedForm::DytX:
      expect_dims(a, {N, out}, "grouped_matmul dY");
      expect_dims(b, {N, in}, "grouped_matmul X");
      break;
  }
  expect_group_offsets(offsets, G, N, "grouped_matmul offsets");
  MT_CHECK(a.device() == w.device() && rows_out.device() == w.device(), ValueError,
           "grouped_matmul operands on ", device_name(a.device()), ", ", device_name(b.device()),
           ", ", device_name(c.device()));
  // The offsets stay on the host (they drive the per-group launches); the operands pick the path.
  dispatch(MT_OP_BODIES(grouped_matmul), {&a, &b, &c}, ctx, p, a, offsets, b, c);
}

}  // namespace mt::ops
