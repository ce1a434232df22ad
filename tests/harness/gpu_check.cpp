#include "harness/gpu_check.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "harness/op_check.h"
#include "harness/seed.h"
#include "harness/tolerance.h"

namespace mt::test {

namespace {

Tensor host_f32(Context& ctx, const Tensor& t) {
  ctx.synchronize();
  Tensor h = Tensor::empty(t.shape());
  h.copy_from(t);
  return h;
}

}  // namespace

Tensor round_bf16(const Tensor& t) {
  if (t.dtype() != DType::F32) return t;
  Tensor b = Tensor::empty(t.shape(), DType::BF16);
  b.copy_from(t);
  Tensor r = Tensor::empty(t.shape());
  r.copy_from(b);
  return r;
}

uint64_t fresh_seed() {
  return test_seed();
}

Tensor randn(Rng& rng, Shape s, double scale) {
  Tensor t = Tensor::empty(std::move(s));
  fill_normal(rng, t, scale);
  return t;
}

Tensor out(Context& ctx, const Shape& s, DType dt) {
  Tensor h = Tensor::empty(s);
  for (int64_t i = 0; i < h.numel(); ++i) h.f32()[i] = std::numeric_limits<float>::quiet_NaN();
  Tensor d = Tensor::empty(s, dt, ctx.device());
  d.copy_from(h);
  return d;
}

void run_case(const char* name, const std::vector<In>& ins, const std::vector<std::string>& names,
              const Run& run, uint64_t seed, int64_t reduction_terms, const Run& bf16_emulation) {
  SCOPED_TRACE(cat(name, " seed=", seed, " (rerun: ", seed_note(), ")"));
  Context cpu(ContextOptions{.threads = 2, .seed = seed});
  Context gpu(ContextOptions{.device = Device::CUDA, .seed = seed});
  std::vector<Tensor> hin;
  for (const In& i : ins) hin.push_back(i.host);
  const std::vector<Tensor> want = run(cpu, hin, false);
  ASSERT_EQ(want.size(), names.size());

  for (DType pass : {DType::F32, DType::BF16}) {
    std::vector<Tensor> din, emul_in;
    for (const In& i : ins) {
      const bool low = pass == DType::BF16 && i.lowp && i.host.dtype() == DType::F32;
      Tensor d = Tensor::empty(i.host.shape(), low ? DType::BF16 : i.host.dtype(), Device::CUDA);
      d.copy_from(i.host);
      din.push_back(d);
      emul_in.push_back(low ? round_bf16(i.host) : i.host);
    }
    const std::vector<Tensor> got = run(gpu, din, true);
    ASSERT_EQ(got.size(), want.size());
    std::vector<Tensor> emul;
    if (pass == DType::BF16) emul = (bf16_emulation ? bf16_emulation : run)(cpu, emul_in, false);
    for (size_t j = 0; j < got.size(); ++j) {
      const DVec g = to_dvec(host_f32(gpu, got[j])), w = to_dvec(want[j]);
      size_t nonfinite = 0;
      for (double v : g) nonfinite += !std::isfinite(v);
      EXPECT_EQ(nonfinite, 0u) << names[j] << " (" << dtype_name(pass)
                               << " pass) has non-finite entries: unwritten?";
      const double err = rel_err(g, w);
      double bound = f32_bound(reduction_terms);
      if (pass == DType::BF16) {
        const Tensor e = got[j].dtype() == DType::BF16 ? round_bf16(emul[j]) : emul[j];
        bound = kBf16Multiple * rel_err(to_dvec(e), w) + kBf16Floor;
      }
      EXPECT_LE(err, bound) << names[j] << " (" << dtype_name(pass) << " pass)";
      std::printf("  %-28s %-5s %-6s rel err %.3g (bound %.3g)\n", name, names[j].c_str(),
                  std::string(dtype_name(pass)).c_str(), err, bound);
    }
  }
}

std::vector<uint8_t> host_bytes(const Tensor& t) {
  const Tensor h = t.to(Device::CPU);
  const auto* p = static_cast<const uint8_t*>(h.raw());
  return {p, p + h.bytes()};
}

Tensor like(Context& ctx, const Tensor& t) {
  Tensor c = Tensor::empty(t.shape(), t.dtype(), ctx.device());
  c.copy_from(t);
  return c;
}

}  // namespace mt::test
