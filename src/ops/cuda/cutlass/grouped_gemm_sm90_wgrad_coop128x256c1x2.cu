// The weight gradient on 128 x 256 x 64 tiles, cooperative, with the cluster of two along N: the
// two CTAs share dY's tile (the A operand, M-major) by multicast instead of X's.
#include "ops/cuda/cutlass/grouped_gemm_sm90_impl.cuh"

namespace mt::ops::cuda {

MT_SM90_WGRAD(sm90_wgrad_coop128x256c1x2, 128, 256, 64, 1, 2, sm90::Cooperative,
              sm90::CooperativeEpilogue)

}  // namespace mt::ops::cuda
