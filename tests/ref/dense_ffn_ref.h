// Double-precision reference of the dense SwiGLU FFN layer, composed from the op references.
// Parameters are keyed by the layer's local names.
#pragma once

#include <map>
#include <string>

#include "core/seq_info.h"
#include "model/config.h"
#include "ref/activation_ref.h"
#include "ref/linear_ref.h"

namespace mt::ref {

inline DVec dense_ffn(const DenseFfnConfig& cfg, const std::map<std::string, DVec>& p,
                      const DVec& x, const SeqInfo& seq) {
  const int64_t T = seq.tokens, r = cfg.lora.rank;
  auto lin = [&](const std::string& name, const DVec& in, int64_t n_in, int64_t n_out) {
    const DVec none;
    return linear(in, p.at(name + ".weight"), r ? p.at(name + ".lora_A.weight") : none,
                  r ? p.at(name + ".lora_B.weight") : none, T, n_in, n_out, r, cfg.lora.alpha);
  };
  const DVec h =
      swiglu(lin("gate_proj", x, cfg.hidden, cfg.ffn), lin("up_proj", x, cfg.hidden, cfg.ffn));
  return lin("down_proj", h, cfg.ffn, cfg.hidden);
}

}  // namespace mt::ref
