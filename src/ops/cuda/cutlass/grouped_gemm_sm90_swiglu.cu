// The SwiGLU epilogues of grouped_gemm_sm90_swiglu.h: a custom node of CUTLASS's epilogue visitor
// tree over the C source (g, TMA-loaded per group by the collective) and the accumulators. The
// other half of gate_up and the side outputs move between the thread's registers and global memory
// directly, in the accumulator fragment's own layout: each thread holds pairs of adjacent columns
// (the STSM copy's 32-bit units), so they move as 4-byte words, predicated by the group's rows.
// Down backward's u for the next sub-tile is loaded while the current one is computed (one
// sub-tile ahead: 8 registers), so its latency overlaps the collective's wait for C.
#include <utility>

#include "ops/cuda/cutlass/grouped_gemm_sm90_impl.cuh"
#include "ops/cuda/cutlass/grouped_gemm_sm90_swiglu.h"

namespace mt::ops::cuda {

namespace sm90 {
namespace {

namespace fusion = cutlass::epilogue::fusion;

// 32-bit word of two bf16 (low: the first).
__device__ __forceinline__ uint32_t pack2(Bf16 a, Bf16 b) {
  return static_cast<uint32_t>(a.raw()) | (static_cast<uint32_t>(b.raw()) << 16);
}

// The node: Backward computes SwiGLU's derivative (returns dg for D), Up returns u for D; both
// write h when the group has an h pointer.
template <bool kBackward>
struct SwigluNode {
  struct SharedStorage {};
  struct Arguments {
    const Bf16* const* up = nullptr;  // Backward: each group's u rows
    Bf16* const* dup = nullptr;       // Backward: each group's du rows
    Bf16* const* h = nullptr;         // each group's h rows; null: none
    int64_t ldu = 0, lddu = 0, ldh = 0;
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

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }

  CUTLASS_HOST_DEVICE SwigluNode() {}
  CUTLASS_HOST_DEVICE SwigluNode(Params const& p, SharedStorage const&) : params(p) {}
  Params params;

  // Down backward: the producer warp asks L2 for the tile's u rows as it starts the tile's C loads
  // (during the previous tile's epilogue, a mainloop ahead of this one's), so that the consumers'
  // direct loads hit L2 (moe13's node loaded u from HBM at each sub-tile and measured its GEMM
  // slower than the SwiGLU pass it saved).
  struct PrefetchCallbacks : fusion::detail::EmptyProducerLoadCallbacks {
    CUTLASS_DEVICE PrefetchCallbacks(const Bf16* u_, int64_t ld_, int rows_, int bytes_, int lane_)
        : u(u_), ld(ld_), rows(rows_), bytes(bytes_), lane(lane_) {}
    const Bf16* u;
    int64_t ld;
    int rows, bytes, lane;
    CUTLASS_DEVICE void begin() {
      if (u == nullptr || bytes <= 0) return;
      for (int r = lane; r < rows; r += 32)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(u + r * ld), "r"(bytes)
                     : "memory");
    }
  };

  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(
      fusion::detail::ProducerLoadArgs<Args...> const& args) {
    if constexpr (kBackward) {
      const int M = cute::get<0>(args.problem_shape_mnkl),
                N = cute::get<1>(args.problem_shape_mnkl);
      const int tm = cute::size<0>(args.tile_shape_mnk), tn = cute::size<1>(args.tile_shape_mnk);
      const int m0 = cute::get<0>(args.tile_coord_mnkl) * tm,
                n0 = cute::get<1>(args.tile_coord_mnkl) * tn;
      const int l = cute::get<3>(args.tile_coord_mnkl);
      // Whole rows of the tile: 16-byte multiples (n0 a multiple of the tile, N of 8).
      const int rows = cute::min(tm, M - m0), cols = cute::min(tn, N - n0);
      return PrefetchCallbacks(params.up[l] + m0 * params.ldu + n0, params.ldu, rows,
                               cols * static_cast<int>(sizeof(Bf16)), args.thread_idx % 32);
    } else {
      return fusion::detail::EmptyProducerLoadCallbacks{};
    }
  }

  // GU, GO: (CPY, CPY_M, CPY_N, EPI_M, EPI_N) global views of u and of du / h; RU: u's registers;
  // CT, Res: the thread's coordinates and its residue (the collective's tCcD, residue_tCcD).
  template <class GU, class GO, class RU, class CT, class Res>
  struct Callbacks : fusion::detail::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE Callbacks(GU gu_, GO gdu_, GO gh_, RU ru_, CT cd_, Res residue_, bool has_h_)
        : gu(gu_), gdu(gdu_), gh(gh_), ru(ru_), cd(cd_), residue(residue_), has_h(has_h_) {}
    GU gu;
    GO gdu, gh;
    RU ru;
    CT cd;
    Res residue;
    bool has_h;

    // Whether elements j and j + 1 of a sub-tile's fragment are one row's adjacent columns (they
    // are in the STSM copy's layout; the test folds at compile time, the fallback is for safety).
    template <class C>
    CUTLASS_DEVICE static bool paired(C const& c, int j) {
      return cute::get<0>(c(j)) == cute::get<0>(c(j + 1)) &&
             cute::get<1>(c(j + 1)) == cute::get<1>(c(j)) + 1;
    }

    CUTLASS_DEVICE void load(int em, int en) {
      if constexpr (kBackward) {
        using cute::_;
        auto g = gu(_, _, _, em, en);
        auto r = ru(_, _, _, em, en);
        auto c = cd(_, _, _, em, en);
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < cute::size(g); j += 2) {
          if (paired(c, j)) {
            uint32_t v = 0;
            if (cute::elem_less(c(j), residue)) v = __ldg(reinterpret_cast<const uint32_t*>(&g(j)));
            r(j) = Bf16::bitcast(static_cast<uint16_t>(v & 0xffffu));
            r(j + 1) = Bf16::bitcast(static_cast<uint16_t>(v >> 16));
          } else {
            r(j) = cute::elem_less(c(j), residue) ? g(j) : Bf16(0.f);
            r(j + 1) = cute::elem_less(c(j + 1), residue) ? g(j + 1) : Bf16(0.f);
          }
        }
      }
    }

    CUTLASS_DEVICE void begin() { load(0, 0); }

    // The collective runs the sub-tiles with epi_m inner: load the next one's u.
    CUTLASS_DEVICE void begin_loop(int em, int en) {
      if constexpr (kBackward) {
        constexpr int EM = decltype(cute::size<3>(std::declval<RU&>()))::value;
        constexpr int EN = decltype(cute::size<4>(std::declval<RU&>()))::value;
        if (em + 1 < EM)
          load(em + 1, en);
        else if (en + 1 < EN)
          load(0, en + 1);
      }
    }

    template <class Acc, class In, int FS>
    CUTLASS_DEVICE cutlass::Array<float, FS> visit(cutlass::Array<Acc, FS> const& acc, int epi_v,
                                                   int em, int en,
                                                   cutlass::Array<In, FS> const& src) {
      static_assert(FS % 2 == 0, "the fragment holds column pairs");
      using cute::_;
      auto c = cd(_, _, _, em, en);
      cutlass::Array<float, FS> out;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FS; i += 2) {
        const int j = epi_v * FS + i;
        [[maybe_unused]] Bf16 du[2];
        Bf16 hv[2];
        CUTLASS_PRAGMA_UNROLL
        for (int k = 0; k < 2; ++k) {
          const float g = static_cast<float>(src[i + k]);
          // The unfused passes' expressions (ops/cuda/grouped_ffn.cu) on the values they read
          // back: dh and u rounded to bf16.
          if constexpr (kBackward) {
            const float d = static_cast<float>(Bf16(acc[i + k]));
            const float u = static_cast<float>(ru(_, _, _, em, en)(j + k));
            const float sg = 1.0f / (1.0f + expf(-g));
            du[k] = Bf16(d * g * sg);
            out[i + k] = d * u * sg * (1.0f + g * (1.0f - sg));
            hv[k] = Bf16(g / (1.0f + expf(-g)) * u);
          } else {
            const float u = static_cast<float>(Bf16(acc[i + k]));
            out[i + k] = static_cast<float>(acc[i + k]);
            hv[k] = Bf16(g / (1.0f + expf(-g)) * u);
          }
        }
        const bool in0 = cute::elem_less(c(j), residue);
        const bool in1 = cute::elem_less(c(j + 1), residue);
        if (paired(c, j)) {
          if (in0) {
            if constexpr (kBackward)
              *reinterpret_cast<uint32_t*>(&gdu(_, _, _, em, en)(j)) = pack2(du[0], du[1]);
            if (has_h) *reinterpret_cast<uint32_t*>(&gh(_, _, _, em, en)(j)) = pack2(hv[0], hv[1]);
          }
        } else {
          if constexpr (kBackward) {
            if (in0) gdu(_, _, _, em, en)(j) = du[0];
            if (in1) gdu(_, _, _, em, en)(j + 1) = du[1];
          }
          if (has_h && in0) gh(_, _, _, em, en)(j) = hv[0];
          if (has_h && in1) gh(_, _, _, em, en)(j + 1) = hv[1];
        }
      }
      return out;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    using cute::_1;
    const auto M = cute::get<0>(args.problem_shape_mnkl);
    const auto N = cute::get<1>(args.problem_shape_mnkl);
    const auto L = cute::get<3>(args.problem_shape_mnkl);
    const auto l = cute::get<3>(args.tile_coord_mnkl);
    // Each group's rows by its own pointer: the L mode is the group, at stride 0.
    const auto part = [&](auto* ptr, int64_t ld) {
      auto t = cute::make_tensor(
          cute::make_gmem_ptr(ptr),
          cute::make_layout(cute::make_shape(M, N, L), cute::make_stride(ld, _1{}, Zero{})));
      return fusion::detail::sm90_partition_for_epilogue<ReferenceSrc>(
          t, args.tile_shape_mnk, args.tile_coord_mnkl, args.epi_tile, args.tiled_copy,
          args.thread_idx);
    };
    const Bf16* up = kBackward ? params.up[l] : nullptr;
    Bf16* dup = kBackward ? params.dup[l] : nullptr;
    Bf16* h = params.h ? params.h[l] : nullptr;
    auto gu = part(up, params.ldu);
    auto gdu = part(dup, params.lddu);
    auto gh = part(h, params.ldh);
    auto ru = cute::make_tensor<Bf16>(cute::shape(gu));
    return Callbacks<decltype(gu), decltype(gdu), decltype(ru), decltype(args.tCcD),
                     decltype(args.residue_tCcD)>(gu, gdu, gh, ru, args.tCcD, args.residue_tCcD,
                                                  h != nullptr);
  }
};

template <bool kBackward>
using SwigluEvt = fusion::Sm90EVT<SwigluNode<kBackward>, fusion::Sm90SrcFetch<Bf16>>;

// Two configurations of each form: grouped_gemm_sm90.h's default (cooperative 128 x 256 x 64,
// cluster 2 x 1) and ping-pong 128 x 128 x 64 (cluster 2 x 1), whose epilogue, the heavier one
// here, runs under the other warpgroup's MMAs.
using CoopTile = cute::Shape<cute::_128, cute::_256, cute::_64>;
using PingTile = cute::Shape<cute::_128, cute::_128, cute::_64>;
using SwCluster = cute::Shape<cute::_2, cute::_1, cute::_1>;

#define MT_SM90_SWIGLU_GEMM(Name, Tile, Schedule, EpilogueSchedule, LayoutB, kBackward)           \
  using Name##Epilogue = cutlass::epilogue::collective::CollectiveBuilder<                        \
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, SwCluster,                       \
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, Bf16, RowMajor*, 8, Bf16,    \
      RowMajor*, 8, EpilogueSchedule, SwigluEvt<kBackward>>::CollectiveOp;                        \
  using Name##Mainloop = cutlass::gemm::collective::CollectiveBuilder<                            \
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, RowMajor*, 8, Bf16, LayoutB*, 8, \
      float, Tile, SwCluster,                                                                     \
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(                         \
          sizeof(Name##Epilogue::SharedStorage))>,                                                \
      Schedule>::CollectiveOp;                                                                    \
  using Name = Sm90Gemm<Name##Mainloop, Name##Epilogue>

MT_SM90_SWIGLU_GEMM(SwigluUp, CoopTile, Cooperative, CooperativeEpilogue, ColumnMajor, false);
MT_SM90_SWIGLU_GEMM(SwigluDown, CoopTile, Cooperative, CooperativeEpilogue, RowMajor, true);
MT_SM90_SWIGLU_GEMM(SwigluUpPingpong, PingTile, Pingpong, PingpongEpilogue, ColumnMajor, false);
MT_SM90_SWIGLU_GEMM(SwigluDownPingpong, PingTile, Pingpong, PingpongEpilogue, RowMajor, true);

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
  const Bf16* gate = static_cast<const Bf16*>(s.gate) + row0 * s.ldgate;
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
  out.up[i] = gate + g.n;
  out.dup[i] = d + g.n;
  out.h[i] = s.h ? static_cast<Bf16*>(s.h) + row0 * s.ldh : nullptr;
}

template <class G>
typename G::Gemm::Arguments sw_arguments(const Sm90Grouped& g, const Sm90Swiglu& s, int count,
                                         const Sm90Launch& at, const SwArrays<G>& arr,
                                         const std::vector<typename G::Shape>& host) {
  cutlass::KernelHardwareInfo hw;
  hw.device_id = at.device;
  hw.sm_count = at.multiprocessors;
  constexpr bool kBackward = !G::kBKMajor;
  typename SwigluNode<kBackward>::Arguments node;
  if constexpr (kBackward) {
    node.up = arr.up;
    node.dup = arr.dup;
  }
  node.h = s.h ? arr.h : nullptr;
  node.ldu = s.ldgate;
  node.lddu = g.ldc;
  node.ldh = s.ldh;
  typename G::Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGrouped,
                                   {count, arr.shape, host.data()},
                                   {arr.a, arr.sa, arr.b, arr.sb},
                                   {{{}, node}, arr.src, arr.ssrc, arr.d, arr.sd},
                                   hw};
  using Raster = decltype(args.scheduler.raster_order);
  args.scheduler.max_swizzle_size = at.config.swizzle;
  args.scheduler.raster_order = at.config.along_n ? Raster::AlongN : Raster::AlongM;
  return args;
}

template <class G>
size_t sw_scratch(const Sm90Grouped& g, const Sm90Swiglu& s, const GroupRows& rows, int count,
                  const Sm90Launch& at) {
  const SwArrays<G> arr = sw_arrays<G>(nullptr, count);
  const auto host = host_shapes<G>(g, rows, count);
  return arr.bytes + G::Gemm::get_workspace_size(sw_arguments<G>(g, s, count, at, arr, host));
}

template <class G>
const char* sw_run(const Sm90Grouped& g, const Sm90Swiglu& s, const GroupRows& rows, int count,
                   const Sm90Launch& at, void* scratch) {
  const SwArrays<G> arr = sw_arrays<G>(scratch, count);
  sw_layout_kernel<G><<<(count + 127) / 128, 128, 0, at.stream>>>(rows, count, g, s, arr);
  if (cudaGetLastError() != cudaSuccess) return "the layout kernel's launch";
  const auto host = host_shapes<G>(g, rows, count);
  const auto args = sw_arguments<G>(g, s, count, at, arr, host);
  typename G::Gemm gemm;
  cutlass::Status st = gemm.can_implement(args);
  if (st == cutlass::Status::kSuccess)
    st = gemm.initialize(args, static_cast<char*>(scratch) + arr.bytes, at.stream);
  if (st == cutlass::Status::kSuccess) st = gemm.run(at.stream);
  if (st != cutlass::Status::kSuccess) return cutlassGetStatusString(st);
  return cudaGetLastError() == cudaSuccess ? nullptr : "the grouped kernel's launch";
}

static_assert(SwigluUp::kBKMajor && !SwigluDown::kBKMajor && SwigluUpPingpong::kBKMajor &&
                  !SwigluDownPingpong::kBKMajor,
              "Up reads W_g K-major (X W^T), Down backward N-major (dY W)");

}  // namespace
}  // namespace sm90

namespace {

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

bool sm90_swiglu_fits(const Sm90Grouped& g, const Sm90Swiglu& s, int count) {
  const bool up = s.form == Sm90SwigluForm::Up;
  if (g.form != (up ? Sm90Form::Forward : Sm90Form::InputGrad)) return false;
  if (up && s.h == nullptr) return false;
  if (!aligned16(s.gate) || s.ldgate % 8 != 0) return false;
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
  if (s.form == Sm90SwigluForm::Up)
    return pingpong(s, at) ? sw_scratch<SwigluUpPingpong>(g, s, rows, count, at)
                           : sw_scratch<SwigluUp>(g, s, rows, count, at);
  return pingpong(s, at) ? sw_scratch<SwigluDownPingpong>(g, s, rows, count, at)
                         : sw_scratch<SwigluDown>(g, s, rows, count, at);
}

const char* sm90_swiglu_gemm(const Sm90Grouped& g, const Sm90Swiglu& s, const GroupRows& rows,
                             int count, const Sm90Launch& at, void* scratch) {
  using namespace sm90;
  if (s.form == Sm90SwigluForm::Up)
    return pingpong(s, at) ? sw_run<SwigluUpPingpong>(g, s, rows, count, at, scratch)
                           : sw_run<SwigluUp>(g, s, rows, count, at, scratch);
  return pingpong(s, at) ? sw_run<SwigluDownPingpong>(g, s, rows, count, at, scratch)
                         : sw_run<SwigluDown>(g, s, rows, count, at, scratch);
}

}  // namespace mt::ops::cuda
