// Double-precision references of the routed-expert FFN and of the whole latent MoE block, written
// as naive per-token loops (for each token, for each chosen expert, evaluate that expert's FFN
// directly). Used only by tests; never calls mt::ops.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/config.h"

namespace mt::ref {

using DVec = std::vector<double>;

struct ExpertRefDims {
  int64_t experts = 0, in = 0, ffn = 0, lora_rank = 0;
  double lora_alpha = 0;
};

// Tensors of the routed experts in the fused HF layout; the adapter ones may be empty.
struct ExpertRefWeights {
  const DVec* gate_up = nullptr;    // [E, 2F, in]
  const DVec* down = nullptr;       // [E, in, F]
  const DVec* gate_up_a = nullptr;  // [E, r, in]
  const DVec* gate_up_b = nullptr;  // [E, 2F, r]
  const DVec* down_a = nullptr;     // [E, r, F]
  const DVec* down_b = nullptr;     // [E, in, r]
};

// One expert's SwiGLU FFN on one row x [in] -> [in].
DVec expert_ffn(const ExpertRefDims& d, const ExpertRefWeights& w, int64_t expert, const double* x);

// y [T, out] = x W^T + (alpha / r) (x A^T) B^T; A, B ignored when r == 0.
DVec linear(const DVec& x, int64_t tokens, int64_t in, int64_t out, const DVec& w, const DVec* a,
            const DVec* b, int64_t r, double alpha);

struct MoeRefOut {
  DVec y;                // [T, hidden]
  std::vector<int> ids;  // [T, k]
  DVec weights;          // [T, k]
  double seq_aux = 0;    // unweighted
  double z = 0;          // unweighted
};

// The MoE block of model/moe_layer.h. params: keyed by the layer's local names.
MoeRefOut moe_layer(const MoeConfig& cfg, const std::map<std::string, DVec>& params, const DVec& x,
                    const std::vector<int64_t>& offsets);

}  // namespace mt::ref
