// Kernel registry ("operator matching"): for each op kind, the implementations per backend with
// the constraints under which each applies. The planner picks one per op of every layer kind and
// says why; when no fast kernel applies, the op falls back to the reference with a warning that
// names the failed constraint. Today only the CPU implementations in src/ops exist: every GPU
// entry is listed with `built = false`, so a GPU plan reports reference fallbacks honestly.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/model_config.h"

namespace mt::plan {

enum class Backend { Cpu, Cuda };
const char* backend_name(Backend b);

enum class OpKind {
  Gemm,
  KdaCore,
  MlaAttention,
  SparseAttention,
  Indexer,
  Router,
  MoeDispatch,
  GroupedExperts,
  CrossEntropy,
  Norm,
  Conv1d,
};
const char* op_name(OpKind k);

// What the op sees of the model: dtype and the dims its kernels constrain.
struct OpShape {
  std::string dtype = "fp32";
  int64_t head_dim = 0;
  int64_t chunk = 0;
  bool chunked = true;
  int64_t topk = 0;
  int64_t lora_rank = 0;
};

struct KernelImpl {
  std::string name;
  Backend backend;
  bool built = false;      // compiled into this binary
  bool reference = false;  // the always-correct fallback
  std::string source;      // where it lives (or would)
  // Empty when the kernel accepts the op, else the constraint it fails.
  std::function<std::string(const OpShape&)> accepts;
};

struct KernelChoice {
  OpKind op;
  std::string layer;  // layer kind ("kda+moe", ...) the op belongs to
  std::string kernel;
  bool fallback = false;
  std::string why;  // the first rejected faster kernel and its reason, for fallbacks
  // A faster kernel is registered for the backend but failed a constraint or is not built (a
  // fallback that deserves a warning; an op whose reference is its only kernel does not).
  bool constrained = false;
};

class KernelRegistry {
 public:
  // Every op kind with its CPU and (planned) CUDA implementations.
  static KernelRegistry builtin();
  void add(OpKind op, KernelImpl impl);
  const std::vector<KernelImpl>& impls(OpKind op) const;
  // The first built kernel of `backend` that accepts the shape, preferring non-reference ones;
  // the reference (of the backend, else the CPU one) when none does.
  KernelChoice choose(OpKind op, Backend backend, const OpShape& shape) const;

 private:
  std::vector<std::vector<KernelImpl>> by_op_;
};

// The choice for every op of every distinct layer kind of `cfg`.
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
