// grouped_gemm_sm90_swiglu.h: the down projection's input gradient with SwiGLU's backward as its
// epilogue. The epilogue visitor tree is dg = node(acc, C): the accumulator is dh, C (TMA-loaded
// per group, like the plain kernels' C) is g, and the node reads u and writes du through registers,
// predicated on the group's rows and n, from per-group row pointers (the ptr-array kernel hands the
// epilogue the group index as the tile's l coordinate; CUTLASS's own auxiliary loads and stores
// take one tensor for every group).
#include "ops/cuda/cutlass/grouped_gemm_sm90_swiglu.h"

#include "ops/cuda/cutlass/grouped_gemm_sm90_impl.cuh"

namespace mt::ops::cuda {

namespace sm90 {
namespace {

namespace fusion = cutlass::epilogue::fusion;

struct SwigluGradNode {
  struct SharedStorage {};
  struct Arguments {
    Bf16 const* const* u = nullptr;  // per group: u of its first row
    Bf16* const* du = nullptr;       // per group: du of its first row
    Bf16* const* h = nullptr;        // per group: h of its first row; nullptr: h not written
    int64_t ld_u = 0, ld_du = 0, ld_h = 0;
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args,
                                                  void*) {
    return args;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const&) {
    return true;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*,
                                              cudaStream_t, cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_HOST_DEVICE SwigluGradNode() {}
  CUTLASS_HOST_DEVICE SwigluGradNode(Params const& params, SharedStorage const&)
      : params_ptr(&params) {}

  Params const* params_ptr = nullptr;

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }

  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(
      fusion::detail::ProducerLoadArgs<Args...> const&) {
    return fusion::detail::EmptyProducerLoadCallbacks{};
  }

  template <class GU, class GDu, class R, class C, class Shape>
  struct ConsumerStoreCallbacks : fusion::detail::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(GU&& gu, GDu&& gdu, GDu&& gh, R&& ru, R&& rdu, R&& rh,
                                          C&& c, Shape shape, bool with_h)
        : tC_gU(cute::forward<GU>(gu)),
          tC_gDu(cute::forward<GDu>(gdu)),
          tC_gH(cute::forward<GDu>(gh)),
          tC_rU(cute::forward<R>(ru)),
          tC_rDu(cute::forward<R>(rdu)),
          tC_rH(cute::forward<R>(rh)),
          tC_c(cute::forward<C>(c)),
          shape_mnl(shape),
          with_h(with_h) {}

    GU tC_gU;
    GDu tC_gDu, tC_gH;
    R tC_rU, tC_rDu, tC_rH;
    C tC_c;
    Shape shape_mnl;
    bool with_h;

    // The widest access the register layout allows (pairs of columns at least, 16 bytes at most).
    static constexpr auto kCommon = decltype(cute::max_common_layout(
        cute::declval<GU>()(cute::_, cute::_, cute::_, cute::_0{}, cute::_0{}),
        cute::declval<R>())){};
    static constexpr int kV = cute::min(8, int(cute::size(kCommon)));

    // This thread's predicates over one epilogue subtile, kV elements each.
    CUTLASS_DEVICE auto predicates(int epi_m, int epi_n) {
      using namespace cute;
      Tensor c = tensor<1>(
          zipped_divide(coalesce(tC_c(_, _, _, epi_m, epi_n)), kCommon.compose(Int<kV>{})));
      return cute::lazy::transform(c, [&](auto const& x) { return elem_less(x, shape_mnl); });
    }

    CUTLASS_DEVICE void begin_loop(int epi_m, int epi_n) {
      using namespace cute;
      Tensor g = recast<cutlass::Array<Bf16, kV>>(coalesce(tC_gU(_, _, _, epi_m, epi_n)));
      Tensor r = recast<cutlass::Array<Bf16, kV>>(coalesce(tC_rU));
      copy_if(predicates(epi_m, epi_n), g, r);
    }

    template <typename ElementAccumulator, typename ElementDh, typename ElementG, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<float, FragmentSize> visit(
        cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int, int,
        cutlass::Array<ElementDh, FragmentSize> const& dh,
        cutlass::Array<ElementG, FragmentSize> const& g) {
      using Frag = cutlass::Array<Bf16, FragmentSize>;
      const Frag u = cute::recast<Frag>(tC_rU)(epi_v);
      Frag du, h;
      cutlass::Array<float, FragmentSize> dg;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        // grouped_ffn.cu's swiglu_bwd_kernel, on dh before any rounding.
        const float gi = static_cast<float>(g[i]), ui = static_cast<float>(u[i]),
                    di = static_cast<float>(dh[i]);
        const float s = 1.0f / (1.0f + expf(-gi));
        du[i] = static_cast<Bf16>(di * gi * s);
        dg[i] = di * ui * s * (1.0f + gi * (1.0f - s));
        h[i] = static_cast<Bf16>(gi / (1.0f + expf(-gi)) * ui);  // the forward kernel's h
      }
      cute::recast<Frag>(cute::coalesce(tC_rDu))(epi_v) = du;
      if (with_h) cute::recast<Frag>(cute::coalesce(tC_rH))(epi_v) = h;
      return dg;
    }

    CUTLASS_DEVICE void end_loop(int epi_m, int epi_n) {
      using namespace cute;
      Tensor g = recast<cutlass::Array<Bf16, kV>>(coalesce(tC_gDu(_, _, _, epi_m, epi_n)));
      Tensor r = recast<cutlass::Array<Bf16, kV>>(coalesce(tC_rDu));
      copy_if(predicates(epi_m, epi_n), r, g);
      if (!with_h) return;
      Tensor gh = recast<cutlass::Array<Bf16, kV>>(coalesce(tC_gH(_, _, _, epi_m, epi_n)));
      Tensor rh = recast<cutlass::Array<Bf16, kV>>(coalesce(tC_rH));
      copy_if(predicates(epi_m, epi_n), rh, gh);
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;
    // The group's own rows: its pointers, and the tile's l coordinate folded to 0.
    const auto coord = make_coord(m, n, k, Int<0>{});
    const auto shape = make_shape(M, N, Int<1>{});
    Tensor mU = make_tensor(make_gmem_ptr(params_ptr->u[l]), shape,
                            make_stride(params_ptr->ld_u, Int<1>{}, Int<0>{}));
    Tensor mDu = make_tensor(make_gmem_ptr(params_ptr->du[l]), shape,
                             make_stride(params_ptr->ld_du, Int<1>{}, Int<0>{}));
    const bool with_h = params_ptr->h != nullptr;
    Tensor mH = make_tensor(make_gmem_ptr(with_h ? params_ptr->h[l] : nullptr), shape,
                            make_stride(params_ptr->ld_h, Int<1>{}, Int<0>{}));
    const auto part = [&](auto const& t) {
      return fusion::detail::sm90_partition_for_epilogue<ReferenceSrc>(
          t, args.tile_shape_mnk, coord, args.epi_tile, args.tiled_copy, args.thread_idx);
    };
    Tensor tC_gU = part(mU);
    Tensor tC_gDu = part(mDu);
    Tensor tC_gH = part(mH);
    Tensor tC_rU = make_tensor<Bf16>(take<0, 3>(cute::shape(tC_gU)));
    Tensor tC_rDu = make_tensor<Bf16>(take<0, 3>(cute::shape(tC_gU)));
    Tensor tC_rH = make_tensor<Bf16>(take<0, 3>(cute::shape(tC_gU)));
    Tensor tC_c = part(make_identity_tensor(shape));
    return ConsumerStoreCallbacks<decltype(tC_gU), decltype(tC_gDu), decltype(tC_rU),
                                  decltype(tC_c), decltype(shape)>(
        cute::move(tC_gU), cute::move(tC_gDu), cute::move(tC_gH), cute::move(tC_rU),
        cute::move(tC_rDu), cute::move(tC_rH), cute::move(tC_c), shape, with_h);
  }
};

using Evt = fusion::Sm90EVT<SwigluGradNode, fusion::Sm90AccFetch, fusion::Sm90SrcFetch<Bf16>>;

// The fused kernel at tiles TM x TN x 64, clusters CM x 1, a kernel / epilogue schedule pair.
template <int TM, int TN, int CM, class Schedule, class EpilogueSchedule>
struct Fused {
  using Tile = cute::Shape<cute::Int<TM>, cute::Int<TN>, cute::_64>;
  using Cluster = cute::Shape<cute::Int<CM>, cute::_1, cute::_1>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, Bf16, RowMajor*, 8, Bf16,
      RowMajor*, 8, EpilogueSchedule, Evt>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, RowMajor*, 8, Bf16, RowMajor*, 8,
      float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      Schedule>::CollectiveOp;
  using G = Sm90Gemm<Mainloop, Epilogue>;
  static_assert(G::kAKMajor && !G::kBKMajor, "dY K-major, W_g N-major, as the InputGrad form");
};
// The forward forms' default tile and cluster, and the ping-pong 128 x 128 one (its epilogue, the
// heavier one here, under the other warpgroup's MMAs).
using FusedCooperative = Fused<128, 256, 2, Cooperative, CooperativeEpilogue>::G;
using FusedPingpong = Fused<128, 128, 2, Pingpong, PingpongEpilogue>::G;

template <class G>
struct FusedArrays {
  using StrideD = typename G::Kernel::InternalStrideD;
  typename G::Shape* shape = nullptr;
  const Bf16** a = nullptr;
  const Bf16** b = nullptr;
  const Bf16** c = nullptr;
  Bf16** d = nullptr;
  const Bf16** u = nullptr;
  Bf16** du = nullptr;
  Bf16** h = nullptr;  // not read where h is not written
  typename G::StrideA* sa = nullptr;
  typename G::StrideB* sb = nullptr;
  typename G::StrideC* sc = nullptr;
  StrideD* sd = nullptr;
  size_t bytes = 0;
};

template <class G>
FusedArrays<G> fused_arrays(void* scratch, int count) {
  auto* base = static_cast<char*>(scratch);
  FusedArrays<G> r;
  size_t at = 0;
  r.shape = carve<typename G::Shape>(base, at, count);
  r.a = carve<const Bf16*>(base, at, count);
  r.b = carve<const Bf16*>(base, at, count);
  r.c = carve<const Bf16*>(base, at, count);
  r.d = carve<Bf16*>(base, at, count);
  r.u = carve<const Bf16*>(base, at, count);
  r.du = carve<Bf16*>(base, at, count);
  r.h = carve<Bf16*>(base, at, count);
  r.sa = carve<typename G::StrideA>(base, at, count);
  r.sb = carve<typename G::StrideB>(base, at, count);
  r.sc = carve<typename G::StrideC>(base, at, count);
  r.sd = carve<typename FusedArrays<G>::StrideD>(base, at, count);
  r.bytes = at;
  return r;
}

template <class G>
__global__ void fused_layout_kernel(GroupRows t, int count, Sm90SwigluGrad g, FusedArrays<G> out) {
  using cute::_1;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const int64_t row0 = t.row0[i], group = t.group[i];
  out.shape[i] = cute::make_shape(t.rows[i], static_cast<int>(g.n), static_cast<int>(g.k));
  out.a[i] = static_cast<const Bf16*>(g.dy) + row0 * g.ld_dy;
  out.b[i] = static_cast<const Bf16*>(g.w) + group * (g.w_group ? g.w_group : g.n * g.k);
  const Bf16* gu = static_cast<const Bf16*>(g.gate_up) + row0 * g.ld_gate_up;
  Bf16* dgu = static_cast<Bf16*>(g.dgate_up) + row0 * g.ld_dgate_up;
  out.c[i] = gu;
  out.u[i] = gu + g.n;
  out.d[i] = dgu;
  out.du[i] = dgu + g.n;
  if (g.h) out.h[i] = static_cast<Bf16*>(g.h) + row0 * g.ld_h;
  out.sa[i] = cute::make_stride(g.ld_dy, _1{}, Zero{});              // dY: K-major
  out.sb[i] = cute::make_stride(_1{}, g.ldw ? g.ldw : g.n, Zero{});  // W_g [k, n]: N-major
  out.sc[i] = cute::make_stride(g.ld_gate_up, _1{}, Zero{});
  out.sd[i] = cute::make_stride(g.ld_dgate_up, _1{}, Zero{});
}

template <class G>
typename G::Gemm::Arguments fused_arguments(const Sm90SwigluGrad& g, int count,
                                            const Sm90Launch& at, const FusedArrays<G>& arr,
                                            const std::vector<typename G::Shape>& host) {
  cutlass::KernelHardwareInfo hw;
  hw.device_id = at.device;
  hw.sm_count = at.multiprocessors;
  typename G::Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGrouped,
                                   {count, arr.shape, host.data()},
                                   {arr.a, arr.sa, arr.b, arr.sb},
                                   {{}, arr.c, arr.sc, arr.d, arr.sd},
                                   hw};
  args.epilogue.thread = {
      {}, {}, {arr.u, arr.du, g.h ? arr.h : nullptr, g.ld_gate_up, g.ld_dgate_up, g.ld_h}};
  using Raster = decltype(args.scheduler.raster_order);
  args.scheduler.max_swizzle_size = at.config.swizzle;
  args.scheduler.raster_order = at.config.along_n ? Raster::AlongN : Raster::AlongM;
  return args;
}

template <class G>
std::vector<typename G::Shape> fused_shapes(const Sm90SwigluGrad& g, const GroupRows& rows,
                                            int count) {
  std::vector<typename G::Shape> host(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i)
    host[static_cast<size_t>(i)] =
        cute::make_shape(rows.rows[i], static_cast<int>(g.n), static_cast<int>(g.k));
  return host;
}

template <class G>
size_t fused_scratch(const Sm90SwigluGrad& g, const GroupRows& rows, int count,
                     const Sm90Launch& at) {
  const FusedArrays<G> arr = fused_arrays<G>(nullptr, count);
  const auto host = fused_shapes<G>(g, rows, count);
  return arr.bytes + G::Gemm::get_workspace_size(fused_arguments<G>(g, count, at, arr, host));
}

template <class G>
const char* fused_run(const Sm90SwigluGrad& g, const GroupRows& rows, int count,
                      const Sm90Launch& at, void* scratch) {
  const FusedArrays<G> arr = fused_arrays<G>(scratch, count);
  fused_layout_kernel<G><<<(count + 127) / 128, 128, 0, at.stream>>>(rows, count, g, arr);
  if (cudaGetLastError() != cudaSuccess) return "the layout kernel's launch";
  const auto host = fused_shapes<G>(g, rows, count);
  const auto args = fused_arguments<G>(g, count, at, arr, host);
  typename G::Gemm gemm;
  cutlass::Status s = gemm.can_implement(args);
  if (s == cutlass::Status::kSuccess)
    s = gemm.initialize(args, static_cast<char*>(scratch) + arr.bytes, at.stream);
  if (s == cutlass::Status::kSuccess) s = gemm.run(at.stream);
  if (s != cutlass::Status::kSuccess) return cutlassGetStatusString(s);
  return cudaGetLastError() == cudaSuccess ? nullptr : "the grouped kernel's launch";
}

// The ping-pong form where the input gradient's kernel is pingpong128x128c2x1
// (ops/grouped_matmul.h's kGroupedGemmKernels[3]), the cooperative one otherwise.
bool pingpong(const Sm90Launch& at) {
  return (at.config.dx_kernel >= 0 ? at.config.dx_kernel : at.config.kernel) == 3;
}

}  // namespace
}  // namespace sm90

bool sm90_swiglu_grad_fits(const Sm90SwigluGrad& g, int count) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return count > 0 && count <= kMaxGroups && aligned(g.dy) && aligned(g.w) && aligned(g.gate_up) &&
         aligned(g.dgate_up) && g.ld_dy % 8 == 0 && g.ldw % 8 == 0 && g.w_group % 8 == 0 &&
         g.ld_gate_up % 8 == 0 && g.ld_dgate_up % 8 == 0 && g.n % 8 == 0 && g.k % 8 == 0 &&
         (!g.h || (aligned(g.h) && g.ld_h % 8 == 0)) && g.n <= INT32_MAX && g.k <= INT32_MAX;
}

size_t sm90_swiglu_grad_scratch(const Sm90SwigluGrad& g, const GroupRows& rows, int count,
                                const Sm90Launch& at) {
  return sm90::pingpong(at) ? sm90::fused_scratch<sm90::FusedPingpong>(g, rows, count, at)
                            : sm90::fused_scratch<sm90::FusedCooperative>(g, rows, count, at);
}

const char* sm90_swiglu_grad(const Sm90SwigluGrad& g, const GroupRows& rows, int count,
                             const Sm90Launch& at, void* scratch) {
  return sm90::pingpong(at) ? sm90::fused_run<sm90::FusedPingpong>(g, rows, count, at, scratch)
                            : sm90::fused_run<sm90::FusedCooperative>(g, rows, count, at, scratch);
}

}  // namespace mt::ops::cuda
