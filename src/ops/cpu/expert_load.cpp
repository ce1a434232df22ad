#include "ops/expert_load.h"

namespace mt::ops::cpu {

void expert_load_count(Context&, const Tensor& offsets, const Tensor& slot_expert, Tensor& load) {
  const int64_t S = offsets.numel() - 1, E = load.numel();
  const int32_t* off = offsets.i32();
  const int32_t* at = slot_expert.defined() && slot_expert.numel() ? slot_expert.i32() : nullptr;
  int64_t* pl = load.i64();
  for (int64_t s = 0; s < S; ++s) {
    const int64_t e = at ? at[s] : s;
    MT_CHECK(e >= 0 && e < E, ValueError, "expert_load_count: slot ", s, " maps to expert ", e,
             " of ", E);
    pl[e] += off[s + 1] - off[s];
  }
}

void map_ids(Context&, Tensor& ids, const Tensor& table) {
  const int64_t n = ids.numel(), m = table.numel();
  int32_t* p = ids.i32();
  const int32_t* t = table.i32();
  for (int64_t i = 0; i < n; ++i) {
    MT_CHECK(p[i] >= 0 && p[i] < m, ValueError, "map_ids: id ", p[i], " at position ", i,
             " outside a table of ", m);
    p[i] = t[p[i]];
  }
}

}  // namespace mt::ops::cpu
