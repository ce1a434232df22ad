// Every trainable gradient of a model as raw bytes, by parameter name: for tests that expect two
// runs to agree bit for bit (micro-batches in flight against one after the other).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "model/model.h"

namespace mt::test {

using GradBits = std::map<std::string, std::vector<char>>;

inline GradBits grad_bits(const Model& m) {
  GradBits g;
  for (const auto& p : m.params().all()) {
    if (!p->trainable()) continue;
    const auto* b = static_cast<const char*>(p->grad.raw());
    g[p->name].assign(b, b + p->grad.bytes());
  }
  return g;
}

}  // namespace mt::test
