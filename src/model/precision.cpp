#include "model/precision.h"

#include "core/error.h"

namespace mt {

std::string precision_name(const Precision& p) {
  if (p == Precision::fp32()) return "fp32";
  if (p == Precision::bf16()) return "bf16";
  return cat("weights=", dtype_name(p.weights), ",activations=", dtype_name(p.activations),
             ",accumulate=", dtype_name(p.accumulate));
}

Precision parse_precision(const std::string& name, const std::string& key) {
  if (name == "fp32") return Precision::fp32();
  if (name == "bf16") return Precision::bf16();
  MT_THROW(ConfigError, key, " must be \"fp32\" or \"bf16\", got \"", name, "\"");
}

}  // namespace mt
