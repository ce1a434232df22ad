// The SwiGLU GEMMs of grouped_gemm_sm90_swiglu.h: CUTLASS's grouped kernels with the node of
// swiglu_epilogue.cuh in their epilogues, and the per-group arrays they read.
#include "ops/cuda/cutlass/grouped_gemm_sm90_impl.cuh"
#include "ops/cuda/cutlass/grouped_gemm_sm90_swiglu.h"
#include "ops/cuda/cutlass/swiglu_epilogue.cuh"

namespace mt::ops::cuda {

namespace sm90 {
namespace {

// Two configurations of each form: grouped_gemm_sm90.h's default (cooperative 128 x 256 x 64,
// cluster 2 x 1) and ping-pong 128 x 128 x 64 (cluster 2 x 1), whose epilogue, the heavier one
// here, runs under the other warpgroup's MMAs.
using CoopTile = cute::Shape<cute::_128, cute::_256, cute::_64>;
using PingTile = cute::Shape<cute::_128, cute::_128, cute::_64>;
using SwCluster = cute::Shape<cute::_2, cute::_1, cute::_1>;

// C: Bf16 where the form reads its C source, void where it has none (UpInterleaved: D's stages
// alone in shared memory, which leaves the mainloop its fourth stage).
#define MT_SM90_SWIGLU_GEMM(Name, Tile, Schedule, EpilogueSchedule, LayoutB, C, kForm)            \
  using Name##Epilogue = cutlass::epilogue::collective::CollectiveBuilder<                        \
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, SwCluster,                       \
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, C, RowMajor*, 8, Bf16,       \
      RowMajor*, 8, EpilogueSchedule, SwigluEvt<Sm90SwigluForm::kForm>>::CollectiveOp;            \
  using Name##Mainloop = cutlass::gemm::collective::CollectiveBuilder<                            \
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, RowMajor*, 8, Bf16, LayoutB*, 8, \
      float, Tile, SwCluster,                                                                     \
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(                         \
          sizeof(Name##Epilogue::SharedStorage))>,                                                \
      Schedule>::CollectiveOp;                                                                    \
  using Name = Sm90Gemm<Name##Mainloop, Name##Epilogue>

MT_SM90_SWIGLU_GEMM(SwigluUp, CoopTile, Cooperative, CooperativeEpilogue, ColumnMajor, Bf16, Up);
MT_SM90_SWIGLU_GEMM(SwigluDown, CoopTile, Cooperative, CooperativeEpilogue, RowMajor, Bf16,
                    DownBackward);
MT_SM90_SWIGLU_GEMM(SwigluUpPingpong, PingTile, Pingpong, PingpongEpilogue, ColumnMajor, Bf16, Up);
MT_SM90_SWIGLU_GEMM(SwigluDownPingpong, PingTile, Pingpong, PingpongEpilogue, RowMajor, Bf16,
                    DownBackward);
MT_SM90_SWIGLU_GEMM(SwigluUpInterleaved, CoopTile, Cooperative, CooperativeEpilogue, ColumnMajor,
                    void, UpInterleaved);
static_assert(SwigluUpInterleaved::kStages == 4, "no C stages: the mainloop keeps four");

// The per-group arrays: the GEMM's (D is c's rows, the C source gate's) and the node's.
template <class G>
struct SwArrays {
  typename G::Shape* shape = nullptr;
  const Bf16** a = nullptr;
  const Bf16** b = nullptr;
  Bf16** d = nullptr;
  const Bf16** src = nullptr;
  typename G::StrideA* sa = nullptr;
  typename G::StrideB* sb = nullptr;
  typename G::StrideC* sd = nullptr;
  typename G::StrideC* ssrc = nullptr;
  const Bf16** up = nullptr;
  Bf16** dup = nullptr;
  Bf16** h = nullptr;
  size_t bytes = 0;
};

template <class G>
SwArrays<G> sw_arrays(void* scratch, int count) {
  auto* base = static_cast<char*>(scratch);
  SwArrays<G> r;
  size_t at = 0;
  r.shape = carve<typename G::Shape>(base, at, count);
  r.a = carve<const Bf16*>(base, at, count);
  r.b = carve<const Bf16*>(base, at, count);
  r.d = carve<Bf16*>(base, at, count);
  r.src = carve<const Bf16*>(base, at, count);
  r.sa = carve<typename G::StrideA>(base, at, count);
  r.sb = carve<typename G::StrideB>(base, at, count);
  r.sd = carve<typename G::StrideC>(base, at, count);
  r.ssrc = carve<typename G::StrideC>(base, at, count);
  r.up = carve<const Bf16*>(base, at, count);
  r.dup = carve<Bf16*>(base, at, count);
  r.h = carve<Bf16*>(base, at, count);
  r.bytes = at;
  return r;
}

template <class G>
__global__ void sw_layout_kernel(GroupRows t, int count, Sm90Grouped g, Sm90Swiglu s,
                                 SwArrays<G> out) {
  using cute::_1;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const int64_t row0 = t.row0[i], group = t.group[i];
  out.shape[i] = shape_of(g, t.rows[i]);
  out.a[i] = static_cast<const Bf16*>(g.a) + row0 * g.lda;
  const int64_t w_group = g.w_group ? g.w_group : g.n * g.k;
  out.b[i] = static_cast<const Bf16*>(g.b) + group * w_group;
  Bf16* d = static_cast<Bf16*>(g.c) + row0 * g.ldc;
  const Bf16* gate = s.gate ? static_cast<const Bf16*>(s.gate) + row0 * s.ldgate : nullptr;
  out.d[i] = d;
  out.src[i] = gate;
  out.sa[i] = cute::make_stride(g.lda, _1{}, Zero{});
  const int64_t ldb = g.ldw ? g.ldw : (G::kBKMajor ? g.k : g.n);
  if constexpr (G::kBKMajor)
    out.sb[i] = cute::make_stride(ldb, _1{}, Zero{});
  else
    out.sb[i] = cute::make_stride(_1{}, ldb, Zero{});
  out.sd[i] = cute::make_stride(g.ldc, _1{}, Zero{});
  out.ssrc[i] = cute::make_stride(s.ldgate, _1{}, Zero{});
  out.up[i] = gate ? gate + g.n : nullptr;
  out.dup[i] = d + g.n;
  out.h[i] = s.h ? static_cast<Bf16*>(s.h) + row0 * s.ldh : nullptr;
}

template <Sm90SwigluForm kForm, class G>
typename G::Gemm::Arguments sw_arguments(const Sm90Grouped& g, const Sm90Swiglu& s, int count,
                                         const Sm90Launch& at, const SwArrays<G>& arr,
                                         const std::vector<typename G::Shape>& host) {
  cutlass::KernelHardwareInfo hw;
  hw.device_id = at.device;
  hw.sm_count = at.multiprocessors;
  using Node = SwigluNode<kForm>;
  static_assert(G::kBKMajor == !Node::kBackward, "Up forms read W K-major, Down backward N-major");
  typename Node::Arguments node;
  if constexpr (Node::kBackward) {
    node.up = arr.up;
    node.dup = arr.dup;
  }
  node.h = s.h ? arr.h : nullptr;
  node.ldu = s.ldgate;
  node.lddu = g.ldc;
  node.ldh = s.ldh;
  node.narrow = s.narrow;
  typename G::Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGrouped,
                                   {count, arr.shape, host.data()},
                                   {arr.a, arr.sa, arr.b, arr.sb},
                                   {{{}, node}, nullptr, arr.ssrc, arr.d, arr.sd},
                                   hw};
  // UpInterleaved has no C source (a void C, its pointers null).
  if constexpr (!Node::kInterleaved) args.epilogue.ptr_C = arr.src;
  using Raster = decltype(args.scheduler.raster_order);
  args.scheduler.max_swizzle_size = at.config.swizzle;
  args.scheduler.raster_order = at.config.along_n ? Raster::AlongN : Raster::AlongM;
  return args;
}

template <Sm90SwigluForm kForm, class G>
size_t sw_scratch(const Sm90Grouped& g, const Sm90Swiglu& s, const GroupRows& rows, int count,
                  const Sm90Launch& at) {
  const SwArrays<G> arr = sw_arrays<G>(nullptr, count);
  const auto host = host_shapes<G>(g, rows, count);
  return arr.bytes +
         G::Gemm::get_workspace_size(sw_arguments<kForm, G>(g, s, count, at, arr, host));
}

template <Sm90SwigluForm kForm, class G>
const char* sw_run(const Sm90Grouped& g, const Sm90Swiglu& s, const GroupRows& rows, int count,
                   const Sm90Launch& at, void* scratch) {
  const SwArrays<G> arr = sw_arrays<G>(scratch, count);
  sw_layout_kernel<G><<<(count + 127) / 128, 128, 0, at.stream>>>(rows, count, g, s, arr);
  if (cudaGetLastError() != cudaSuccess) return "the layout kernel's launch";
  const auto host = host_shapes<G>(g, rows, count);
  const auto args = sw_arguments<kForm, G>(g, s, count, at, arr, host);
  return launch<G>(args, static_cast<char*>(scratch) + arr.bytes, at.stream);
}

}  // namespace
}  // namespace sm90

namespace {

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

bool sm90_swiglu_fits(const Sm90Grouped& g, const Sm90Swiglu& s, int count) {
  const bool interleaved = s.form == Sm90SwigluForm::UpInterleaved;
  const bool up = s.form == Sm90SwigluForm::Up || interleaved;
  if (g.form != (up ? Sm90Form::Forward : Sm90Form::InputGrad)) return false;
  if (up && s.h == nullptr) return false;
  if (interleaved && g.n % 32 != 0) return false;
  if (!interleaved && (!aligned16(s.gate) || s.ldgate % 8 != 0)) return false;
  if (s.h && (!aligned16(s.h) || s.ldh % 8 != 0)) return false;
  return sm90_grouped_fits(g, count);
}

namespace {

// The form's kernel in the configuration's terms (Up: the forward form's, Down backward: the input
// gradient's): ping-pong where it is pingpong128x128c2x1 (index 3 of kGroupedGemmKernels).
bool pingpong(const Sm90Swiglu& s, const Sm90Launch& at) {
  const Sm90Config& c = at.config;
  const int k = s.form == Sm90SwigluForm::Up || c.dx_kernel < 0 ? c.kernel : c.dx_kernel;
  return k == 3;
}

}  // namespace

size_t sm90_swiglu_scratch(const Sm90Grouped& g, const Sm90Swiglu& s, const GroupRows& rows,
                           int count, const Sm90Launch& at) {
  using namespace sm90;
  using F = Sm90SwigluForm;
  if (s.form == F::UpInterleaved)
    return sw_scratch<F::UpInterleaved, SwigluUpInterleaved>(g, s, rows, count, at);
  if (s.form == F::Up)
    return pingpong(s, at) ? sw_scratch<F::Up, SwigluUpPingpong>(g, s, rows, count, at)
                           : sw_scratch<F::Up, SwigluUp>(g, s, rows, count, at);
  return pingpong(s, at) ? sw_scratch<F::DownBackward, SwigluDownPingpong>(g, s, rows, count, at)
                         : sw_scratch<F::DownBackward, SwigluDown>(g, s, rows, count, at);
}

const char* sm90_swiglu_gemm(const Sm90Grouped& g, const Sm90Swiglu& s, const GroupRows& rows,
                             int count, const Sm90Launch& at, void* scratch) {
  using namespace sm90;
  using F = Sm90SwigluForm;
  if (s.form == F::UpInterleaved)
    return sw_run<F::UpInterleaved, SwigluUpInterleaved>(g, s, rows, count, at, scratch);
  if (s.form == F::Up)
    return pingpong(s, at) ? sw_run<F::Up, SwigluUpPingpong>(g, s, rows, count, at, scratch)
                           : sw_run<F::Up, SwigluUp>(g, s, rows, count, at, scratch);
  return pingpong(s, at)
             ? sw_run<F::DownBackward, SwigluDownPingpong>(g, s, rows, count, at, scratch)
             : sw_run<F::DownBackward, SwigluDown>(g, s, rows, count, at, scratch);
}

}  // namespace mt::ops::cuda
