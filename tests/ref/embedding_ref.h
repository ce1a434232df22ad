// Double-precision reference of the embedding lookup. Used only by tests.
#pragma once

#include <cstdint>
#include <vector>

namespace mt::ref {

using DVec = std::vector<double>;

// ids holds token ids stored as doubles; table [vocab, dim] -> [tokens, dim].
inline DVec embedding(const DVec& ids, const DVec& table, int64_t dim) {
  DVec y;
  y.reserve(ids.size() * static_cast<size_t>(dim));
  for (double id : ids)
    for (int64_t d = 0; d < dim; ++d) y.push_back(table[static_cast<size_t>(id) * dim + d]);
  return y;
}

}  // namespace mt::ref
