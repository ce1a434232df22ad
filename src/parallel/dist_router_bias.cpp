// DistTrainer, part: the aux-loss-free router bias update from expert loads summed over the world.
#include <algorithm>

#include "model/moe_layer.h"
#include "parallel/dist_unit.h"

namespace mt::par {

void DistTrainer::update_router_biases(Context& ctx) {
  // Aux-loss-free balancing from the loads of all ranks' tokens, into the buffers the
  // constructor sized (one per MoE layer, num_experts entries).
  const std::vector<MoeLayer*>& moes = moe_layers_;
  for (size_t i = 0; i < moes.size(); ++i) {
    MoeLayer* m = moes[i];
    if (!m) continue;
    std::vector<int64_t>& load = loads_[i];
    const std::vector<int64_t>& mine = m->expert_load();
    MT_CHECK(mine.size() == load.size(), InternalError, "layer ", i, " counted ", mine.size(),
             " experts, expected ", load.size());
    std::copy(mine.begin(), mine.end(), load.begin());
    g_.world->all_reduce(load.data(), static_cast<int64_t>(load.size()), Elem::I64);
    m->update_selection_bias(ctx, load);
    m->reset_expert_load();
  }
}

}  // namespace mt::par
