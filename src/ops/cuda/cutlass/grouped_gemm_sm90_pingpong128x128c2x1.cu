// 128 x 128 x 64 tiles, ping-pong: each consumer warpgroup owns a whole tile and the two alternate,
// so one's epilogue (the C read with beta = 1 and the store) overlaps the other's MMAs.
#include "ops/cuda/cutlass/grouped_gemm_sm90_impl.cuh"

namespace mt::ops::cuda {

MT_SM90_FORWARD_FORMS(sm90_pingpong128x128c2x1, 128, 128, 64, 2, 1, sm90::Pingpong,
                      sm90::PingpongEpilogue)

}  // namespace mt::ops::cuda
