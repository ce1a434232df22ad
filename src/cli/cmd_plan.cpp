#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "io/hf_names.h"
#include "plan/report.h"

namespace mt::cli {

namespace {

struct PlanArgs {
  std::string model = "small";
  int64_t gpus = 0;
  double mem_gb = 0;
  int64_t gpus_per_node = 8;
  int64_t seq = 4096;
  int64_t mbs = 0, ep = 0, fsdp = 0, expert_shard = 0, a2a_chunks = 0;
  int64_t lora_rank = 16, expert_lora_rank = 0;
  float lora_alpha = 32.f;
  bool full = false, json = false, markdown = false;
  std::string recompute, backend = "cuda", precision;
  int64_t keep = 8;
  double inter_gbps = 50;
};

std::optional<int64_t> opt(int64_t v) {
  return v > 0 ? std::optional<int64_t>(v) : std::nullopt;
}

}  // namespace

Command add_plan_command(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* c = app.add_subcommand(
      "plan", "choose a parallel plan: memory per device, step time, throughput, kernels");
  c->add_option("--model", a->model,
                "preset (tiny, small, seed-2.8t), config.json or HF model directory")
      ->capture_default_str();
  c->add_option("--gpus", a->gpus, "number of devices")->required()->check(CLI::PositiveNumber);
  c->add_option("--mem-gb", a->mem_gb, "memory per device, GB (1e9 bytes)")
      ->required()
      ->check(CLI::PositiveNumber);
  c->add_option("--gpus-per-node", a->gpus_per_node, "devices per node (NVLink domain)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  c->add_option("--seq", a->seq, "tokens per sequence")->capture_default_str();
  c->add_option("--mbs", a->mbs, "sequences per micro-batch per device (default: searched)");
  auto* lora = c->add_option("--lora-rank", a->lora_rank, "LoRA rank on every projection")
                   ->capture_default_str();
  c->add_option("--lora-alpha", a->lora_alpha, "LoRA alpha")->capture_default_str();
  c->add_option("--expert-lora-rank", a->expert_lora_rank,
                "LoRA rank on every routed expert (0: experts frozen without adapters)")
      ->capture_default_str();
  c->add_flag("--full", a->full, "full fine-tuning (every parameter trainable)")->excludes(lora);
  c->add_option("--ep", a->ep, "fix the expert-parallel size");
  c->add_option("--fsdp", a->fsdp, "fix the FSDP shard size of dense parameters");
  c->add_option("--expert-shard", a->expert_shard,
                "fix how many expert replicas shard the experts between them");
  c->add_option("--a2a-chunks", a->a2a_chunks, "fix the all-to-all chunk count");
  c->add_option("--recompute", a->recompute, "fix the recompute policy: none, selective, full");
  c->add_option("--backend", a->backend, "cuda (bf16 weights) or cpu (fp32)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cuda", "cpu"}));
  c->add_option("--precision", a->precision,
                "fp32 or bf16 (default: the backend's, bf16 on cuda, fp32 on cpu)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  c->add_option("--inter-gbps", a->inter_gbps, "inter-node bandwidth per device, GB/s")
      ->capture_default_str();
  c->add_option("--top", a->keep, "plans listed")->capture_default_str();
  auto* js = c->add_flag("--json", a->json, "machine-readable output");
  c->add_flag("--markdown", a->markdown, "Markdown output (docs/seed-scale.md)")->excludes(js);
  return {c, [a] {
            plan::PlanRequest q;
            q.model_name = a->model;
            q.world = a->gpus;
            q.backend = a->backend == "cpu" ? plan::Backend::Cpu : plan::Backend::Cuda;
            q.hw.mem_bytes = a->mem_gb * 1e9;
            q.hw.gpus_per_node = a->gpus_per_node;
            q.hw.inter_bw = a->inter_gbps * 1e9;
            plan::SearchOptions& o = q.options;
            o.seq = a->seq;
            o.mbs = opt(a->mbs);
            o.ep = opt(a->ep);
            o.fsdp = opt(a->fsdp);
            o.expert_shard = opt(a->expert_shard);
            o.a2a_chunks = opt(a->a2a_chunks);
            if (!a->recompute.empty()) o.recompute = plan::parse_recompute(a->recompute);
            o.keep = a->keep;
            o.memory.freeze_base = !a->full;
            o.memory.precision = !a->precision.empty()             ? parse_precision(a->precision)
                                 : q.backend == plan::Backend::Cpu ? Precision::fp32()
                                                                   : Precision::bf16();
            o.memory.device = q.backend == plan::Backend::Cpu ? Device::CPU : Device::CUDA;
            if (!a->full) {
              MT_CHECK(a->lora_rank > 0, ValueError,
                       "--lora-rank must be positive (use --full for full fine-tuning)");
              o.lora = {
                  .rank = a->lora_rank, .alpha = a->lora_alpha, .expert_rank = a->expert_lora_rank};
            }
            q.cfg = plan::with_lora(load_model_config(a->model).model, o.lora);
            const plan::PlanReport r = plan::run_plan(q);
            if (a->json)
              std::cout << plan::report_json(r).dump(1) << "\n";
            else if (a->markdown)
              plan::print_markdown(std::cout, r);
            else
              plan::print_text(std::cout, r);
            if (r.result.best.empty()) {
              std::cerr << "moetrain plan: no plan fits in " << a->mem_gb
                        << " GB per device; see the rejected plans above\n";
              return 1;
            }
            return 0;
          }};
}

}  // namespace mt::cli
