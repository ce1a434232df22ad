// The default configuration of the forward forms: 128 x 256 x 64 tiles with two consumer warpgroups
// (64 rows each) and a cluster of two along M sharing W_g's tile by multicast. The expert GEMMs
// have m_g of a few hundred rows, n and k of 1-4K.
#include "ops/cuda/cutlass/grouped_gemm_sm90_impl.cuh"

namespace mt::ops::cuda {

MT_SM90_FORWARD_FORMS(sm90_coop128x256c2x1, 128, 256, 64, 2, 1, sm90::Cooperative,
                      sm90::CooperativeEpilogue)

}  // namespace mt::ops::cuda
