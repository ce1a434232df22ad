// 128 x 256 x 64 tiles, cooperative, with the cluster of two along N: the two CTAs share the A
// rows' tile by multicast instead of W_g's.
#include "ops/cuda/cutlass/grouped_gemm_sm90_impl.cuh"

namespace mt::ops::cuda {

MT_SM90_FORWARD_FORMS(sm90_coop128x256c1x2, 128, 256, 64, 1, 2, sm90::Cooperative,
                      sm90::CooperativeEpilogue)

}  // namespace mt::ops::cuda
