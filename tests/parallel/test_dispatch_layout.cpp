// The expert dispatch layout (src/parallel/dispatch_layout.h) for P simulated ranks in one
// process. The transport is a plain copy of what the plan's counts and displacements say; the
// reference is written from the definition: destination q receives every row of every source
// whose expert lies in [q*El, (q+1)*El), once, and sees each chunk grouped by local expert in
// arrival order (source-major, then the source's row order); the combine returns each row's
// result to the row it came from.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>

#include "core/rng.h"
#include "harness/seed.h"
#include "parallel/comm.h"
#include "parallel/dispatch_layout.h"
#include "parallel/expert_parallel.h"

namespace mt::par {
namespace {

constexpr int64_t kWidth = 2;  // element 0: the row's id; element 1: its negation

struct Rank {
  std::vector<int32_t> offsets;  // [E+1]
  std::vector<int64_t> expert;   // expert of each row
  std::vector<float> send, recv, back, dst;
};

// Copies what chunk c of every source sends to every destination (out) or the way back.
void transport(std::vector<Rank>& ranks, const std::vector<DispatchLayout>& lay, size_t c,
               bool out) {
  const size_t P = ranks.size();
  for (size_t s = 0; s < P; ++s)
    for (size_t q = 0; q < P; ++q) {
      const DispatchChunk& ks = lay[s].chunks()[c];
      const DispatchChunk& kq = lay[q].chunks()[c];
      if (out) {
        ASSERT_EQ(ks.send_counts[q], kq.recv_counts[s]) << "chunk " << c << " " << s << "->" << q;
        std::copy_n(ranks[s].send.begin() + ks.send_displs[q], ks.send_counts[q],
                    ranks[q].recv.begin() + kq.recv_displs[s]);
      } else {
        // Destination q returns to source s what it received from s.
        std::copy_n(ranks[q].back.begin() + kq.recv_displs[s], kq.recv_counts[s],
                    ranks[s].dst.begin() + ks.send_displs[q]);
      }
    }
}

void check_layout(int P, int64_t El, int chunks, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "P " << P << " El " << El << " chunks " << chunks);
  Rng rng(seed);
  const int64_t E = P * El;
  std::vector<Rank> ranks(static_cast<size_t>(P));
  int64_t max_rows = 0;
  for (int s = 0; s < P; ++s) {
    Rank& r = ranks[static_cast<size_t>(s)];
    r.offsets.assign(static_cast<size_t>(E + 1), 0);
    for (int64_t e = 0; e < E; ++e) {
      // A quarter of the experts get no rows from this source.
      const int64_t n = rng.below(4) == 0 ? 0 : static_cast<int64_t>(rng.below(7));
      r.offsets[static_cast<size_t>(e + 1)] =
          r.offsets[static_cast<size_t>(e)] + static_cast<int32_t>(n);
      for (int64_t i = 0; i < n; ++i) r.expert.push_back(e);
    }
    const int64_t N = r.offsets.back();
    max_rows = std::max(max_rows, N);
    for (int64_t i = 0; i < N; ++i) {
      r.send.push_back(static_cast<float>(s * 1000 + i));
      r.send.push_back(-static_cast<float>(s * 1000 + i));
    }
    r.dst.assign(static_cast<size_t>(N * kWidth), 0.f);
  }

  std::vector<DispatchLayout> lay;
  for (int q = 0; q < P; ++q) {
    lay.emplace_back(P, El);
    // The count exchange by hand: what source s sends to q's local experts.
    std::vector<int64_t> recv_counts;
    for (int s = 0; s < P; ++s) {
      const auto& off = ranks[static_cast<size_t>(s)].offsets;
      std::vector<int64_t> sent;
      lay.back().send_counts(off.data(), sent);
      for (int64_t j = 0; j < El; ++j) {
        const int64_t e = q * El + j;
        ASSERT_EQ(sent[static_cast<size_t>(e)],
                  off[static_cast<size_t>(e + 1)] - off[static_cast<size_t>(e)]);
        recv_counts.push_back(sent[static_cast<size_t>(e)]);
      }
    }
    lay.back().plan(ranks[static_cast<size_t>(q)].offsets.data(), recv_counts, chunks, kWidth);
    const int64_t R = lay.back().recv_rows();
    EXPECT_LE(R, DispatchLayout::recv_capacity(P, max_rows));
    ranks[static_cast<size_t>(q)].recv.assign(static_cast<size_t>(R * kWidth), -1.f);
    ranks[static_cast<size_t>(q)].back.assign(static_cast<size_t>(R * kWidth), 0.f);
  }
  for (size_t c = 0; c < static_cast<size_t>(chunks); ++c) transport(ranks, lay, c, true);

  for (int q = 0; q < P; ++q) {
    Rank& rq = ranks[static_cast<size_t>(q)];
    // The reference: every (source, row) whose expert is local to q.
    std::set<std::pair<int, int64_t>> want, got;
    for (int s = 0; s < P; ++s) {
      const Rank& rs = ranks[static_cast<size_t>(s)];
      for (size_t i = 0; i < rs.expert.size(); ++i)
        if (rs.expert[i] / El == q) want.emplace(s, static_cast<int64_t>(i));
    }
    for (size_t c = 0; c < static_cast<size_t>(chunks); ++c) {
      const DispatchChunk& k = lay[static_cast<size_t>(q)].chunks()[c];
      ASSERT_EQ(k.offsets.size(), static_cast<size_t>(El + 1));
      ASSERT_EQ(k.offsets.back(), k.rows);
      // The inverse undoes the sort: the way back gathers every row from its sorted position.
      ASSERT_EQ(k.inverse.size(), static_cast<size_t>(k.rows));
      for (int64_t i = 0; i < k.rows; ++i)
        ASSERT_EQ(k.inverse[static_cast<size_t>(k.order[static_cast<size_t>(i)])], i)
            << "chunk " << c << " sorted position " << i;
      std::pair<int64_t, int64_t> prev{-1, -1};  // (local expert, arrival key) of the last row
      for (int64_t i = 0; i < k.rows; ++i) {
        const int64_t row = k.recv_begin + k.order[static_cast<size_t>(i)];
        const auto id = static_cast<int64_t>(rq.recv[static_cast<size_t>(row * kWidth)]);
        ASSERT_EQ(rq.recv[static_cast<size_t>(row * kWidth + 1)], -static_cast<float>(id));
        const int s = static_cast<int>(id / 1000);
        const int64_t src_row = id % 1000;
        const int64_t j =
            ranks[static_cast<size_t>(s)].expert[static_cast<size_t>(src_row)] - q * El;
        ASSERT_TRUE(j >= 0 && j < El) << "row " << id << " reached rank " << q;
        // Sorted position i lies in expert j's group of the chunk's offsets.
        ASSERT_GE(i, k.offsets[static_cast<size_t>(j)]);
        ASSERT_LT(i, k.offsets[static_cast<size_t>(j + 1)]);
        const std::pair<int64_t, int64_t> key{j, id};
        ASSERT_LT(prev, key) << "chunk " << c << " not grouped by expert in arrival order";
        prev = key;
        ASSERT_TRUE(got.emplace(s, src_row).second) << "row " << id << " received twice";
      }
      // The expert computes: the result names the row and the rank that computed it.
      for (int64_t i = 0; i < k.rows; ++i) {
        const int64_t row = k.recv_begin + k.order[static_cast<size_t>(i)];
        rq.back[static_cast<size_t>(row * kWidth)] =
            rq.recv[static_cast<size_t>(row * kWidth)] + 0.25f * static_cast<float>(q);
        rq.back[static_cast<size_t>(row * kWidth + 1)] = static_cast<float>(q);
      }
    }
    EXPECT_EQ(got, want) << "rank " << q << " received other rows than its experts'";
  }

  // Pieces: each source's segment to each destination split evenly over the chunks.
  for (int s = 0; s < P; ++s)
    for (int q = 0; q < P; ++q) {
      int64_t lo = INT64_MAX, hi = 0;
      for (const DispatchChunk& k : lay[static_cast<size_t>(s)].chunks()) {
        lo = std::min(lo, k.send_counts[static_cast<size_t>(q)]);
        hi = std::max(hi, k.send_counts[static_cast<size_t>(q)]);
      }
      EXPECT_LE(hi - lo, kWidth) << "pieces " << s << "->" << q << " differ by more than a row";
    }

  for (size_t c = 0; c < static_cast<size_t>(chunks); ++c) transport(ranks, lay, c, false);
  for (int s = 0; s < P; ++s) {
    const Rank& r = ranks[static_cast<size_t>(s)];
    for (size_t i = 0; i < r.expert.size(); ++i) {
      const int64_t owner = r.expert[i] / El;
      EXPECT_EQ(r.dst[i * kWidth], static_cast<float>(s * 1000) + static_cast<float>(i) +
                                       0.25f * static_cast<float>(owner))
          << "rank " << s << " row " << i;
      EXPECT_EQ(r.dst[i * kWidth + 1], static_cast<float>(owner)) << "rank " << s << " row " << i;
    }
  }
}

TEST(DispatchLayout, ExchangeMatchesReferenceForRanksExpertsAndChunks) {
  for (int P : {1, 2, 3, 4})
    for (int64_t El : {1, 3})
      for (int chunks : {1, 2, 5, 40}) check_layout(P, El, chunks, test::test_seed());
}

TEST(DispatchLayout, RejectsCountsOfTheWrongSize) {
  DispatchLayout lay(2, 3);
  const std::vector<int32_t> off(7, 0);
  EXPECT_THROW(lay.plan(off.data(), std::vector<int64_t>(5, 0), 1, 4), ShapeError);
  EXPECT_THROW(lay.plan(off.data(), std::vector<int64_t>(6, 0), 0, 4), ConfigError);
  EXPECT_THROW(DispatchLayout(0, 3), ConfigError);
}

TEST(DispatchBuffers, ReservedOnceAndSharedByLayers) {
  DispatchBuffers b;
  b.reserve(10, 4);
  b.reserve(8, 5);  // 40 elements fit the first reserve
  EXPECT_EQ(b.allocations(), 1);
  EXPECT_EQ(b.bytes(), 4 * 40 * 4);
  const Tensor recv = b.get(DispatchBuffers::kRecv, 10, 4),
               back = b.get(DispatchBuffers::kBack, 10, 4);
  EXPECT_EQ(static_cast<float*>(back.raw()) - static_cast<float*>(recv.raw()), 40);
  EXPECT_THROW(b.get(DispatchBuffers::kRecv, 11, 4), InternalError);
  b.reserve(11, 4);
  EXPECT_EQ(b.allocations(), 2);
}

// Layers sharing one set of buffers over several steps on one rank: one allocation, at the
// first forward (the worst case of a world of one is its own rows).
TEST(DispatchBuffers, ExpertParallelReservesAtTheFirstForwardOnly) {
  Context ctx(ContextOptions{.threads = 1});
  Rng rng(test::test_seed());
  const int64_t E = 3, l = 4, F = 2, N = 9;
  auto comm = make_local_comm();
  auto buffers = std::make_shared<DispatchBuffers>();
  ExpertParallel a(*comm, E, {.chunks = 2, .buffers = buffers}),
      b(*comm, E, {.chunks = 3, .buffers = buffers});
  ops::GroupedFfnParams p{.rows = N, .experts = E, .in = l, .ffn = F};
  auto randn = [&](Shape s) {
    Tensor t = Tensor::empty(s);
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = rng.normal();
    return t;
  };
  ops::GroupedFfnWeights w{.gate_up = randn({E, 2 * F, l}), .down = randn({E, l, F})};
  ops::GroupedFfnWeights g{.gate_up = Tensor::zeros({E, 2 * F, l}),
                           .down = Tensor::zeros({E, l, F})};
  Tensor off = Tensor::empty({E + 1}, DType::I32);
  for (int step = 0; step < 3; ++step) {
    off.i32()[0] = 0;
    for (int64_t e = 0; e < E; ++e)
      off.i32()[e + 1] =
          e + 1 == E ? static_cast<int32_t>(N) : off.i32()[e] + static_cast<int32_t>(rng.below(4));
    Tensor x = randn({N, l}), y = Tensor::empty({N, l}), dx = Tensor::empty({N, l});
    for (ExpertParallel* ep : {&a, &b}) {
      const std::unique_ptr<ExpertState> st = ep->make_state();
      ep->forward(ctx, p, x, off, w, y, *st);
      ep->backward(ctx, p, w, y, dx, g, *st);
    }
  }
  EXPECT_EQ(buffers->allocations(), 1);
  EXPECT_EQ(buffers->bytes(), 4 * N * l * static_cast<int64_t>(sizeof(float)));
}

}  // namespace
}  // namespace mt::par
