// The default weight gradient's tile, cluster and schedule (cooperative 128 x 256 x 64, cluster
// 2 x 1) with an epilogue sub-tile of 128 x 16 instead of the automatic 128 x 32. The f32 epilogue
// keeps four C stages of its sub-tile in shared memory (64 KiB at 128 x 32), carved out of the
// mainloop's: that left three 48 KiB mainloop stages where the bf16 forms (32 KiB of epilogue)
// have four. At 128 x 16 the epilogue takes 32 KiB and the mainloop gets its fourth stage; the
// tile's f32 output is the same bytes in twice as many TMA stores.
#include "ops/cuda/cutlass/grouped_gemm_sm90_impl.cuh"

namespace mt::ops::cuda {

namespace {
using EpiTile128x16 = cute::Shape<cute::_128, cute::_16>;
}  // namespace

MT_SM90_WGRAD_EPI(sm90_wgrad_coop128x256c2x1e16, 128, 256, 64, 2, 1, sm90::Cooperative,
                  sm90::CooperativeEpilogue, EpiTile128x16)

static_assert(sm90_wgrad_coop128x256c2x1e16Gemm::kStages == 4,
              "the 128 x 16 epilogue leaves the mainloop four stages");

}  // namespace mt::ops::cuda
