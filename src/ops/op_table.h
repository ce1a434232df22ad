// The op table ("operator matching"): for each op kind, the implementations per backend with the
// constraints under which each applies and whether it is compiled into this binary. One table
// serves the runtime and the planner (src/plan/kernels.h matches it against every layer). When no
// fast kernel applies, the op falls back to the reference with a reason naming the failed
// constraint. A CUDA entry counts as built only in a MOETRAIN_CUDA binary whose kernel has landed
// (the per-kernel flags at the top of op_table.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mt::ops {

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
  // Decoding (src/decode/): the KDA recurrence from a carried state, attention and the DSA
  // indexer over a KV cache.
  KdaStep,
  CachedAttention,
  CachedIndexer,
};
const char* op_name(OpKind k);

// What the op sees of the model: dtype and the dims its kernels constrain.
struct OpShape {
  std::string dtype = "fp32";
  int64_t head_dim = 0;  // attention: the q.k width
  int64_t heads = 0;     // indexer: its heads
  int64_t v_dim = 0;     // attention: the value width
  int64_t chunk = 0;
  bool chunked = true;
  bool kda_chunk_kernels = true;  // KdaKernels::chunk_kernels
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
  // Every op kind with its CPU and CUDA implementations.
  static KernelRegistry builtin();
  void add(OpKind op, KernelImpl impl);
  const std::vector<KernelImpl>& impls(OpKind op) const;
  // The first built kernel of `backend` that accepts the shape, preferring non-reference ones;
  // the reference (of the backend, else the CPU one) when none does.
  KernelChoice choose(OpKind op, Backend backend, const OpShape& shape) const;

 private:
  std::vector<std::vector<KernelImpl>> by_op_;
};

}  // namespace mt::ops
