// The dispatcher of grouped_gemm_sm90.h: the alignment rules and the choice of the compiled
// configuration (the kernels are in grouped_gemm_sm90_<name>.cu; this file includes no CUTLASS).
#include "ops/cuda/cutlass/grouped_gemm_sm90.h"

#include <climits>

namespace mt::ops::cuda {

namespace {

bool aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

Sm90Kernel forward_kernel(int kernel) {
  switch (kernel) {
    case 1:
      return sm90_coop128x256c1x2();
    case 2:
      return sm90_coop256x128c2x1();
    case 3:
      return sm90_pingpong128x128c2x1();
    case 4:
      return sm90_pingpong64x256c2x1();
    default:
      return sm90_coop128x256c2x1();
  }
}

Sm90Kernel wgrad_kernel(int kernel) {
  switch (kernel) {
    case 1:
      return sm90_wgrad_pingpong128x128c2x1();
    case 2:
      return sm90_wgrad_pingpong128x128c1x1();
    case 3:
      return sm90_wgrad_coop256x128c2x1();
    case 4:
      return sm90_wgrad_coop128x256c1x2();
    case 5:
      return sm90_wgrad_coop128x256c2x1e16();
    default:
      return sm90_wgrad();
  }
}

Sm90Kernel kernel_for(const Sm90Grouped& g, const Sm90Launch& at) {
  switch (g.form) {
    case Sm90Form::WeightGrad:
      return wgrad_kernel(at.config.wgrad);
    case Sm90Form::InputGrad:
      return forward_kernel(at.config.dx_kernel >= 0 ? at.config.dx_kernel : at.config.kernel);
    default:
      return forward_kernel(at.config.kernel);
  }
}

}  // namespace

bool sm90_grouped_fits(const Sm90Grouped& g, int count) {
  if (count <= 0 || count > kMaxGroups || !aligned(g.a) || !aligned(g.b) || !aligned(g.c) ||
      g.lda % 8 != 0 || g.n % 8 != 0 || g.n > INT32_MAX)
    return false;
  // The weight gradient reads A over m and B over n contiguously (bf16: 8 to 16 bytes); dW is
  // contiguous f32.
  if (g.form == Sm90Form::WeightGrad) return g.ldb % 8 == 0 && g.m % 8 == 0 && g.m <= INT32_MAX;
  return g.ldc % 8 == 0 && g.k % 8 == 0 && g.k <= INT32_MAX && g.ldw % 8 == 0 && g.w_group % 8 == 0;
}

size_t sm90_grouped_scratch(const Sm90Grouped& g, const GroupRows& rows, int count,
                            const Sm90Launch& at) {
  return kernel_for(g, at).scratch(g, rows, count, at);
}

const char* sm90_grouped_gemm(const Sm90Grouped& g, const GroupRows& rows, int count,
                              const Sm90Launch& at, void* scratch) {
  return kernel_for(g, at).run(g, rows, count, at, scratch);
}

}  // namespace mt::ops::cuda
