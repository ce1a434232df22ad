// Comm's element types and Tensor forms under mpirun (tests/CMakeLists.txt), and on the local
// Comm of one process: bf16 and f32 tensors through every collective against expectations each
// rank computes on its own. Inputs are multiples of powers of two small enough that every sum is
// exact in bf16 (so any summation order must match exactly, as nccl-tests' `verifiable` data
// does); one bf16 sum of random values is then checked against the fp32 sum within the W - 1
// roundings the combine tree may add. Exit status 0 only when every rank agrees.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "mpi_check.h"
#include "parallel/comm.h"

namespace {

using mt::DType;
using mt::Tensor;
using mt::par::Comm;

// Element i of rank r: (r + 1) * 2^-(i % 5) * (1 + i % 3), exact in bf16, and so are the sums
// over 4 ranks (at most 5 significant bits).
float value(int r, int64_t i) {
  return static_cast<float>(r + 1) * std::ldexp(1.f, -static_cast<int>(i % 5)) *
         static_cast<float>(1 + i % 3);
}

Tensor filled(int r, int64_t n, DType d, int64_t first = 0) {
  Tensor t = Tensor::empty({n}, d);
  for (int64_t i = 0; i < n; ++i) {
    const float v = value(r, first + i);
    if (d == DType::BF16)
      t.bf16()[i] = mt::f32_to_bf16(v);
    else
      t.f32()[i] = v;
  }
  return t;
}

float at(const Tensor& t, int64_t i) {
  return t.dtype() == DType::BF16 ? mt::bf16_to_f32(t.bf16()[i]) : t.f32()[i];
}

// seed: the run's (test::world_seed), of the random bf16 sum.
int check(Comm& c, const char* where, uint64_t seed) {
  const int W = c.size(), me = c.rank();
  int bad = 0;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) {
      std::printf("%s rank %d: %s\n", where, me, what.c_str());
      ++bad;
    }
  };
  for (const DType d : {DType::BF16, DType::F32}) {
    const std::string dn = d == DType::BF16 ? "bf16" : "f32";
    const int64_t n = 37;
    // all_reduce: the sum over ranks of value(r, i).
    Tensor a = filled(me, n, d);
    c.iall_reduce(a).wait();
    for (int64_t i = 0; i < n; ++i) {
      float want = 0;
      for (int r = 0; r < W; ++r) want += value(r, i);
      expect(at(a, i) == want, dn + " all_reduce element " + std::to_string(i));
    }
    // all_gather: rank r's block is value(r, .).
    Tensor g = Tensor::empty({W * n}, d);
    c.iall_gather(filled(me, n, d), g).wait();
    for (int r = 0; r < W; ++r)
      for (int64_t i = 0; i < n; ++i)
        expect(at(g, r * n + i) == value(r, i), dn + " all_gather block " + std::to_string(r));
    // reduce_scatter: my slice of the sum.
    Tensor rs = Tensor::empty({n}, d);
    c.ireduce_scatter(filled(me, W * n, d), rs).wait();
    for (int64_t i = 0; i < n; ++i) {
      float want = 0;
      for (int r = 0; r < W; ++r) want += value(r, me * n + i);
      expect(at(rs, i) == want, dn + " reduce_scatter element " + std::to_string(i));
    }
    // all_to_all_v: rank s sends s + 1 + p elements to peer p, from offset 3 p.
    std::vector<int64_t> sc(W), sd(W), rc(W), rd(W);
    for (int p = 0; p < W; ++p) {
      sc[p] = me + 1 + p;
      sd[p] = 3 * p;
      rc[p] = p + 1 + me;
      rd[p] = p == 0 ? 0 : rd[p - 1] + rc[p - 1];
    }
    const Tensor src = filled(me, 3 * W + 2 * W, d);
    Tensor dst = Tensor::empty({rd[W - 1] + rc[W - 1]}, d);
    c.iall_to_all_v(src, sc, sd, dst, rc, rd).wait();
    for (int p = 0; p < W; ++p)
      for (int64_t k = 0; k < rc[p]; ++k)
        expect(at(dst, rd[p] + k) == value(p, 3 * me + k),
               dn + " all_to_all_v from peer " + std::to_string(p));
    // broadcast from the last rank.
    Tensor b = filled(me, n, d);
    c.ibroadcast(b, W - 1).wait();
    for (int64_t i = 0; i < n; ++i) expect(at(b, i) == value(W - 1, i), dn + " broadcast");
  }
  // A bf16 sum of values that do not add exactly: within W - 1 roundings of the fp32 sum.
  {
    const int64_t n = 257;
    mt::Rng rng(seed);
    std::vector<float> all(static_cast<size_t>(W * n));
    for (float& v : all) v = static_cast<float>(rng.normal());
    Tensor t = Tensor::empty({n}, DType::BF16);
    for (int64_t i = 0; i < n; ++i) t.bf16()[i] = mt::f32_to_bf16(all[me * n + i]);
    c.all_reduce(t.raw(), n, mt::par::Elem::BF16);
    for (int64_t i = 0; i < n; ++i) {
      double exact = 0, mag = 0;
      for (int r = 0; r < W; ++r) {
        const double x = mt::bf16_to_f32(mt::f32_to_bf16(all[r * n + i]));
        exact += x;
        mag += std::abs(x);
      }
      // Each combine rounds to 8 significant bits: at most 2^-8 of the partial sum's magnitude.
      const double tol = (W - 1) * std::ldexp(mag, -8);
      expect(std::abs(mt::bf16_to_f32(t.bf16()[i]) - exact) <= tol,
             "bf16 rounded sum element " + std::to_string(i));
    }
  }
  // A strided or mis-sized tensor is refused, naming the collective.
  {
    Tensor small = Tensor::empty({3}, DType::BF16);
    bool threw = false;
    try {
      Tensor big = Tensor::empty({2}, DType::BF16);
      c.iall_gather(big, small).wait();
    } catch (const mt::ShapeError&) {
      threw = true;
    }
    expect(threw || W * 2 == 3, "all_gather into a tensor of the wrong size did not throw");
  }
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  mt::par::MpiRuntime mpi(&argc, &argv);
  auto world = mpi.world();
  const uint64_t seed = mt::test::world_seed(*world);
  int bad = check(*world, "mpi", seed);
  if (world->rank() == 0) bad += check(*mt::par::make_local_comm(), "local", seed);
  const int64_t total = world->all_reduce_sum(static_cast<int64_t>(bad));
  if (world->rank() == 0)
    std::printf("%s: %lld mismatches over %d ranks\n", total ? "FAIL" : "PASS",
                static_cast<long long>(total), world->size());
  if (total && world->rank() == 0) mt::test::print_rerun(seed);
  return total ? 1 : 0;
}
