// 64 x 256 x 64 tiles, ping-pong (each consumer warpgroup a whole 64-row tile, 128 accumulators a
// thread), cluster of two along M sharing W_g's tile, the larger operand of the tile, by
// multicast: finer row tiles for experts of a few hundred rows.
#include "ops/cuda/cutlass/grouped_gemm_sm90_impl.cuh"

namespace mt::ops::cuda {

MT_SM90_FORWARD_FORMS(sm90_pingpong64x256c2x1, 64, 256, 64, 2, 1, sm90::Pingpong,
                      sm90::PingpongEpilogue)

}  // namespace mt::ops::cuda
