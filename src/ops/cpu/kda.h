// The CPU path of ops/kda.h: fp32 loops. Called by the entries after they validated, so it does not
// re-check.
#pragma once

#include "ops/kda.h"

namespace mt::ops::cpu {

// Workspace floats of the CPU path (its per-thread chunk buffers); ops::kda_scratch_floats.
int64_t kda_scratch_floats(const KdaParams& p, int threads, bool backward);
void kda_forward(Context& ctx, const KdaParams& p, const Tensor& cu_seqlens, const Tensor& q,
                 const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                 const Tensor& h0, Tensor& o, Tensor& hT, Tensor& saved);
void kda_backward(Context& ctx, const KdaParams& p, const Tensor& cu_seqlens, const Tensor& q,
                  const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                  const Tensor& saved, const Tensor& dout, const Tensor& dhT, Tensor& dq,
                  Tensor& dk, Tensor& dv, Tensor& dg, Tensor& dbeta, Tensor& dh0);

}  // namespace mt::ops::cpu
