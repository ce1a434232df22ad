// The weight gradient on 128 x 128 x 64 tiles, ping-pong: each consumer warpgroup owns a whole tile
// and the two alternate, so one's f32 epilogue (128 x 128 x 4 bytes written, read too when adding)
// runs under the other's MMAs. With K = a group's rows (about 2,048 at issue 14's shape A, 256 at
// B) a tile's MMAs are short next to that write: at B the f32 dW (7.2 GB) is most of the time.
// Cluster of two along M sharing X's tile.
#include "ops/cuda/cutlass/grouped_gemm_sm90_impl.cuh"

namespace mt::ops::cuda {

MT_SM90_WGRAD(sm90_wgrad_pingpong128x128c2x1, 128, 128, 64, 2, 1, sm90::Pingpong,
              sm90::PingpongEpilogue)

}  // namespace mt::ops::cuda
