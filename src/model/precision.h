// The precision policy: in which dtype each kind of state is stored and accumulated. Parameters
// are stored in `weights` (frozen and trainable alike); trainable ones also get an fp32 gradient,
// an fp32 master copy when `weights` is narrower than fp32 (the optimizer updates the master and
// rounds it into the weight, so small updates are not lost to bf16 rounding), and fp32 AdamW
// moments. Saved activations are stored in `activations`, except the places that stay fp32 under
// every policy because rounding them changes results, not just precision: normalisation and
// softmax statistics (rstd, log-sum-exp), the KDA state, decay and beta, router logits, scores and
// gate weights, losses, and parameters updated outside the optimizer (ParamRole::Buffer: the
// router's selection bias, whose small sign steps bf16 would round away) or read in fp32 by their
// kernel (ParamSpec::keep_fp32: KDA's A_log and dt_bias, inputs of the decay). Layers mark the
// activations with ArenaPlan::add_fp32 and allocate them as F32; param_dtype (model/param.h)
// places the parameters.
#pragma once

#include <string>

#include "core/dtype.h"

namespace mt {

struct Precision {
  DType weights = DType::F32;
  DType activations = DType::F32;
  DType accumulate = DType::F32;  // GEMM and reduction accumulators

  // Today's CPU engine: everything fp32.
  static Precision fp32() { return {}; }
  // What the GPU runs: bf16 weights and activations, fp32 accumulation, masters and moments.
  static Precision bf16() { return {DType::BF16, DType::BF16, DType::F32}; }

  // Whether trainable parameters keep an fp32 master copy beside their stored value.
  bool masters() const { return weights != DType::F32; }
  // Bytes per element of each kind of trainable state.
  static constexpr size_t kGradBytes = 4, kMasterBytes = 4, kMomentBytes = 8;
  bool operator==(const Precision&) const = default;
};

// "fp32" or "bf16" for the presets; otherwise "weights=bf16,activations=f32,accumulate=f32".
std::string precision_name(const Precision& p);
// Parses a preset name; ConfigError naming `key` and the accepted values otherwise.
Precision parse_precision(const std::string& name, const std::string& key = "precision");

}  // namespace mt
