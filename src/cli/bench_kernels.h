// The kernel benchmarks behind `moetrain bench dsa | kda | moe` (cmd_bench.cpp registers their
// options): each runs on the GPU, logs a line per case to `log` and returns its JSON.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

namespace mt::cli {

// The DSA layer's kernels at the benchmark layer's shapes (issue 13): 32 heads with their own
// keys, q/k 192, v 128, indexer 8 x 64, top-2048, bf16, one document; bench/dsa_torch.py times
// the plain-PyTorch layer in the same parts.
struct DsaBenchOptions {
  std::string tokens = "8192,32768,65536,131072";
  int64_t heads = 32, qk_dim = 192, v_dim = 128, index_heads = 8, index_dim = 64, topk = 2048;
  int64_t kv_heads = 0;  // 0: one key head per query head (the engine's MLA layout)
  // MLA's latent and rotary widths: with kv_rank > 0 and per-head keys, attention runs as the DSA
  // layer runs it, in the absorbed MQA form (576-wide shared entries, 512-wide values, the
  // per-head W_UK / W_UV products included); 0: over the per-head keys.
  int64_t kv_rank = 512, rope_dim = 64;
  // The generation of the absorbed form's kernels the layer timings run (ops::SparseMqaKernels:
  // split, chained, wgmma, wgmma2 or wgmma3); the kernels' own fields time all of them either way.
  std::string mqa_kernels = "wgmma2";
  int64_t warmup = 1, iters = 3;
  double workspace_gib = 8;
};

nlohmann::json run_dsa_bench(const DsaBenchOptions& o, std::ostream& log);

// The KDA core (ops/kda.h, chunked, bf16 q/k/v/o, f32 gate and beta) at issue 12's shapes:
// B2 T8192 and B1 T65536 with H32 D128, and a packed case of 16 documents of mixed lengths
// summing to 16384 tokens; bench/kda_fla.py times fla's chunk_kda on the same shapes.
struct KdaBenchOptions {
  int64_t heads = 32, head_dim = 128, warmup = 2, iters = 10;
  // The backward's prepared blocks, Delta, dR and dS per chunk: 8.6 GB at B1 T65536 (the
  // prepared blocks are in the workspace unless kept from forward: kda_keep_prepared).
  double workspace_gib = 12;
  std::string prepared = "bf16";  // the tensor-core path's prepared layout (ops/kda_prep_path.h)
  std::string cases;              // comma-separated case names; empty: all
  bool no_overlap = false;        // prep, then the state pass, as the default (kda_forward_overlap)
};

nlohmann::json run_kda_bench(const KdaBenchOptions& o, std::ostream& log);

// The routed experts' grouped SwiGLU FFN (ops/grouped_ffn.h, bf16) at issue 14's shapes: A =
// 16384 tokens x top-8 over 64 experts, d 2048, ffn 1024; B = 8192 x top-8 over 256 experts, d
// 2304, ffn 1024; near-uniform routing and skewed routing (every eighth expert hot, 30x the rows
// of the others). Forward, forward+backward with a frozen base (dX only), with the base training
// (dX + dW) and with LoRA on every expert projection (dX + the adapters' grads);
// bench/moe_torch.py times torch._grouped_mm on the same shapes and row counts. Beside them: the
// frozen and LoRA forward+backward replayed from a CUDA graph, and the MoE layer's routing,
// permutation and combine (bench_routing), each part and its share (docs/cli.md, bench moe).
struct MoeBenchOptions {
  int64_t lora_rank = 16, warmup = 2, iters = 10;
  double workspace_gib = 4;
  // Grouped GEMM configurations to run in turn (ops/grouped_matmul.h names, comma-separated);
  // empty: MOETRAIN_GROUPED_GEMM's, or the default.
  std::string gemm;
  // Cases to run, comma-separated ("A", "B:skewed", ...: a shape, optionally its routing); empty:
  // all four. A profiler run (ncu) wants one.
  std::string cases;
  // The base runs only (forward, frozen, full, full with dW written): no LoRA, graphs or routing,
  // so that a sweep of grouped GEMM configurations spends its device time on what they change.
  bool base_only = false;
  // The K-concatenated LoRA run's kernels (GroupedFfnParams::lora_fwd / lora_bwd / lora_out_grads /
  // lora_xa / lora_dr: separate, staged or registers, and gemm for xa and dr; empty: the op's
  // defaults), and the other kernels timed beside it, as "fwd=<kernels>", "bwd=...", "og=...",
  // "xa=..." or "dr=...", comma-separated: "all" (every other one) or "none".
  std::string lora_fwd, lora_bwd, lora_og, lora_xa, lora_dr, lora_variants = "all";
  // The interleaved gate/up layout's rounds beside the default layout's (off: a device call whose
  // interleaved tests failed still gets every other figure).
  bool interleaved = true;
};

nlohmann::json run_moe_bench(const MoeBenchOptions& o, std::ostream& log);

}  // namespace mt::cli
