// The weight gradient on 128 x 128 x 64 tiles, ping-pong (one warpgroup's f32 epilogue under the
// other's MMAs), without a cluster: no multicast, and no pair of CTAs waiting on each other's
// epilogue before the next tile's loads.
#include "ops/cuda/cutlass/grouped_gemm_sm90_impl.cuh"

namespace mt::ops::cuda {

MT_SM90_WGRAD(sm90_wgrad_pingpong128x128c1x1, 128, 128, 64, 1, 1, sm90::Pingpong,
              sm90::PingpongEpilogue)

}  // namespace mt::ops::cuda
