// CUTLASS 3 (headers of the pinned nvidia-cutlass wheel) instantiated twice: W_g read K-major
// (the forward) and N-major (the input gradient). The per-group problem sizes, operand addresses
// and strides are written on the device from the group table passed by value; the host passes
// the sizes as well, so the tile scheduler's setup needs no copy back.
#include "ops/cuda/cutlass/grouped_gemm_sm90.h"

#include <vector>

#include <cutlass/cutlass.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

namespace mt::ops::cuda {

namespace {

using cute::_1;
using cute::_128;
using cute::_2;
using cute::_256;
using cute::_64;
using Bf16 = cutlass::bfloat16_t;
using Zero = cute::Int<0>;

// The expert GEMMs have m_g of a few hundred rows, n and k of 1-4K: 128 x 256 tiles with two
// consumer warpgroups (64 rows each) and a cluster of two along M sharing W_g's tile by multicast.
// (At namespace scope, not inside a class template: g++ 12 misparses the epilogue builder there.)
using Problem = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
using RowMajor = cutlass::layout::RowMajor;
constexpr int kAlign = 8;  // elements of 16 bytes
using Tile = cute::Shape<_128, _256, _64>;
using Cluster = cute::Shape<_2, _1, _1>;
using Epilogue = cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, Bf16, RowMajor*, kAlign, Bf16,
    RowMajor*, kAlign, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
    cutlass::epilogue::fusion::LinearCombination<Bf16, float>>::CollectiveOp;
using Stages = cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
    sizeof(Epilogue::SharedStorage))>;
using ForwardMainloop = cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, RowMajor*, kAlign, Bf16,
    cutlass::layout::ColumnMajor*, kAlign, float, Tile, Cluster, Stages,
    cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
using InputGradMainloop = cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, RowMajor*, kAlign, Bf16, RowMajor*,
    kAlign, float, Tile, Cluster, Stages,
    cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;

template <class Mainloop>
struct Sm90Gemm {
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Problem, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using Shape = typename Problem::UnderlyingProblemShape;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideC = typename Kernel::InternalStrideC;
  static constexpr bool kWnk = cute::is_same_v<StrideB, cute::Stride<int64_t, _1, Zero>>;
};

// The per-group arrays the kernel reads, one entry per non-empty group, carved from the scratch.
template <class G>
struct Arrays {
  typename G::Shape* shape = nullptr;
  const Bf16** a = nullptr;
  const Bf16** b = nullptr;
  Bf16** c = nullptr;
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
  r.c = carve<Bf16*>(base, at, count);
  r.sa = carve<typename G::StrideA>(base, at, count);
  r.sb = carve<typename G::StrideB>(base, at, count);
  r.sc = carve<typename G::StrideC>(base, at, count);
  r.bytes = at;
  return r;
}

template <class G>
__global__ void layout_kernel(GroupRows t, int count, Sm90Grouped g, Arrays<G> out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  out.shape[i] = cute::make_shape(t.rows[i], static_cast<int>(g.n), static_cast<int>(g.k));
  out.a[i] = static_cast<const Bf16*>(g.a) + static_cast<int64_t>(t.row0[i]) * g.lda;
  out.b[i] = static_cast<const Bf16*>(g.w) + static_cast<int64_t>(t.group[i]) * g.n * g.k;
  out.c[i] = static_cast<Bf16*>(g.c) + static_cast<int64_t>(t.row0[i]) * g.ldc;
  out.sa[i] = cute::make_stride(g.lda, _1{}, Zero{});
  if constexpr (G::kWnk)
    out.sb[i] = cute::make_stride(g.k, _1{}, Zero{});  // W_g [n, k]
  else
    out.sb[i] = cute::make_stride(_1{}, g.n, Zero{});  // W_g [k, n]
  out.sc[i] = cute::make_stride(g.ldc, _1{}, Zero{});
}

template <class G>
typename G::Gemm::Arguments arguments(const Sm90Grouped& g, int count, const Sm90Launch& at,
                                      const Arrays<G>& arr,
                                      const std::vector<typename G::Shape>& host) {
  cutlass::KernelHardwareInfo hw;
  hw.device_id = at.device;
  hw.sm_count = at.multiprocessors;
  typename G::Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGrouped,
                                   {count, arr.shape, host.data()},
                                   {arr.a, arr.sa, arr.b, arr.sb},
                                   {{}, const_cast<const Bf16**>(arr.c), arr.sc, arr.c, arr.sc},
                                   hw};
  args.epilogue.thread.alpha = g.alpha;
  args.epilogue.thread.beta = g.beta;
  return args;
}

template <class G>
std::vector<typename G::Shape> host_shapes(const Sm90Grouped& g, const GroupRows& rows, int count) {
  std::vector<typename G::Shape> host(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i)
    host[static_cast<size_t>(i)] =
        cute::make_shape(rows.rows[i], static_cast<int>(g.n), static_cast<int>(g.k));
  return host;
}

template <class G>
size_t scratch_bytes(const Sm90Grouped& g, const GroupRows& rows, int count, const Sm90Launch& at) {
  const Arrays<G> arr = arrays<G>(nullptr, count);
  const auto host = host_shapes<G>(g, rows, count);
  return arr.bytes + G::Gemm::get_workspace_size(arguments<G>(g, count, at, arr, host));
}

template <class G>
const char* run(const Sm90Grouped& g, const GroupRows& rows, int count, const Sm90Launch& at,
                void* scratch) {
  const Arrays<G> arr = arrays<G>(scratch, count);
  layout_kernel<G><<<(count + 127) / 128, 128, 0, at.stream>>>(rows, count, g, arr);
  if (cudaGetLastError() != cudaSuccess) return "the layout kernel's launch";
  const auto host = host_shapes<G>(g, rows, count);
  const auto args = arguments<G>(g, count, at, arr, host);
  typename G::Gemm gemm;
  cutlass::Status s = gemm.can_implement(args);
  if (s == cutlass::Status::kSuccess)
    s = gemm.initialize(args, static_cast<char*>(scratch) + arr.bytes, at.stream);
  if (s == cutlass::Status::kSuccess) s = gemm.run(at.stream);
  if (s != cutlass::Status::kSuccess) return cutlassGetStatusString(s);
  return cudaGetLastError() == cudaSuccess ? nullptr : "the grouped kernel's launch";
}

using Forward = Sm90Gemm<ForwardMainloop>;      // W_g [n, k]: K-major B
using InputGrad = Sm90Gemm<InputGradMainloop>;  // W_g [k, n]: N-major B

bool aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

bool sm90_grouped_fits(const Sm90Grouped& g, int count) {
  return count > 0 && count <= kMaxGroups && aligned(g.a) && aligned(g.w) && aligned(g.c) &&
         g.lda % 8 == 0 && g.ldc % 8 == 0 && g.n % 8 == 0 && g.k % 8 == 0 && g.n <= INT32_MAX &&
         g.k <= INT32_MAX;
}

size_t sm90_grouped_scratch(const Sm90Grouped& g, const GroupRows& rows, int count,
                            const Sm90Launch& at) {
  return g.w_nk ? scratch_bytes<Forward>(g, rows, count, at)
                : scratch_bytes<InputGrad>(g, rows, count, at);
}

const char* sm90_grouped_gemm(const Sm90Grouped& g, const GroupRows& rows, int count,
                              const Sm90Launch& at, void* scratch) {
  return g.w_nk ? run<Forward>(g, rows, count, at, scratch)
                : run<InputGrad>(g, rows, count, at, scratch);
}

}  // namespace mt::ops::cuda
