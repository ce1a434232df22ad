// Kernel registry ("operator matching"): for each op kind, the implementations per backend with
// the constraints under which each applies. The planner picks one per op of every layer kind and
// says why; when no fast kernel applies, the op falls back to the reference with a warning that
// names the failed constraint. Today only the CPU implementations in src/ops exist: every GPU
// entry is listed with `built = false`, so a GPU plan reports reference fallbacks honestly.
#pragma once

#include <functional>
#include <string>
#include <vector>

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

}  // namespace mt::plan
