#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/device.h"
#include "io/hf_names.h"
#include "train/adapter.h"
#include "train/checkpoint.h"
#include "train/generate.h"
#include "train/job.h"
#include "train/tokenizer.h"

namespace mt::cli {

namespace {
struct GenerateArgs {
  std::string model = "tiny", checkpoint, adapter, tokenizer, prompt, prompt_ids;
  SamplingOptions sampling;
  uint64_t init_seed = 1;
  int threads = 0;
  std::string device = "cpu";
};

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::string tok;
  std::stringstream ss(s);
  while (std::getline(ss, tok, ',')) {
    std::stringstream ts(tok);
    long long v = 0;
    std::string rest;
    MT_CHECK(static_cast<bool>(ts >> v) && !(ts >> rest), ValueError, "--prompt-ids: '", tok,
             "' is not an integer (expected e.g. 5,17,3)");
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}
}  // namespace

Command add_generate_command(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* c = app.add_subcommand("generate", "sample text with incremental decoding");
  c->add_option("--model", a->model,
                "preset, config.json or HF model directory (its weights when it has any; "
                "ignored with --checkpoint)")
      ->capture_default_str();
  c->add_option("--checkpoint", a->checkpoint,
                "checkpoint directory or a run's checkpoints/ (weights and LoRA adapters)");
  c->add_option("--adapter", a->adapter,
                "LoRA adapter directory in PEFT layout (moetrain export --format peft), applied "
                "to the base model from --model or --checkpoint");
  c->add_option("--tokenizer", a->tokenizer, "tokenizer.model (from data prepare / demo)");
  auto* p = c->add_option("--prompt", a->prompt, "prompt text (with --tokenizer; else bytes)");
  auto* pi = c->add_option("--prompt-ids", a->prompt_ids, "prompt token ids, e.g. 5,17,3");
  p->excludes(pi);
  c->add_option("--max-new", a->sampling.max_new, "tokens to generate")->capture_default_str();
  c->add_option("--temperature", a->sampling.temperature, "0: greedy")->capture_default_str();
  c->add_option("--top-p", a->sampling.top_p, "nucleus mass")->capture_default_str();
  c->add_option("--seed", a->sampling.seed, "sampling seed")->capture_default_str();
  c->add_option("--init-seed", a->init_seed, "weight init seed when no checkpoint is given")
      ->capture_default_str();
  c->add_option("--threads", a->threads, "CPU threads (0: all)")->capture_default_str();
  c->add_option("--device", a->device,
                "cpu (default), cuda or auto: where the model and the decoder's state live")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  return {c, [a] {
            MT_CHECK(!a->prompt.empty() || !a->prompt_ids.empty(), ValueError,
                     "generate: give --prompt TEXT or --prompt-ids IDS");
            MT_CHECK(a->device != "cuda" || cuda_available(), ValueError,
                     "generate --device cuda: ",
                     cuda_device_count() == 0 ? "no GPU is visible or this binary was built "
                                                "without CUDA (-DMOETRAIN_CUDA=ON)"
                                              : "no GPU is usable",
                     "; use --device cpu or auto");
            Job where;
            where.device = a->device;
            const Device dev = job_device(where);
            Context ctx(ContextOptions{.device = dev, .threads = a->threads});
            std::unique_ptr<Model> model;
            Job base_job;
            if (!a->checkpoint.empty()) {
              CheckpointModel cm = load_checkpoint_model(a->checkpoint);
              base_job = std::move(cm.job);
              model = std::move(cm.model);
            } else {
              base_job.model = a->model;
              base_job.seed = a->init_seed;
              if (has_weights(a->model)) {
                base_job.model_dir = a->model;
                model = std::move(
                    load_hf_model(a->model, {},
                                  progress_printer(std::cerr, a->model, isatty(fileno(stderr))))
                        .model);
              } else {
                model = std::make_unique<Model>(load_model_config(a->model).model, a->init_seed);
              }
            }
            if (!a->adapter.empty()) model = apply_peft_adapter(*model, base_job, a->adapter);
            std::unique_ptr<Tokenizer> tok;
            if (!a->tokenizer.empty())
              tok = std::make_unique<Tokenizer>(Tokenizer::load(a->tokenizer));
            std::vector<int32_t> prompt;
            if (!a->prompt_ids.empty())
              prompt = parse_ids(a->prompt_ids);
            else if (tok)
              prompt = tok->encode(a->prompt);
            else
              for (unsigned char ch : a->prompt) prompt.push_back(ch);  // byte-level ids
            model->to_device(dev);  // built and loaded on the host
            Generator gen(*model);
            auto show = [&](const std::vector<int32_t>& ids) {
              if (tok) return tok->decode(ids);
              std::string s;
              for (int32_t id : ids) s += std::to_string(id) + " ";
              return s;
            };
            const std::vector<int32_t> out = gen.generate(ctx, prompt, a->sampling);
            std::cout << show(prompt) << (tok ? "" : "| ") << show(out) << "\n";
            const GenerateStats& st = gen.stats();
            std::cerr << "generate on " << ctx.describe() << ": prompt " << st.prompt_tokens
                      << " tokens in " << st.prompt_seconds << " s (" << st.prompt_tokens_per_s()
                      << " tokens/s), generated " << st.generated << " tokens, " << st.decode_steps
                      << " decode steps in " << st.decode_seconds << " s ("
                      << st.decode_tokens_per_s() << " tokens/s)\n";
            return 0;
          }};
}

}  // namespace mt::cli
