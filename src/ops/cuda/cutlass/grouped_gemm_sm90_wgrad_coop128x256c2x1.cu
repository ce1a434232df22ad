// The weight gradient dW_g = alpha dY_g^T X_g + beta dW_g (f32 dW, bf16 rows): both operands are
// read M- or N-major straight from the row buffers (A = dY_g^T: M-major; B = X_g: N-major), the
// groups' rows are the reduction, and each [out, in] block is one problem of the grouped launch.
// The default: the forward forms' default tile and cluster, cooperative (the two consumer
// warpgroups share each tile, so its f32 epilogue runs between tiles' MMAs).
#include "ops/cuda/cutlass/grouped_gemm_sm90_impl.cuh"

namespace mt::ops::cuda {

MT_SM90_WGRAD(sm90_wgrad, 128, 256, 64, 2, 1, sm90::Cooperative, sm90::CooperativeEpilogue)

// Its f32 epilogue's four 128 x 32 C stages (64 KiB) leave the mainloop three stages
// (grouped_gemm_sm90_wgrad_coop128x256c2x1e16.cu gives it a fourth).
static_assert(sm90_wgradGemm::kStages == 3, "three mainloop stages beside a 64 KiB epilogue");

}  // namespace mt::ops::cuda
