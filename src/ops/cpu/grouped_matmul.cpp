#include "ops/grouped_matmul.h"

#include "ops/gemm.h"

namespace mt::ops::cpu {

void grouped_matmul(Context& ctx, const GroupedMatmulParams& p, const Tensor& a,
                    const Tensor& offsets, const Tensor& b, Tensor& c) {
  const Tensor& w = p.form == GroupedForm::DytX ? c : b;
  const int64_t G = w.dim(0), out = w.dim(1), in = w.dim(2);
  const int32_t* off = offsets.i32();
  for (int64_t g = 0; g < G; ++g) {
    const int64_t r0 = off[g], r1 = off[g + 1];
    if (p.form != GroupedForm::DytX && r0 == r1) continue;
    Tensor ag = a.rows(r0, r1);
    switch (p.form) {
      case GroupedForm::XWt: {
        Tensor cg = c.rows(r0, r1);
        matmul(ctx, ag, false, b.rows(g, g + 1).view({out, in}), true, cg, p.alpha, p.beta);
        break;
      }
      case GroupedForm::DyW: {
        Tensor cg = c.rows(r0, r1);
        matmul(ctx, ag, false, b.rows(g, g + 1).view({out, in}), false, cg, p.alpha, p.beta);
        break;
      }
      case GroupedForm::DytX: {
        Tensor cg = c.rows(g, g + 1).view({out, in});
        matmul(ctx, ag, true, b.rows(r0, r1), false, cg, p.alpha, p.beta);
        break;
      }
    }
  }
}

}  // namespace mt::ops::cpu
