// The SwiGLU epilogue node of the grouped GEMMs (grouped_gemm_sm90_swiglu.h's forms): a custom node
// of CUTLASS's epilogue visitor tree over the C source (g, TMA-loaded per group by the collective;
// UpInterleaved: none, g and u both from the accumulators) and the accumulators. The other half of
// gate_up and the side outputs move between registers and global memory directly (CUTLASS's
// auxiliary loads and stores take one tensor for every group), predicated by the group's rows:
// each quad transposes its pairs of adjacent columns so that every lane moves 16 bytes of a row
// (Callbacks). Down backward's u for the next sub-tile is loaded while the current one is computed
// (one sub-tile ahead), from L2, where the producer warp prefetched the tile's rows. Shared by the
// SwiGLU GEMMs (grouped_gemm_sm90_swiglu.cu) and the fused xa GEMM's interleaved form
// (grouped_gemm_sm90_lora_xa.cu).
#pragma once

#include <type_traits>
#include <utility>

#include "ops/cuda/cutlass/grouped_gemm_sm90_impl.cuh"
#include "ops/cuda/cutlass/grouped_gemm_sm90_swiglu.h"

namespace mt::ops::cuda::sm90 {

namespace fusion = cutlass::epilogue::fusion;

// 32-bit word of two bf16 (low: the first).
__device__ __forceinline__ uint32_t pack2(Bf16 a, Bf16 b) {
  return static_cast<uint32_t>(a.raw()) | (static_cast<uint32_t>(b.raw()) << 16);
}

// The node: Backward computes SwiGLU's derivative (returns dg for D), Up returns u for D,
// UpInterleaved the accumulators (g and u); all write h when the group has an h pointer.
template <Sm90SwigluForm kForm>
struct SwigluNode {
  static constexpr bool kBackward = kForm == Sm90SwigluForm::DownBackward;
  static constexpr bool kInterleaved = kForm == Sm90SwigluForm::UpInterleaved;
  struct SharedStorage {};
  struct Arguments {
    const Bf16* const* up = nullptr;  // Backward: each group's u rows
    Bf16* const* dup = nullptr;       // Backward: each group's du rows
    Bf16* const* h = nullptr;         // each group's h rows; null: none
    int64_t ldu = 0, lddu = 0, ldh = 0;
    bool narrow = false;  // Sm90Swiglu::narrow
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
  //
  // A sub-tile's fragment holds, per thread, two rows (8 apart) of four 8-column blocks, a pair of
  // adjacent columns in each (wgmma's accumulator layout: lane q of a quad has columns 2q, 2q + 1
  // of every block, the quad one row). Moved as they are, that is 4-byte accesses each touching
  // half a sector; instead the quad transposes its pairs with shuffles so that lane q moves block
  // q of the row whole, one 16-byte access (4x fewer memory instructions, whole sectors). The
  // layout is checked (at compile time where it folds, and the quad's rows and columns at run
  // time); where it does not hold, the pairs move as 4-byte words.
  template <class GU, class GO, class RU, class CT, class Res>
  struct Callbacks : fusion::detail::EmptyConsumerStoreCallbacks {
    static constexpr int EM = decltype(cute::size<3>(std::declval<RU&>()))::value;
    static constexpr int EN = decltype(cute::size<4>(std::declval<RU&>()))::value;
    static constexpr int kSub = decltype(cute::size(std::declval<RU&>()))::value / (EM * EN);

    CUTLASS_DEVICE Callbacks(GU gu_, GO gdu_, GO gh_, RU ru_, CT cd_, Res residue_, Bf16* h_rows,
                             int64_t ldh_, int M_, int N_, int lane, bool narrow)
        : gu(gu_),
          gdu(gdu_),
          gh(gh_),
          ru(ru_),
          cd(cd_),
          residue(residue_),
          has_h(h_rows != nullptr),
          q(lane % 4),
          hrows(h_rows),
          ldh(ldh_),
          M(M_),
          N(N_) {
      quad = layout_fits() && !narrow;
      // UpInterleaved has no 4-byte fallback: a layout other than the one it was written for (a
      // CUTLASS change) stops the kernel rather than writing h wrong.
      if constexpr (kInterleaved)
        if (!quad || !interleave_fits()) __trap();
    }
    GU gu;
    GO gdu, gh;
    RU ru;
    CT cd;
    Res residue;
    bool has_h;
    int q;
    bool quad = false;
    Bf16 du_[kSub], h_[kSub];  // the current sub-tile's, by fragment index
    // UpInterleaved: the sub-tile's g and u as gate_up keeps them, two a word (element j in half
    // j % 2 of word j / 2): half the registers of h_'s 16, where the fused xa GEMM's mainloop
    // leaves few.
    uint32_t packed_[kSub / 2] = {};
    CUTLASS_DEVICE void set_packed(int j, Bf16 v) {
      const uint32_t bits = v.raw(), shift = 16u * static_cast<uint32_t>(j % 2);
      packed_[j / 2] = (packed_[j / 2] & ~(0xffffu << shift)) | (bits << shift);
    }
    CUTLASS_DEVICE float packed(int j) const {
      const uint32_t shift = 16u * static_cast<uint32_t>(j % 2);
      return static_cast<float>(Bf16::bitcast(static_cast<uint16_t>(packed_[j / 2] >> shift)));
    }
    // UpInterleaved: the group's h rows, and its problem's M and N (the absolute coordinates).
    Bf16* hrows;
    int64_t ldh;
    int M, N;

    // Whether elements j and j + 1 of a sub-tile's fragment are one row's adjacent columns.
    template <class C>
    CUTLASS_DEVICE static bool paired(C const& c, int j) {
      return cute::get<0>(c(j)) == cute::get<0>(c(j + 1)) &&
             cute::get<1>(c(j + 1)) == cute::get<1>(c(j)) + 1;
    }

    // Element j's slot r * 8 + b * 2 + e (row r of two, block b of four, column e of the pair) in
    // sub-tile (em, en), or -1 where the fragment is not that layout.
    CUTLASS_DEVICE int slot(int em, int en, int j) const {
      using cute::_;
      auto c = cd(_, _, _, em, en);
      const int dm = cute::get<0>(c(j)) - cute::get<0>(c(0)),
                dn = cute::get<1>(c(j)) - cute::get<1>(c(0));
      if ((dm != 0 && dm != 8) || dn < 0 || dn >= 32 || dn % 8 > 1) return -1;
      return (dm / 8) * 8 + (dn / 8) * 2 + dn % 8;
    }
    // Fragment index of slot s in sub-tile (em, en) (slot() inverted; -1 for none).
    CUTLASS_DEVICE int index_of(int em, int en, int s) const {
      int found = -1;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kSub; ++j)
        if (slot(em, en, j) == s) found = j;
      return found;
    }

    CUTLASS_DEVICE bool layout_fits() const {
      bool ok = kSub == 16;
      if constexpr (kSub == 16) {
        CUTLASS_PRAGMA_UNROLL
        for (int em = 0; em < EM; ++em) CUTLASS_PRAGMA_UNROLL
        for (int en = 0; en < EN; ++en) {
          int seen = 0;
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < kSub; ++j) {
            const int s = slot(em, en, j);
            ok = ok && s >= 0;
            seen |= s >= 0 ? 1 << s : 0;
          }
          ok = ok && seen == 0xffff;
        }
      }
      // The quad's lanes: one row, first columns 2q apart from a block start a multiple of 8 (so
      // 16-byte aligned): residue (M, N) - (row, column) of each lane's first element.
      const int rm = static_cast<int>(cute::get<0>(residue)),
                rn = static_cast<int>(cute::get<1>(residue)) + 2 * q;
      // (Every lane runs every shuffle: none under a short-circuit.)
      const int rm1 = __shfl_xor_sync(0xffffffffu, rm, 1),
                rm2 = __shfl_xor_sync(0xffffffffu, rm, 2),
                rn1 = __shfl_xor_sync(0xffffffffu, rn, 1),
                rn2 = __shfl_xor_sync(0xffffffffu, rn, 2);
      ok = ok && rn % 8 == 0 && rm1 == rm && rm2 == rm && rn1 == rn && rn2 == rn;
      return __all_sync(0xffffffffu, ok);
    }

    // UpInterleaved: every sub-tile starts at a column that is a multiple of 32, so that its
    // blocks 0, 1 are g and 2, 3 the matching u (this lane's columns are 2q, 2q + 1 of a block).
    CUTLASS_DEVICE bool interleave_fits() const {
      using cute::_;
      bool ok = true;
      CUTLASS_PRAGMA_UNROLL
      for (int em = 0; em < EM; ++em) CUTLASS_PRAGMA_UNROLL
      for (int en = 0; en < EN; ++en) {
        const int n = column(em, en, 0) - 2 * q;
        ok = ok && n % 32 == 0;
      }
      return __all_sync(0xffffffffu, ok);
    }

    // The absolute row and column (in the group's problem) of element j of sub-tile (em, en).
    CUTLASS_DEVICE int row(int em, int en, int j) const {
      using cute::_;
      return M - static_cast<int>(cute::get<0>(residue)) +
             static_cast<int>(cute::get<0>(cd(_, _, _, em, en)(j)));
    }
    CUTLASS_DEVICE int column(int em, int en, int j) const {
      using cute::_;
      return N - static_cast<int>(cute::get<1>(residue)) +
             static_cast<int>(cute::get<1>(cd(_, _, _, em, en)(j)));
    }

    // Lane q's four 32-bit words p[b] (its pair in block b of the row) become p[i] = lane i's pair
    // in block q: a 4 x 4 transpose across the quad (its own inverse).
    CUTLASS_DEVICE void transpose(uint32_t (&p)[4]) const {
      CUTLASS_PRAGMA_UNROLL
      for (int s = 2; s >= 1; s /= 2) {
        const bool up = (q & s) != 0;
        CUTLASS_PRAGMA_UNROLL
        for (int k = 0; k < 2; ++k) {
          const int lo = s == 2 ? k : 2 * k, hi = s == 2 ? k + 2 : 2 * k + 1;
          const uint32_t send = up ? p[lo] : p[hi];
          const uint32_t got = __shfl_xor_sync(0xffffffffu, send, s);
          if (up)
            p[lo] = got;
          else
            p[hi] = got;
        }
      }
    }

    // Whether row r's block q (lane q's 16-byte part) of sub-tile (em, en) is inside the group.
    CUTLASS_DEVICE bool part_in(int em, int en, int r) const {
      using cute::_;
      auto c = cd(_, _, _, em, en);
      const int j = index_of(em, en, r * 8);
      return cute::get<0>(c(j)) < cute::get<0>(residue) &&
             cute::get<1>(c(j)) + 6 * q < cute::get<1>(residue);
    }

    CUTLASS_DEVICE void load(int em, int en) {
      if constexpr (kBackward) {
        using cute::_;
        auto g = gu(_, _, _, em, en);
        auto r = ru(_, _, _, em, en);
        auto c = cd(_, _, _, em, en);
        if constexpr (kSub == 16) {
          if (quad) {
            load_quad(g, r, em, en);
            return;
          }
        }
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kSub; j += 2) {
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

    template <class G, class R>
    CUTLASS_DEVICE void load_quad(G& g, R& r, int em, int en) {
      CUTLASS_PRAGMA_UNROLL
      for (int row = 0; row < 2; ++row) {
        const int j0 = index_of(em, en, row * 8);
        uint4 v = make_uint4(0, 0, 0, 0);
        if (part_in(em, en, row)) v = __ldg(reinterpret_cast<const uint4*>(&g(j0) + 6 * q));
        uint32_t p[4] = {v.x, v.y, v.z, v.w};
        transpose(p);
        CUTLASS_PRAGMA_UNROLL
        for (int b = 0; b < 4; ++b) {
          r(index_of(em, en, row * 8 + b * 2)) = Bf16::bitcast(static_cast<uint16_t>(p[b]));
          r(index_of(em, en, row * 8 + b * 2 + 1)) =
              Bf16::bitcast(static_cast<uint16_t>(p[b] >> 16));
        }
      }
    }

    // A sub-tile's values (du_ or h_) into `out`'s sub-tile (em, en).
    template <class G>
    CUTLASS_DEVICE void store(G& out, const Bf16 (&v)[kSub], int em, int en) {
      using cute::_;
      auto o = out(_, _, _, em, en);
      auto c = cd(_, _, _, em, en);
      if constexpr (kSub == 16) {
        if (quad) {
          store_quad(o, v, em, en);
          return;
        }
      }
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kSub; j += 2) {
        const bool in0 = cute::elem_less(c(j), residue);
        const bool in1 = cute::elem_less(c(j + 1), residue);
        if (paired(c, j)) {
          if (in0) *reinterpret_cast<uint32_t*>(&o(j)) = pack2(v[j], v[j + 1]);
        } else {
          if (in0) o(j) = v[j];
          if (in1) o(j + 1) = v[j + 1];
        }
      }
    }

    template <class O>
    CUTLASS_DEVICE void store_quad(O& o, const Bf16 (&v)[kSub], int em, int en) {
      CUTLASS_PRAGMA_UNROLL
      for (int row = 0; row < 2; ++row) {
        uint32_t p[4];
        CUTLASS_PRAGMA_UNROLL
        for (int b = 0; b < 4; ++b)
          p[b] =
              pack2(v[index_of(em, en, row * 8 + b * 2)], v[index_of(em, en, row * 8 + b * 2 + 1)]);
        transpose(p);
        if (part_in(em, en, row))
          *reinterpret_cast<uint4*>(&o(index_of(em, en, row * 8)) + 6 * q) =
              make_uint4(p[0], p[1], p[2], p[3]);
      }
    }

    CUTLASS_DEVICE void begin() { load(0, 0); }

    // The collective runs the sub-tiles with epi_m inner: load the next one's u.
    CUTLASS_DEVICE void begin_loop(int em, int en) {
      if constexpr (kBackward) {
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
      using cute::_;
      cutlass::Array<float, FS> out;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FS; ++i) {
        const int j = epi_v * FS + i;
        if constexpr (kInterleaved) {  // h waits for the sub-tile's u (end_loop)
          out[i] = static_cast<float>(acc[i]);
          set_packed(j, Bf16(acc[i]));  // g or u, as gate_up keeps it
          continue;
        }
        const float g = static_cast<float>(src[i]);
        // The unfused passes' formulas (ops/cuda/grouped_ffn.cu), with the sigmoid from the fast
        // exponential and division, once an element: with two warpgroups an SM, the IEEE expf and
        // division (twice an element in backward) made the epilogue longer than the tile's MMAs
        // (mid-session call: A frozen 5.39 -> 6.48 ms). Their error (a few ulp of f32) is far
        // below bf16's. Backward takes dh in f32 from the accumulator (one rounding fewer than the
        // separate passes, which read it back in bf16).
        const float sg = __fdividef(1.0f, 1.0f + __expf(-g));  // 0 where exp(-g) overflows
        if constexpr (kBackward) {
          const float d = static_cast<float>(acc[i]);
          const float u = static_cast<float>(ru(_, _, _, em, en)(j));
          du_[j] = Bf16(d * g * sg);
          out[i] = d * u * sg * (1.0f + g * (1.0f - sg));
          h_[j] = Bf16(g * sg * u);  // (a branch here on has_h made ptxas spill)
        } else {
          // u as gate_up keeps it (bf16), so that backward's h from gate_up is this one.
          const float u = static_cast<float>(Bf16(acc[i]));
          out[i] = static_cast<float>(acc[i]);
          h_[j] = Bf16(g * sg * u);
        }
      }
      return out;
    }

    CUTLASS_DEVICE void end_loop(int em, int en) {
      if constexpr (kInterleaved) {
        if (has_h) store_interleaved(em, en);
        return;
      }
      if constexpr (kBackward) store(gdu, du_, em, en);
      if (has_h) store(gh, h_, em, en);
    }

    // UpInterleaved: h from the sub-tile's g (blocks 0, 1, slots 8 r + 2 b + e) and u (blocks 2,
    // 3: four slots on), as the quad's four 16-byte parts of two rows x two blocks; lane q moves
    // row q / 2's block q % 2, 8 columns of h at (column / 32) 16 + column % 32.
    CUTLASS_DEVICE void store_interleaved(int em, int en) {
      const auto swish = [&](int s) {
        const float g = packed(index_of(em, en, s));
        const float u = packed(index_of(em, en, s + 4));
        return Bf16(g * __fdividef(1.0f, 1.0f + __expf(-g)) * u);  // as visit's Up
      };
      uint32_t p[4];
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < 4; ++k) {
        const int s = k / 2 * 8 + k % 2 * 2;
        p[k] = pack2(swish(s), swish(s + 1));
      }
      transpose(p);
      const int j = index_of(em, en, q / 2 * 8 + q % 2 * 2);
      const int m = row(em, en, j), n = column(em, en, j) - 2 * q;
      if (m < M && n < N)
        *reinterpret_cast<uint4*>(hrows + static_cast<int64_t>(m) * ldh + n / 32 * 16 + n % 32) =
            make_uint4(p[0], p[1], p[2], p[3]);
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
    auto gh = part(kInterleaved ? nullptr : h, params.ldh);
    auto ru = cute::make_tensor<Bf16>(cute::shape(gu));
    return Callbacks<decltype(gu), decltype(gdu), decltype(ru), decltype(args.tCcD),
                     decltype(args.residue_tCcD)>(
        gu, gdu, gh, ru, args.tCcD, args.residue_tCcD, h, params.ldh, static_cast<int>(M),
        static_cast<int>(N), args.thread_idx % 32, params.narrow);
  }
};

template <Sm90SwigluForm kForm>
using SwigluEvt =
    fusion::Sm90EVT<SwigluNode<kForm>,
                    std::conditional_t<kForm == Sm90SwigluForm::UpInterleaved, fusion::Sm90AccFetch,
                                       fusion::Sm90SrcFetch<Bf16>>>;

}  // namespace mt::ops::cuda::sm90
