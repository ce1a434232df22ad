// The weight gradient dW_g = alpha dY_g^T X_g + beta dW_g (f32 dW, bf16 rows): both operands are
// read M- or N-major straight from the row buffers (A = dY_g^T: M-major; B = X_g: N-major), the
// groups' rows are the reduction, and each [out, in] block is one problem of the grouped launch.
// One configuration (the forward forms' default tile and cluster): its tiles are over the
// weight's [out, in], which every shape of the experts fills.
#include "ops/cuda/cutlass/grouped_gemm_sm90_impl.cuh"

namespace mt::ops::cuda {

namespace {
using Tile = cute::Shape<cute::_128, cute::_256, cute::_64>;
using Cluster = cute::Shape<cute::_2, cute::_1, cute::_1>;
MT_SM90_GEMM(WeightGrad, Tile, Cluster, sm90::Cooperative, sm90::CooperativeEpilogue, float,
             sm90::ColumnMajor, sm90::RowMajor);
}  // namespace

Sm90Kernel sm90_wgrad() {
  return {sm90::scratch_bytes<WeightGrad>, sm90::run<WeightGrad>};
}

}  // namespace mt::ops::cuda
