#include "harness/op_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "core/device.h"
#include "harness/seed.h"
#include "harness/tolerance.h"

namespace mt::test {

namespace {

constexpr uint8_t kGuardByte = 0xA5;
constexpr size_t kGuardBytes = 256;

double norm(const DVec& a) {
  double s = 0;
  for (double x : a) s += x * x;
  return std::sqrt(s);
}

double dot(const DVec& a, const DVec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// The scalar whose gradient backward computes: sum over outputs of <reference output, dout>.
double ref_loss(const OpCase& op, const std::vector<DVec>& in, const std::vector<DVec>& dout) {
  std::vector<DVec> out = op.reference(in);
  double l = 0;
  for (size_t j = 0; j < out.size(); ++j)
    if (!dout[j].empty()) l += dot(out[j], dout[j]);
  return l;
}

// How far each gradient moves when the differentiable f32 inputs move by about one ulp: the
// backward rerun on inputs scaled by (1 + 2^-23 N(0,1)), minus the first backward's gradients.
// `rng` is check_op's second one, so that the draws of the checks that follow stay the seed's.
std::vector<DVec> ulp_gradient_shift(OpCase& op, Context& ctx, GuardedAlloc& alloc, Rng& rng,
                                     const std::vector<InputSpec>& specs,
                                     const std::vector<Tensor>& in, const std::vector<Tensor>& dout,
                                     const std::vector<Tensor>& grads,
                                     const std::vector<DVec>& prefill) {
  std::vector<Tensor> moved;
  for (size_t i = 0; i < in.size(); ++i) {
    if (!specs[i].differentiable || in[i].dtype() != DType::F32 || specs[i].host) {
      moved.push_back(in[i]);
      continue;
    }
    Tensor t = alloc(in[i].shape());
    for (int64_t e = 0; e < t.numel(); ++e)
      t.f32()[e] = in[i].f32()[e] * static_cast<float>(1.0 + std::ldexp(rng.normal(), -23));
    moved.push_back(t);
  }
  std::vector<Tensor> grads2(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (!specs[i].differentiable) continue;
    grads2[i] = alloc(in[i].shape());
    if (specs[i].accumulate) grads2[i].zero_();
  }
  op.forward(ctx, alloc, moved);
  op.backward(ctx, alloc, moved, dout, grads2);
  std::vector<DVec> shift(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (!specs[i].differentiable) continue;
    shift[i] = to_dvec(grads2[i]);
    DVec g = to_dvec(grads[i]);
    for (size_t e = 0; e < g.size(); ++e)
      shift[i][e] -= g[e] - (specs[i].accumulate ? prefill[i][e] : 0.0);
  }
  return shift;
}

// Step 5 of check_op: the same case on the GPU, compared with the CPU's results (f32 tensors).
void device_pass(OpCase& op, uint64_t seed, const std::vector<InputSpec>& specs,
                 const std::vector<Tensor>& in, const std::vector<DVec>& in_d,
                 const std::vector<OutputSpec>& ospecs, const std::vector<DVec>& out_cpu,
                 const std::vector<DVec>& ref, const std::vector<Tensor>& dout,
                 const std::vector<DVec>& prefill, const std::vector<DVec>& grad_cpu) {
  SCOPED_TRACE("device pass (cuda, f32 tensors)");
  Context ctx(ContextOptions{.device = Device::CUDA, .seed = seed});
  GuardedAlloc alloc(Device::CUDA);
  std::vector<Tensor> din;
  for (size_t i = 0; i < in.size(); ++i) {
    if (specs[i].host) {
      din.push_back(in[i]);
      continue;
    }
    Tensor d = alloc(in[i].shape(), in[i].dtype());
    d.copy_from(in[i]);
    din.push_back(d);
  }
  std::vector<Tensor> out;
  try {
    out = op.forward(ctx, alloc, din);
    ctx.synchronize();
  } catch (const Error& e) {
    ADD_FAILURE() << "forward on the GPU failed: " << e.what();
    return;
  }
  ASSERT_EQ(out.size(), ospecs.size());
  for (size_t j = 0; j < out.size(); ++j) {
    const DVec got = to_dvec(out[j]);
    if (out[j].dtype() == DType::F32 || out[j].dtype() == DType::BF16) {
      EXPECT_LE(rel_err(got, out_cpu[j]), kF32Rel) << "GPU forward output " << ospecs[j].name;
    } else {
      size_t bad = 0;
      for (size_t i = 0; i < got.size(); ++i) bad += got[i] != ref[j][i];
      EXPECT_EQ(bad, 0u) << "GPU integer output " << ospecs[j].name << " differs in " << bad
                         << " places";
    }
  }
  std::vector<Tensor> ddout(dout.size());
  for (size_t j = 0; j < dout.size(); ++j) {
    if (!dout[j].defined()) continue;
    ddout[j] = alloc(dout[j].shape(), dout[j].dtype());
    ddout[j].copy_from(dout[j]);
  }
  std::vector<Tensor> grads(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (!specs[i].differentiable) continue;
    grads[i] = alloc(in[i].shape());
    if (specs[i].accumulate) {
      Tensor h = Tensor::empty(in[i].shape());
      for (size_t e = 0; e < prefill[i].size(); ++e) h.f32()[e] = static_cast<float>(prefill[i][e]);
      grads[i].copy_from(h);
    }
  }
  try {
    op.backward(ctx, alloc, din, ddout, grads);
    ctx.synchronize();
  } catch (const Error& e) {
    ADD_FAILURE() << "backward on the GPU failed: " << e.what();
    return;
  }
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_LE(rel_err(to_dvec(din[i]), in_d[i]), 0.0)
        << "input " << specs[i].name << " was modified on the GPU";
    if (!specs[i].differentiable) continue;
    DVec g = to_dvec(grads[i]);
    if (specs[i].accumulate)
      for (size_t e = 0; e < g.size(); ++e) g[e] -= prefill[i][e];
    EXPECT_LE(rel_err(g, grad_cpu[i]), kF32Rel) << "GPU gradient of " << specs[i].name;
  }
  EXPECT_EQ(alloc.check(), "") << "out-of-bounds write on the GPU";
}

}  // namespace

GuardedAlloc::~GuardedAlloc() {
  for (auto& b : blocks_)
    if (b->device_mem) device_free(b->device_mem, device_);
}

Tensor GuardedAlloc::operator()(const Shape& shape, DType dtype) {
  auto b = std::make_unique<Block>();
  b->body_bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  b->guard_bytes = kGuardBytes;
  b->shape = shape;
  b->mem.assign(b->body_bytes + 2 * kGuardBytes + 64, kGuardByte);
  // Align the body to 64 bytes inside the block (device blocks start 256-byte aligned).
  uintptr_t base = reinterpret_cast<uintptr_t>(b->mem.data()) + kGuardBytes;
  size_t pad = device_ == Device::CPU ? (64 - base % 64) % 64 : 0;
  b->guard_bytes += pad;
  uint8_t* body = b->mem.data() + b->guard_bytes;
  if (dtype == DType::F32) {
    float nan = std::numeric_limits<float>::quiet_NaN();
    for (size_t i = 0; i < b->body_bytes / 4; ++i) std::memcpy(body + 4 * i, &nan, 4);
  } else {
    std::memset(body, 0xFF, b->body_bytes);
  }
  if (device_ != Device::CPU) {
    b->device_mem = device_alloc(b->mem.size(), device_);
    copy_bytes(b->device_mem, device_, b->mem.data(), Device::CPU, b->mem.size());
    body = static_cast<uint8_t*>(b->device_mem) + b->guard_bytes;
  }
  Tensor t(body, shape, dtype, device_);
  blocks_.push_back(std::move(b));
  return t;
}

std::string GuardedAlloc::check() const {
  for (const auto& b : blocks_) {
    std::vector<uint8_t> copy;
    const uint8_t* m = b->mem.data();
    if (b->device_mem) {
      copy.resize(b->mem.size());
      copy_bytes(copy.data(), Device::CPU, b->device_mem, device_, copy.size());
      m = copy.data();
    }
    for (size_t i = 0; i < b->guard_bytes; ++i)
      if (m[i] != kGuardByte)
        return cat("write before tensor ", b->shape, " (byte -", b->guard_bytes - i, ")");
    size_t end = b->guard_bytes + b->body_bytes;
    for (size_t i = end; i < b->mem.size(); ++i)
      if (m[i] != kGuardByte) return cat("write after tensor ", b->shape, " (byte +", i - end, ")");
  }
  return "";
}

Tensor on_device(Context& ctx, const Tensor& t) {
  return t.device() == ctx.device() ? t : t.to(ctx.device());
}

bool device_pass_enabled() {
  const char* env = std::getenv("MOETRAIN_TEST_DEVICE");
  if (env && std::string(env) == "cpu") return false;
  return cuda_available();
}

DVec to_dvec(const Tensor& t_any) {
  const Tensor t = t_any.device() == Device::CPU ? t_any : t_any.to(Device::CPU);
  DVec v(static_cast<size_t>(t.numel()));
  switch (t.dtype()) {
    case DType::F32:
      for (size_t i = 0; i < v.size(); ++i) v[i] = t.f32()[i];
      break;
    case DType::I32:
      for (size_t i = 0; i < v.size(); ++i) v[i] = t.i32()[i];
      break;
    case DType::I64:
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(t.i64()[i]);
      break;
    case DType::BF16:
      for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_to_f32(t.bf16()[i]);
      break;
    case DType::F64:
      for (size_t i = 0; i < v.size(); ++i) v[i] = t.f64()[i];
      break;
  }
  return v;
}

void fill_normal(Rng& rng, Tensor& t, double scale) {
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(scale * rng.normal());
}

double rel_err(const DVec& a, const DVec& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  DVec d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return norm(d) / std::max(norm(b), 1e-30);
}

void check_op(OpCase& op, const CheckOptions& opt) {
  uint64_t seed = opt.seed ? opt.seed : test_seed();
  SCOPED_TRACE(cat(op.name(), " seed=", seed, opt.seed ? "" : " (rerun: " + seed_note() + ")"));
  Rng rng(seed);
  Context ctx(ContextOptions{.seed = seed});
  GuardedAlloc alloc;

  // 1. Inputs (redrawn while the case rejects them).
  std::vector<InputSpec> specs = op.inputs();
  std::vector<Tensor> in;
  std::vector<DVec> in_d;
  // The cap only stops a case whose accept() can never hold; cases that reject most draws (near
  // ties among many scores) need many tries, so it is generous.
  int draw = 0;
  for (;; ++draw) {
    ASSERT_LT(draw, 2000) << "no acceptable input draw in 2000 tries";
    in.clear();
    in_d.clear();
    for (const InputSpec& s : specs) {
      Tensor t = alloc(s.shape, s.dtype);
      if (s.init) {
        s.init(rng, t);
      } else {
        ASSERT_EQ(s.dtype, DType::F32) << s.name << ": non-f32 input needs an init function";
        fill_normal(rng, t, s.scale);
      }
      in.push_back(t);
    }
    for (const Tensor& t : in) in_d.push_back(to_dvec(t));
    if (op.accept(in_d)) break;
  }
  const std::string note = op.accept_note();
  SCOPED_TRACE(note.empty() && draw == 0
                   ? std::string("first draw")
                   : cat("draw ", draw + 1, " accepted", note.empty() ? "" : ": ", note));

  // 2. Forward vs reference.
  std::vector<OutputSpec> ospecs = op.outputs();
  std::vector<Tensor> out = op.forward(ctx, alloc, in);
  ASSERT_EQ(out.size(), ospecs.size()) << "forward returned a wrong number of outputs";
  std::vector<DVec> out_cpu;
  for (const Tensor& t : out) out_cpu.push_back(to_dvec(t));
  std::vector<DVec> ref = op.reference(in_d);
  ASSERT_EQ(ref.size(), ospecs.size()) << "reference returned a wrong number of outputs";
  for (size_t j = 0; j < out.size(); ++j) {
    DVec got = to_dvec(out[j]);
    ASSERT_EQ(got.size(), ref[j].size()) << "output " << ospecs[j].name << " size";
    if (out[j].dtype() == DType::F32) {
      EXPECT_LE(rel_err(got, ref[j]), opt.fwd_rtol) << "forward output " << ospecs[j].name;
    } else {
      size_t bad = 0;
      for (size_t i = 0; i < got.size(); ++i) bad += got[i] != ref[j][i];
      EXPECT_EQ(bad, 0u) << "integer output " << ospecs[j].name << " differs in " << bad
                         << " places";
    }
  }

  // 3. Backward vs finite differences of the reference.
  std::vector<Tensor> dout(out.size());
  std::vector<DVec> dout_d(out.size());
  for (size_t j = 0; j < out.size(); ++j) {
    if (!ospecs[j].differentiable) continue;
    dout[j] = alloc(out[j].shape());
    fill_normal(rng, dout[j]);
    dout_d[j] = to_dvec(dout[j]);
  }
  std::vector<Tensor> grads(in.size());
  std::vector<DVec> prefill(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (!specs[i].differentiable) continue;
    grads[i] = alloc(in[i].shape());
    if (specs[i].accumulate) {
      // Small enough that rounding of (prefill + grad) stays far below the tolerance for tiny
      // gradients, large enough that an op overwriting instead of adding is caught.
      fill_normal(rng, grads[i], 1e-2);
      prefill[i] = to_dvec(grads[i]);
    }
  }
  std::vector<Tensor> dout_copy;
  for (const Tensor& d : dout) dout_copy.push_back(d.defined() && d.numel() ? d.clone() : d);
  op.backward(ctx, alloc, in, dout, grads);
  // One sample of the rounding noise can happen to be small where it is not (seen on A_log of
  // a 2-element gradient), so the floor takes the largest of three.
  constexpr int kShiftSamples = 3;
  std::vector<std::vector<DVec>> shifts;
  Rng shift_rng(seed ^ 0x9e3779b97f4a7c15ull);
  for (int k = 0; k < kShiftSamples && opt.rounding_floor > 0; ++k)
    shifts.push_back(
        ulp_gradient_shift(op, ctx, alloc, shift_rng, specs, in, dout, grads, prefill));
  // rounding_floor times the largest shift of <grad, u> (u empty: of element e).
  auto rounding_floor = [&](size_t i, const DVec& u, size_t e) {
    double m = 0;
    for (const auto& sh : shifts) m = std::max(m, std::abs(u.empty() ? sh[i][e] : dot(sh[i], u)));
    return opt.rounding_floor * m;
  };

  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_LE(rel_err(to_dvec(in[i]), in_d[i]), 0.0)
        << "input " << specs[i].name << " was modified";
    if (!specs[i].differentiable) continue;
    SCOPED_TRACE("gradient of " + specs[i].name);
    DVec g = to_dvec(grads[i]);
    if (specs[i].accumulate)
      for (size_t e = 0; e < g.size(); ++e) g[e] -= prefill[i][e];
    size_t nonfinite = 0;
    for (double x : g) nonfinite += !std::isfinite(x);
    ASSERT_EQ(nonfinite, 0u) << "gradient has non-finite entries (unwritten?)";
    double gnorm = norm(g);
    double rms = gnorm / std::sqrt(std::max<size_t>(g.size(), 1));
    double scale_x = std::max(1e-3, norm(in_d[i]) / std::sqrt(std::max<size_t>(g.size(), 1)));
    double h = opt.fd_step * scale_x;

    for (int r = 0; r < opt.directions && !g.empty(); ++r) {
      DVec u(g.size());
      for (double& x : u) x = rng.normal();
      double un = norm(u);
      for (double& x : u) x /= un;
      std::vector<DVec> xp = in_d, xm = in_d;
      for (size_t e = 0; e < u.size(); ++e) {
        xp[i][e] += h * u[e];
        xm[i][e] -= h * u[e];
      }
      double fd = (ref_loss(op, xp, dout_d) - ref_loss(op, xm, dout_d)) / (2 * h);
      double an = dot(g, u);
      double floor = rounding_floor(i, u, 0);
      EXPECT_LE(std::abs(fd - an), opt.grad_rtol * std::max(gnorm, 1e-8) + floor)
          << "direction " << r << ": finite difference " << fd << " vs backward " << an
          << " (|grad| " << gnorm << ")";
    }
    for (int r = 0; r < opt.elements && !g.empty(); ++r) {
      size_t e = static_cast<size_t>(rng.below(static_cast<int64_t>(g.size())));
      std::vector<DVec> xp = in_d, xm = in_d;
      xp[i][e] += h;
      xm[i][e] -= h;
      double fd = (ref_loss(op, xp, dout_d) - ref_loss(op, xm, dout_d)) / (2 * h);
      double floor = rounding_floor(i, {}, e);
      EXPECT_LE(std::abs(fd - g[e]), opt.grad_rtol * (std::abs(fd) + rms + 1e-8) + floor)
          << "element " << e << ": finite difference " << fd << " vs backward " << g[e];
    }
  }
  for (size_t j = 0; j < dout.size(); ++j) {
    if (!dout[j].defined() || dout[j].numel() == 0) continue;
    EXPECT_LE(rel_err(to_dvec(dout[j]), to_dvec(dout_copy[j])), 0.0)
        << "upstream gradient of " << ospecs[j].name << " was modified";
  }
  std::string guard = alloc.check();
  EXPECT_EQ(guard, "") << "out-of-bounds write";

  if (!device_pass_enabled()) return;
  std::vector<DVec> grad_cpu(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (!specs[i].differentiable) continue;
    grad_cpu[i] = to_dvec(grads[i]);
    if (specs[i].accumulate)
      for (size_t e = 0; e < grad_cpu[i].size(); ++e) grad_cpu[i][e] -= prefill[i][e];
  }
  device_pass(op, seed, specs, in, in_d, ospecs, out_cpu, ref, dout, prefill, grad_cpu);
}

}  // namespace mt::test
