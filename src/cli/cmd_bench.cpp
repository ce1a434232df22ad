// `moetrain bench`: the step and decode benchmarks (train/bench_step.h, train/bench_decode.h) and
// the kernel benchmarks (cli/bench_kernels.h), each printing JSON.
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/bench_kernels.h"
#include "cli/commands.h"
#include "train/bench_decode.h"
#include "train/bench_step.h"
#include "train/files.h"

namespace mt::cli {

Command add_bench_command(CLI::App& app) {
  auto o = std::make_shared<StepBenchOptions>();
  auto json_out = std::make_shared<std::string>();
  CLI::App* c = app.add_subcommand("bench", "benchmarks that print JSON (see docs/gpu.md)");
  CLI::App* s = c->add_subcommand("step", "time one training step of a model on one device");
  c->require_subcommand(1);
  // The options of the benchmarks that build a model (step, decode): its config (weights are
  // random), then, where each puts them, the precision and device a job would give.
  const auto add_model = [](CLI::App* sub, std::string& model) {
    sub->add_option("--model", model, "preset, config.json or HF model directory")->required();
  };
  const auto add_precision_device = [](CLI::App* sub, std::string& precision, std::string& device) {
    sub->add_option("--precision", precision, "fp32 or bf16")->capture_default_str();
    sub->add_option("--device", device, "cpu, cuda or auto")->capture_default_str();
  };
  add_model(s, o->model);
  s->add_option("--tokens", o->tokens, "tokens per step (one document)")->capture_default_str();
  s->add_option("--steps", o->steps, "timed steps")->capture_default_str();
  s->add_option("--warmup", o->warmup, "untimed steps first")->capture_default_str();
  s->add_option("--lora-rank", o->lora_rank, "LoRA rank (0: full training)")->capture_default_str();
  s->add_option("--lora-targets", o->lora_targets,
                "LoRA groups, comma-separated (job.toml's lora.targets); the default matches "
                "hf_lora_step.py's 'grouped' variant, add routed_experts for its 'experts' one")
      ->delimiter(',')
      ->capture_default_str();
  add_precision_device(s, o->precision, o->device);
  s->add_option("--workspace-gib", o->workspace_gib,
                "op scratch on the device (0: the planner's estimate)")
      ->capture_default_str();
  s->add_flag("--deterministic", o->deterministic, "bit-repeatable GPU kernels");
  s->add_option("--threads", o->threads, "CPU threads (0: all)")->capture_default_str();
  s->add_option("--peak-tflops", o->peak_tflops, "device peak for MFU (0: H200 bf16 dense, 989)");
  s->add_option("--lr", o->lr, "AdamW learning rate (every step trains on the same batch)")
      ->capture_default_str();
  s->add_option("--kda-kernels", o->kda_kernels,
                "chunked (ops/cuda/kda_chunk.cu) or direct (ops/cuda/kda.cu, the step before the "
                "chunked kernels)")
      ->check(CLI::IsMember({"chunked", "direct"}))
      ->capture_default_str();
  s->add_flag("--plan-only", o->plan_only,
              "print the planner's memory prediction for the step (cuda unless --device cpu) and "
              "stop, without building the model");
  auto d = std::make_shared<DsaBenchOptions>();
  CLI::App* ds = c->add_subcommand("dsa",
                                   "time the DSA layer's kernels (indexer, top-k, "
                                   "attention, KL) at the benchmark layer's shapes");
  ds->add_option("--tokens", d->tokens, "comma-separated lengths (one document each)")
      ->capture_default_str();
  ds->add_option("--heads", d->heads, "attention heads")->capture_default_str();
  ds->add_option("--kv-heads", d->kv_heads,
                 "key heads (0: one per query head; 1: MQA, the tensor-core sparse kernels)")
      ->capture_default_str();
  ds->add_option("--qk-dim", d->qk_dim, "q/k head dim")->capture_default_str();
  ds->add_option("--v-dim", d->v_dim, "value head dim")->capture_default_str();
  ds->add_option("--index-heads", d->index_heads, "indexer heads")->capture_default_str();
  ds->add_option("--index-dim", d->index_dim, "indexer head dim")->capture_default_str();
  ds->add_option("--topk", d->topk, "index_topk")->capture_default_str();
  ds->add_option("--kv-rank", d->kv_rank,
                 "MLA latent width: attention in the absorbed MQA form, as the DSA layer runs it "
                 "(0: over the per-head keys)")
      ->capture_default_str();
  ds->add_option("--rope-dim", d->rope_dim, "rotary part of qk-dim")->capture_default_str();
  ds->add_option(
        "--mqa-kernels", d->mqa_kernels,
        "the absorbed form's kernels for the layer timings: split, chained, wgmma, wgmma2 or "
        "wgmma3 "
        "(the mqa_*_ms_* fields time all)")
      ->capture_default_str();
  ds->add_option("--iters", d->iters, "timed runs per part")->capture_default_str();
  ds->add_option("--workspace-gib", d->workspace_gib, "op scratch on the device")
      ->capture_default_str();
  auto kb = std::make_shared<KdaBenchOptions>();
  CLI::App* ks = c->add_subcommand("kda",
                                   "time the chunked KDA core, forward and forward+backward, at "
                                   "issue 12's shapes (bench/kda_fla.py: fla's chunk_kda)");
  ks->add_option("--heads", kb->heads, "heads")->capture_default_str();
  ks->add_option("--head-dim", kb->head_dim, "head_k = head_v")->capture_default_str();
  ks->add_option("--iters", kb->iters, "timed runs")->capture_default_str();
  ks->add_option("--warmup", kb->warmup, "untimed runs first")->capture_default_str();
  ks->add_option("--cases", kb->cases,
                 "comma-separated cases (B2_T8192, B1_T65536, packed16_T16384); default all");
  ks->add_flag("--no-overlap", kb->no_overlap,
               "prep, then the state pass, where the overlapped forward would run (for profilers)");
  ks->add_option("--prepared", kb->prepared,
                 "the tensor-core path's prepared block: bf16 (W, Qh, Kl, U, Kb as bf16) or f32")
      ->capture_default_str();
  auto mb = std::make_shared<MoeBenchOptions>();
  CLI::App* ms = c->add_subcommand("moe",
                                   "time the routed experts' grouped SwiGLU FFN (frozen, full, "
                                   "LoRA; eager and from a CUDA graph) and the layer's routing, "
                                   "permutation and combine at issue 14's shapes "
                                   "(bench/moe_torch.py: torch._grouped_mm)");
  ms->add_option("--lora-rank", mb->lora_rank, "LoRA rank of the adapter runs")
      ->capture_default_str();
  ms->add_option("--iters", mb->iters, "timed runs")->capture_default_str();
  ms->add_option("--warmup", mb->warmup, "untimed runs first")->capture_default_str();
  ms->add_option("--cases", mb->cases,
                 "shapes to run, comma-separated: A, B, or one routing of one (A:uniform, "
                 "B:skewed, ...); default: all four");
  ms->add_option("--lora-fwd", mb->lora_fwd,
                 "the LoRA run's SwiGLU forward kernels: separate, staged or registers (default: "
                 "the op's)");
  ms->add_option("--lora-bwd", mb->lora_bwd,
                 "the LoRA run's SwiGLU backward kernels: separate, staged or registers");
  ms->add_option(
      "--lora-og", mb->lora_og,
      "the LoRA run's out_grads kernels (dr, dB over dY): separate, staged or registers");
  ms->add_option("--lora-xa", mb->lora_xa,
                 "the LoRA run's X A^T kernel: gemm (in the gate/up GEMM's mainloop), staged (the "
                 "skinny down kernel) or registers");
  ms->add_option("--lora-dr", mb->lora_dr,
                 "the LoRA run's dr = s dY B_down and dB_down: gemm (in the down dX GEMM's "
                 "mainloop) or staged (the out_grads pass, then the GEMM)");
  ms->add_option("--lora-variants", mb->lora_variants,
                 "the other kernels timed beside the LoRA run: all, none, or a list of "
                 "fwd=<kernels> / bwd=<kernels> / og=<kernels> / xa=<kernels> / dr=<kernels>")
      ->capture_default_str();
  ms->add_flag("!--no-interleaved", mb->interleaved,
               "skip the interleaved gate/up layout's rounds (the *_interleaved_* fields)");
  ms->add_flag("--base-only", mb->base_only,
               "time the base runs only (forward, frozen, full, full with dW written): no LoRA, "
               "CUDA graphs or routing, for --gemm sweeps");
  ms->add_option(
      "--gemm", mb->gemm,
      "grouped GEMM configurations to run in turn, comma-separated "
      "(kernel[:sN][:n][:dx=kernel][:dw=kernel][:down=kernel][:swiglu[=fwd|=bwd|=off]][:narrow], "
      "docs/gpu.md; :swiglu times the SwiGLU fused into the GEMMs' epilogues); default: "
      "MOETRAIN_GROUPED_GEMM's or the default");
  auto db = std::make_shared<DecodeBenchOptions>();
  CLI::App* dc = c->add_subcommand("decode",
                                   "incremental decoding tokens/s: a prompt, then greedy "
                                   "single-token steps, with KDA's single-token kernel and with "
                                   "the chunked core (random weights)");
  add_model(dc, db->model);
  dc->add_option("--prompt", db->prompt, "prompt tokens")->capture_default_str();
  dc->add_option("--tokens", db->tokens, "generated tokens (timed)")->capture_default_str();
  add_precision_device(dc, db->precision, db->device);
  dc->add_option("--workspace-gib", db->workspace_gib, "op scratch")->capture_default_str();
  // Last in every benchmark's option list.
  for (CLI::App* sub : {s, ds, ks, ms, dc})
    sub->add_option("--json", *json_out, "also write the result to this file");
  return {c, [o, d, ds, kb, ks, mb, ms, db, dc, json_out] {
            nlohmann::json j;
            if (dc->parsed()) {
              j = run_decode_bench(*db, std::cerr);
            } else if (ms->parsed()) {
              j = run_moe_bench(*mb, std::cerr);
            } else if (ks->parsed()) {
              j = run_kda_bench(*kb, std::cerr);
            } else if (ds->parsed()) {
              j = run_dsa_bench(*d, std::cerr);
            } else {
              if (o->lora_rank == 0) o->lora_targets.clear();
              j = run_step_bench(*o, std::cerr);
            }
            std::cout << j.dump() << "\n";
            if (!json_out->empty()) write_file_atomic(*json_out, j.dump(2) + "\n");
            return 0;
          }};
}

}  // namespace mt::cli
