// A layer as an OpCase, shared by the MLA and DSA layer tests: x and every parameter are inputs
// (parameters accumulate), the outputs are y and/or the indexer KL value.
//
// The layer is bound to gradient buffers owned by the case (pre-filled at random, so a layer
// that overwrote instead of accumulating shows), and backward adds (buffer - prefill) * scale
// into the harness's gradients. The scale is 1 for the LM path; for a case whose only output is
// the KL value it is dKL / indexer_loss_coeff, because the layer applies its coefficient where
// the harness draws a random upstream gradient. The KL value is reported times kl_output_scale:
// its gradients are ~1e-4, and the harness's accumulate check (random prefill of size 1, then
// subtracted) would otherwise quantise them to float steps of 6e-8.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/arena.h"
#include "harness/op_check.h"
#include "harness/seed.h"
#include "model/layer.h"

namespace mt::test {

using NamePred = std::function<bool(const std::string&)>;

struct LayerCaseSpec {
  std::string name;
  std::function<std::unique_ptr<Layer>()> make;
  std::vector<int64_t> lengths;
  int64_t hidden = 0;
  bool output_y = true;
  bool output_kl = false;
  float kl_coeff = 1.f;          // the layer's indexer_loss_coeff (KL-only cases)
  double kl_output_scale = 1e4;  // the KL output is this times the loss (reference too)
  bool x_differentiable = true;
  NamePred differentiable = [](const std::string&) { return true; };
  NamePred frozen = [](const std::string&) { return false; };     // bound without a gradient
  NamePred untouched = [](const std::string&) { return false; };  // grad must stay as it was
  bool expect_zero_dx = false;  // with x not differentiable: dx must be exactly 0
  std::function<std::vector<DVec>(const std::map<std::string, DVec>&, const DVec&)> reference;
  // Optional: rejects draws too close to a discrete decision (see OpCase::accept); writes the
  // draw's margins to `note` (OpCase::accept_note).
  std::function<bool(const std::map<std::string, DVec>&, const DVec&, std::string& note)> accept;
};

inline bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

class LayerCase : public OpCase {
 public:
  explicit LayerCase(LayerCaseSpec s) : s_(std::move(s)) {
    for (int64_t l : s_.lengths) T_ += l;
    specs_ = s_.make()->param_specs();
  }
  std::string name() const override { return s_.name; }

  std::vector<InputSpec> inputs() const override {
    std::vector<InputSpec> in{
        {.name = "x", .shape = {T_, s_.hidden}, .differentiable = s_.x_differentiable}};
    for (const ParamSpec& p : specs_) {
      InputSpec i{.name = p.name,
                  .shape = p.shape,
                  .differentiable = s_.differentiable(p.name) && !s_.frozen(p.name),
                  .accumulate = true};
      if (ends_with(p.name, "norm.weight"))
        i.init = [](Rng& rng, Tensor& t) {
          for (int64_t e = 0; e < t.numel(); ++e)
            t.f32()[e] = static_cast<float>(rng.uniform(0.7, 1.3));
        };
      else if (ends_with(p.name, "norm.bias"))
        i.scale = 0.2;
      else
        i.scale = 1.0 / std::sqrt(static_cast<double>(p.shape[1]));
      in.push_back(i);
    }
    return in;
  }

  std::vector<OutputSpec> outputs() const override {
    std::vector<OutputSpec> o;
    if (s_.output_y) o.push_back({"y"});
    if (s_.output_kl) o.push_back({"indexer_kl"});
    return o;
  }

  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    layer_ = s_.make();
    ParamTable table;
    own_.assign(specs_.size(), Tensor());
    prefill_.assign(specs_.size(), Tensor());
    Rng rng(prefill_seed_);
    for (size_t i = 0; i < specs_.size(); ++i) {
      ParamRef r{.value = in[1 + i], .grad = Tensor()};
      if (!s_.frozen(specs_[i].name)) {
        own_[i] = Tensor::empty(specs_[i].shape);
        fill_normal(rng, own_[i]);
        prefill_[i] = own_[i].clone();
        r.grad = own_[i];
      }
      table[specs_[i].name] = r;
    }
    layer_->bind(table);
    seq_ = SeqInfo::from_lengths(s_.lengths);
    ArenaPlan plan;
    layer_->plan_activations(seq_, plan);
    acts_ = Arena(plan.bytes(), Device::CPU, "acts");
    Tensor y = alloc({T_, s_.hidden});
    state_ = layer_->make_state();
    layer_->forward(ctx, seq_, in[0], y, acts_, *state_);
    EXPECT_EQ(acts_.used(), plan.bytes()) << "activations differ from plan_activations";
    std::vector<Tensor> out;
    if (s_.output_y) out.push_back(y);
    if (s_.output_kl) {
      Tensor kl = alloc({1});
      bool found = false;
      for (const AuxLoss& a : layer_->aux_losses())
        if (a.name == "indexer_kl") {
          kl.f32()[0] = static_cast<float>(a.value * s_.kl_output_scale);
          found = true;
        }
      EXPECT_TRUE(found) << "no indexer_kl aux loss";
      out.push_back(kl);
    }
    return out;
  }

  void backward(Context& ctx, GuardedAlloc& alloc, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    Tensor dy = s_.output_y ? dout[0] : Tensor::zeros({T_, s_.hidden});
    Tensor dx = s_.x_differentiable ? grads[0] : alloc({T_, s_.hidden});
    layer_->backward(ctx, seq_, dy, dx, *state_);
    if (s_.expect_zero_dx) {
      size_t nonzero = 0;
      for (int64_t e = 0; e < dx.numel(); ++e) nonzero += dx.f32()[e] != 0.f;
      EXPECT_EQ(nonzero, 0u) << "dx must be 0: no gradient leaves the indexer";
    }
    double scale = 1.0;
    if (s_.output_kl && !s_.output_y) scale = dout[0].f32()[0] * s_.kl_output_scale / s_.kl_coeff;
    for (size_t i = 0; i < specs_.size(); ++i) {
      if (!own_[i].defined()) continue;
      const float* o = own_[i].f32();
      const float* p = prefill_[i].f32();
      if (grads[1 + i].defined() && in[1 + i].defined() && s_.differentiable(specs_[i].name)) {
        float* g = grads[1 + i].f32();
        for (int64_t e = 0; e < own_[i].numel(); ++e)
          g[e] += static_cast<float>(scale * (static_cast<double>(o[e]) - p[e]));
      } else if (s_.untouched(specs_[i].name)) {
        size_t changed = 0;
        for (int64_t e = 0; e < own_[i].numel(); ++e) changed += o[e] != p[e];
        EXPECT_EQ(changed, 0u) << "gradient of " << specs_[i].name << " must be left untouched";
      }
    }
  }

  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    std::map<std::string, DVec> params;
    for (size_t i = 0; i < specs_.size(); ++i) params[specs_[i].name] = in[1 + i];
    return s_.reference(params, in[0]);
  }

  bool accept(const std::vector<DVec>& in) const override {
    if (!s_.accept) return true;
    std::map<std::string, DVec> params;
    for (size_t i = 0; i < specs_.size(); ++i) params[specs_[i].name] = in[1 + i];
    return s_.accept(params, in[0], note_);
  }
  std::string accept_note() const override { return note_; }

  Layer& layer() { return *layer_; }

 private:
  LayerCaseSpec s_;
  int64_t T_ = 0;
  std::vector<ParamSpec> specs_;
  std::unique_ptr<Layer> layer_;
  std::vector<Tensor> own_, prefill_;
  SeqInfo seq_;
  Arena acts_;
  std::unique_ptr<LayerState> state_;
  // Drawn once per case: the device pass pre-fills the gradients as the CPU pass did.
  uint64_t prefill_seed_ = test_seed();
  mutable std::string note_;  // accept() is const: it records the margins of the draw it judged
};

inline std::vector<int64_t> offsets_of(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> o{0};
  for (int64_t l : lengths) o.push_back(o.back() + l);
  return o;
}

}  // namespace mt::test
