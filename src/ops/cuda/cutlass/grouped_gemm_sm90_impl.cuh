// The templates behind grouped_gemm_sm90.h, included by the grouped_gemm_sm90_<name>.cu files
// only, each of which instantiates its configuration with MT_SM90_GEMM. The per-group problem
// sizes, operand addresses and strides are written on the device from the group table passed by
// value; the host passes the sizes as well, so the tile scheduler's setup needs no copy back.
#pragma once

#include <vector>

#include <cutlass/cutlass.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include "ops/cuda/cutlass/grouped_gemm_sm90.h"
#include "ops/cuda/cutlass/tail_trimmed_mainloop.cuh"

namespace mt::ops::cuda::sm90 {

using Bf16 = cutlass::bfloat16_t;
using Zero = cute::Int<0>;
using Problem = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
using RowMajor = cutlass::layout::RowMajor;
using ColumnMajor = cutlass::layout::ColumnMajor;
using Cooperative = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
using CooperativeEpilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
using Pingpong = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
using PingpongEpilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;

template <class Mainloop, class Epilogue>
struct Sm90Gemm {
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Problem, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using Shape = typename Problem::UnderlyingProblemShape;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideC = typename Kernel::InternalStrideC;
  using ElementC = typename Kernel::ElementC;
  using KMajor = cute::Stride<int64_t, cute::_1, Zero>;
  static constexpr bool kAKMajor = cute::is_same_v<StrideA, KMajor>;
  static constexpr bool kBKMajor = cute::is_same_v<StrideB, KMajor>;
  // The mainloop's shared-memory stages (what the epilogue's carve-out left).
  static constexpr int kStages = Mainloop::DispatchPolicy::Stages;
};

// One configuration's collectives and kernel `Name`, at namespace scope (g++ 12 misparses the
// epilogue builder inside a class template). Tile and Cluster are cute shapes, Schedule and
// EpilogueSchedule a kernel / epilogue schedule pair, C the output type (16-byte alignment), A and
// B the operand layouts in CUTLASS's terms (A [M, K], B [K, N]: ColumnMajor B is K-major), EpiTile
// the epilogue's sub-tile (a cute shape, or EpilogueTileAuto): its C stages' shared memory is
// carved out of the mainloop's, so a smaller one can leave room for another mainloop stage.
#define MT_SM90_GEMM(Name, Tile, Cluster, Schedule, EpilogueSchedule, C, LayoutA, LayoutB) \
  MT_SM90_GEMM_EPI(Name, Tile, Cluster, Schedule, EpilogueSchedule, C, LayoutA, LayoutB,   \
                   cutlass::epilogue::collective::EpilogueTileAuto)
#define MT_SM90_GEMM_EPI(Name, Tile, Cluster, Schedule, EpilogueSchedule, C, LayoutA, LayoutB,    \
                         EpiTile)                                                                 \
  using Name##Epilogue = cutlass::epilogue::collective::CollectiveBuilder<                        \
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster, EpiTile, float, float,  \
      C, ::mt::ops::cuda::sm90::RowMajor*, 16 / sizeof(C), C, ::mt::ops::cuda::sm90::RowMajor*,   \
      16 / sizeof(C), EpilogueSchedule,                                                           \
      cutlass::epilogue::fusion::LinearCombination<C, float>>::CollectiveOp;                      \
  using Name##Mainloop = cutlass::gemm::collective::CollectiveBuilder<                            \
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ::mt::ops::cuda::sm90::Bf16, LayoutA*, \
      8, ::mt::ops::cuda::sm90::Bf16, LayoutB*, 8, float, Tile, Cluster,                          \
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(                         \
          sizeof(Name##Epilogue::SharedStorage))>,                                                \
      Schedule>::CollectiveOp;                                                                    \
  using Name = ::mt::ops::cuda::sm90::Sm90Gemm<Name##Mainloop, Name##Epilogue>

// The per-group arrays the kernel reads, one entry per non-empty group, carved from the scratch.
template <class G>
struct Arrays {
  using C = typename G::ElementC;
  typename G::Shape* shape = nullptr;
  const Bf16** a = nullptr;
  const Bf16** b = nullptr;
  C** c = nullptr;
  typename G::StrideA* sa = nullptr;
  typename G::StrideB* sb = nullptr;
  typename G::StrideC* sc = nullptr;
  size_t bytes = 0;  // all of them, each 256-byte aligned
};

template <class T>
T* carve(char* base, size_t& at, int count) {
  T* p = base ? reinterpret_cast<T*>(base + at) : nullptr;
  at += (sizeof(T) * static_cast<size_t>(count) + 255) / 256 * 256;
  return p;
}

template <class G>
Arrays<G> arrays(void* scratch, int count) {
  auto* base = static_cast<char*>(scratch);
  Arrays<G> r;
  size_t at = 0;
  r.shape = carve<typename G::Shape>(base, at, count);
  r.a = carve<const Bf16*>(base, at, count);
  r.b = carve<const Bf16*>(base, at, count);
  r.c = carve<typename G::ElementC*>(base, at, count);
  r.sa = carve<typename G::StrideA>(base, at, count);
  r.sb = carve<typename G::StrideB>(base, at, count);
  r.sc = carve<typename G::StrideC>(base, at, count);
  r.bytes = at;
  return r;
}

// Group i's (M, N, K): (m_g, n, k) for the forward forms, (m, n, m_g) for the weight gradient.
__host__ __device__ inline cute::Shape<int, int, int> shape_of(const Sm90Grouped& g, int rows) {
  if (g.form == Sm90Form::WeightGrad)
    return cute::make_shape(static_cast<int>(g.m), static_cast<int>(g.n), rows);
  return cute::make_shape(rows, static_cast<int>(g.n), static_cast<int>(g.k));
}

template <class G>
__global__ void layout_kernel(GroupRows t, int count, Sm90Grouped g, Arrays<G> out) {
  using cute::_1;
  using C = typename G::ElementC;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const bool wgrad = g.form == Sm90Form::WeightGrad;
  const int64_t row0 = t.row0[i], group = t.group[i];
  out.shape[i] = shape_of(g, t.rows[i]);
  out.a[i] = static_cast<const Bf16*>(g.a) + row0 * g.lda;
  // B: the weight gradient's rows of X, or W_g ([n, k] K-major, [k, n] N-major).
  const int64_t w_group = g.w_group ? g.w_group : g.n * g.k;
  out.b[i] = static_cast<const Bf16*>(g.b) + (wgrad ? row0 * g.ldb : group * w_group);
  out.c[i] = static_cast<C*>(g.c) + (wgrad ? group * g.m * g.n : row0 * g.ldc);
  if constexpr (G::kAKMajor)
    out.sa[i] = cute::make_stride(g.lda, _1{}, Zero{});
  else
    out.sa[i] = cute::make_stride(_1{}, g.lda, Zero{});
  const int64_t ldb = wgrad ? g.ldb : g.ldw ? g.ldw : (G::kBKMajor ? g.k : g.n);
  if constexpr (G::kBKMajor)
    out.sb[i] = cute::make_stride(ldb, _1{}, Zero{});
  else
    out.sb[i] = cute::make_stride(_1{}, ldb, Zero{});
  out.sc[i] = cute::make_stride(wgrad ? g.n : g.ldc, _1{}, Zero{});
}

template <class G>
typename G::Gemm::Arguments arguments(const Sm90Grouped& g, int count, const Sm90Launch& at,
                                      const Arrays<G>& arr,
                                      const std::vector<typename G::Shape>& host) {
  using C = typename G::ElementC;
  cutlass::KernelHardwareInfo hw;
  hw.device_id = at.device;
  hw.sm_count = at.multiprocessors;
  typename G::Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGrouped,
                                   {count, arr.shape, host.data()},
                                   {arr.a, arr.sa, arr.b, arr.sb},
                                   {{}, const_cast<const C**>(arr.c), arr.sc, arr.c, arr.sc},
                                   hw};
  // The forward forms' K, one for every group, for a tail-trimmed mainloop.
  if constexpr (requires { args.mainloop.k; })
    args.mainloop.k = g.form == Sm90Form::WeightGrad ? 0 : static_cast<int>(g.k);
  args.epilogue.thread.alpha = g.alpha;
  args.epilogue.thread.beta = g.beta;
  using Raster = decltype(args.scheduler.raster_order);
  args.scheduler.max_swizzle_size = at.config.swizzle;
  args.scheduler.raster_order = at.config.along_n ? Raster::AlongN : Raster::AlongM;
  return args;
}

template <class G>
std::vector<typename G::Shape> host_shapes(const Sm90Grouped& g, const GroupRows& rows, int count) {
  std::vector<typename G::Shape> host(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) host[static_cast<size_t>(i)] = shape_of(g, rows.rows[i]);
  return host;
}

template <class G>
size_t scratch_bytes(const Sm90Grouped& g, const GroupRows& rows, int count, const Sm90Launch& at) {
  const Arrays<G> arr = arrays<G>(nullptr, count);
  const auto host = host_shapes<G>(g, rows, count);
  return arr.bytes + G::Gemm::get_workspace_size(arguments<G>(g, count, at, arr, host));
}

// Checks, initialises (CUTLASS's workspace) and launches G's kernel: nullptr, or what failed.
template <class G>
const char* launch(const typename G::Gemm::Arguments& args, void* workspace, cudaStream_t stream) {
  typename G::Gemm gemm;
  cutlass::Status s = gemm.can_implement(args);
  if (s == cutlass::Status::kSuccess) s = gemm.initialize(args, workspace, stream);
  if (s == cutlass::Status::kSuccess) s = gemm.run(stream);
  if (s != cutlass::Status::kSuccess) return cutlassGetStatusString(s);
  return cudaGetLastError() == cudaSuccess ? nullptr : "the grouped kernel's launch";
}

template <class G>
const char* run(const Sm90Grouped& g, const GroupRows& rows, int count, const Sm90Launch& at,
                void* scratch) {
  const Arrays<G> arr = arrays<G>(scratch, count);
  layout_kernel<G><<<(count + 127) / 128, 128, 0, at.stream>>>(rows, count, g, arr);
  if (cudaGetLastError() != cudaSuccess) return "the layout kernel's launch";
  const auto host = host_shapes<G>(g, rows, count);
  const auto args = arguments<G>(g, count, at, arr, host);
  return launch<G>(args, static_cast<char*>(scratch) + arr.bytes, at.stream);
}

// The entry points of a configuration of the forward forms: Forward reads W_g K-major, InputGrad
// N-major.
template <class Forward, class InputGrad>
Sm90Kernel forward_forms() {
  return {[](const Sm90Grouped& g, const GroupRows& rows, int count, const Sm90Launch& at) {
            return g.form == Sm90Form::Forward ? scratch_bytes<Forward>(g, rows, count, at)
                                               : scratch_bytes<InputGrad>(g, rows, count, at);
          },
          [](const Sm90Grouped& g, const GroupRows& rows, int count, const Sm90Launch& at,
             void* scratch) {
            return g.form == Sm90Form::Forward ? run<Forward>(g, rows, count, at, scratch)
                                               : run<InputGrad>(g, rows, count, at, scratch);
          }};
}

// The forward forms as the function `Fn`: tiles TM x TN x TK, clusters CM x CN, a kernel /
// epilogue schedule pair; their mainloops stop the last k-tile at K (tail_trimmed_mainloop.cuh).
#define MT_SM90_FORWARD_FORMS(Fn, TM, TN, TK, CM, CN, Schedule, EpilogueSchedule)                  \
  namespace {                                                                                      \
  using Fn##Tile = cute::Shape<cute::Int<TM>, cute::Int<TN>, cute::Int<TK>>;                       \
  using Fn##Cluster = cute::Shape<cute::Int<CM>, cute::Int<CN>, cute::_1>;                         \
  MT_SM90_GEMM(ForwardStock, Fn##Tile, Fn##Cluster, Schedule, EpilogueSchedule,                    \
               ::mt::ops::cuda::sm90::Bf16, ::mt::ops::cuda::sm90::RowMajor,                       \
               ::mt::ops::cuda::sm90::ColumnMajor);                                                \
  MT_SM90_GEMM(InputGradStock, Fn##Tile, Fn##Cluster, Schedule, EpilogueSchedule,                  \
               ::mt::ops::cuda::sm90::Bf16, ::mt::ops::cuda::sm90::RowMajor,                       \
               ::mt::ops::cuda::sm90::RowMajor);                                                   \
  using Forward = ::mt::ops::cuda::sm90::Sm90Gemm<                                                 \
      ::mt::ops::cuda::sm90::TailTrimmedMainloop<ForwardStockMainloop>, ForwardStockEpilogue>;     \
  using InputGrad = ::mt::ops::cuda::sm90::Sm90Gemm<                                               \
      ::mt::ops::cuda::sm90::TailTrimmedMainloop<InputGradStockMainloop>, InputGradStockEpilogue>; \
  }                                                                                                \
  Sm90Kernel Fn() {                                                                                \
    return ::mt::ops::cuda::sm90::forward_forms<Forward, InputGrad>();                             \
  }

// The weight gradient as the function `Fn`: dW_g f32 = dY_g^T X_g, A = dY_g^T read M-major and
// B = X_g read N-major straight from the row buffers; tiles TM x TN x TK over dW's [out, in],
// clusters CM x CN, a kernel / epilogue schedule pair.
#define MT_SM90_WGRAD(Fn, TM, TN, TK, CM, CN, Schedule, EpilogueSchedule) \
  MT_SM90_WGRAD_EPI(Fn, TM, TN, TK, CM, CN, Schedule, EpilogueSchedule,   \
                    cutlass::epilogue::collective::EpilogueTileAuto)
// The same with the epilogue sub-tile EpiTile (MT_SM90_GEMM_EPI).
#define MT_SM90_WGRAD_EPI(Fn, TM, TN, TK, CM, CN, Schedule, EpilogueSchedule, EpiTile)             \
  namespace {                                                                                      \
  using Fn##Tile = cute::Shape<cute::Int<TM>, cute::Int<TN>, cute::Int<TK>>;                       \
  using Fn##Cluster = cute::Shape<cute::Int<CM>, cute::Int<CN>, cute::_1>;                         \
  MT_SM90_GEMM_EPI(Fn##Gemm, Fn##Tile, Fn##Cluster, Schedule, EpilogueSchedule, float,             \
                   ::mt::ops::cuda::sm90::ColumnMajor, ::mt::ops::cuda::sm90::RowMajor, EpiTile);  \
  }                                                                                                \
  Sm90Kernel Fn() {                                                                                \
    return {::mt::ops::cuda::sm90::scratch_bytes<Fn##Gemm>, ::mt::ops::cuda::sm90::run<Fn##Gemm>}; \
  }

}  // namespace mt::ops::cuda::sm90
