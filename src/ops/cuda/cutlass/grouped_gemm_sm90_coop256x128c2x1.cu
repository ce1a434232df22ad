// 256 x 128 x 64 tiles, cooperative (two consumer warpgroups of 128 rows), cluster of two along M.
#include "ops/cuda/cutlass/grouped_gemm_sm90_impl.cuh"

namespace mt::ops::cuda {

MT_SM90_FORWARD_FORMS(sm90_coop256x128c2x1, 256, 128, 64, 2, 1, sm90::Cooperative,
                      sm90::CooperativeEpilogue)

}  // namespace mt::ops::cuda
