// The weight gradient on 256 x 128 x 64 tiles, cooperative (two consumer warpgroups of 128 rows),
// cluster of two along M: dW's out dimension (2,048-2,304 at issue 14's shapes) in larger tiles,
// so X's rows (the B operand, N-major) are read half as often.
#include "ops/cuda/cutlass/grouped_gemm_sm90_impl.cuh"

namespace mt::ops::cuda {

MT_SM90_WGRAD(sm90_wgrad_coop256x128c2x1, 256, 128, 64, 2, 1, sm90::Cooperative,
              sm90::CooperativeEpilogue)

}  // namespace mt::ops::cuda
