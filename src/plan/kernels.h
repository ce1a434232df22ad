// Per-layer kernel matching: the op table (src/ops/op_table.h) consulted for every op of every
// layer kind. The planner picks one kernel per op and says why; when no fast kernel applies, the
// op falls back to the reference with a warning that names the failed constraint (or that the
// kernel is not built into this binary).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/model_config.h"
#include "ops/op_table.h"

namespace mt::plan {

// The table lives in ops/ (one for the runtime and the planner); plan/ names its types here.
using ops::Backend;
using ops::backend_name;
using ops::KernelChoice;
using ops::KernelImpl;
using ops::KernelRegistry;
using ops::op_name;
using ops::OpKind;
using ops::OpShape;

// The choice for every op of every distinct layer kind of `cfg`, then the head's, then the ops
// decoding runs (layer "<mixer> (decoding)": src/decode/'s KDA step and cached attention).
std::vector<KernelChoice> match_kernels(const ModelConfig& cfg, Backend backend,
                                        const std::string& dtype);

// The choice for every op of every layer, in the form Model takes at build time
// (ModelOptions::kernels): the record of each op's kernel, and the implementation the layer
// switches to (the KDA recurrence when the chunked kernel is rejected).
std::vector<LayerKernels> layer_kernels(const ModelConfig& cfg, Backend backend,
                                        const std::string& dtype);
// What the trainer logs once at start: per distinct layer kind the kernels and the layers using
// them, one "warning:" line per layer op that falls back although a faster kernel is registered
// (naming the rejected kernel and why), and the ops that only have their reference kernel.
std::string describe_kernels(const ModelConfig& cfg, const std::vector<LayerKernels>& kernels);

}  // namespace mt::plan
