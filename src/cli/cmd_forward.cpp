#include <iostream>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "io/hf_adapter.h"
#include "io/hf_forward.h"
#include "model/vision/vision_front.h"
#include "train/checkpoint.h"
#include "train/job.h"

namespace mt::cli {

Command add_forward_command(CLI::App& app) {
  struct Opts {
    std::string model, checkpoint, tokens, out;
    bool grads = false;
    int threads = 0;
    std::string lora_targets, save_adapter;
    std::string device = "cpu";
    int64_t lora_rank = 4;
    float lora_alpha = 8.f;
    uint64_t lora_seed = 1;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand(
      "forward", "logits, loss and (--grads) HF-named gradients of a model on given token ids");
  auto* model_opt =
      c->add_option("--model", o->model, "model directory (config.json + safetensors)");
  c->add_option("--checkpoint", o->checkpoint,
                "a training checkpoint (or run's checkpoints/) of an HF model: its trained "
                "weights and adapters, with the job's model.dir config")
      ->excludes(model_opt);
  c->add_option("--tokens", o->tokens,
                "safetensors file with int tensor input_ids [B, T] (and, for kimi_k25, "
                "pixel_values and image_grid_thw)")
      ->required();
  c->add_option("--out", o->out, "output safetensors: logits [B,T,V], loss [], gradients")
      ->required();
  c->add_flag("--grads", o->grads, "also write every parameter's gradient under its HF name");
  c->add_option("--threads", o->threads, "CPU threads (0: all)");
  c->add_option("--device", o->device,
                "cpu (default), cuda or auto: where the forward (and backward) runs")
      ->capture_default_str();
  // The PEFT conformance check: a random (non-trivial) adapter, the logits with it, and the
  // adapter in PEFT layout so transformers + PEFT can reproduce the same logits.
  c->add_option("--lora-targets", o->lora_targets,
                "attach random LoRA adapters to: "
                "attention,kda,shared_experts,routed_experts,dense_ffn");
  c->add_option("--lora-rank", o->lora_rank, "adapter rank (with --lora-targets)");
  c->add_option("--lora-alpha", o->lora_alpha, "adapter alpha (with --lora-targets)");
  c->add_option("--lora-seed", o->lora_seed, "seed of the random adapter weights");
  c->add_option("--save-adapter", o->save_adapter,
                "write the adapter as an HF PEFT directory (with --lora-targets)");
  return {c, [o] {
            MT_CHECK(o->save_adapter.empty() || !o->lora_targets.empty(), ValueError,
                     "--save-adapter needs --lora-targets");
            MT_CHECK(!o->model.empty() || !o->checkpoint.empty(), ValueError,
                     "forward: give --model DIR or --checkpoint DIR");
            MT_CHECK(o->checkpoint.empty() || o->lora_targets.empty(), ValueError,
                     "--lora-targets draws a random adapter; a checkpoint has its own");
            LoadedModel lm;
            if (!o->checkpoint.empty()) {
              const std::string ck = resolve_checkpoint(o->checkpoint);
              const Job job = Job::load(ck + "/job.toml");
              lm.config = load_model_config(job.model);
              lm.model =
                  std::make_unique<Model>(job_model_config(job), job.seed, job_model_options(job));
              load_checkpoint(ck, *lm.model, nullptr);
            } else if (o->lora_targets.empty()) {
              lm = load_hf_model(o->model);
            } else {
              lm = load_hf_model_with_lora(
                  o->model, parse_lora_targets(o->lora_targets, o->lora_rank, o->lora_alpha));
              randomize_lora(*lm.model, o->lora_seed);
              if (!o->save_adapter.empty())
                write_peft_adapter(
                    *lm.model, lm.config.model_type,
                    PeftInfo{.r = o->lora_rank, .alpha = o->lora_alpha, .base_model = o->model},
                    o->save_adapter);
            }
            SafetensorsData in = read_safetensors(o->tokens);
            auto it = in.tensors.find("input_ids");
            MT_CHECK(it != in.tensors.end(), IoError, o->tokens, ": no tensor 'input_ids'");
            Job where;
            where.device = o->device;
            Context ctx(ContextOptions{.device = job_device(where), .threads = o->threads});
            const ImageBatch images = read_image_inputs(in.tensors);
            HfForwardResult r = hf_forward(ctx, lm, it->second, o->grads, &images);
            TensorMap out = std::move(r.grads);
            out["logits"] = r.logits;
            Tensor loss = Tensor::empty({});
            loss.f32()[0] = static_cast<float>(r.loss);
            out["loss"] = loss;
            write_safetensors(o->out, out, {{"model_type", lm.config.model_type}});
            std::cout << "loss " << r.loss << "\n";
            return 0;
          }};
}

}  // namespace mt::cli
