#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "io/hf_names.h"
#include "train/answer_match.h"
#include "train/trainer.h"

namespace mt::cli {

namespace {
struct EvalArgs {
  std::string checkpoint, model;
  std::vector<std::string> data;  // name=dir
  int64_t batch = 2, max_sequences = 0;
  int threads = 0;
  bool exact_match = false;
};
}  // namespace

Command add_eval_command(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* c = app.add_subcommand("eval", "held-out loss and perplexity per corpus");
  add_checkpoint_or_model(c, a->checkpoint, a->model,
                          "HF model directory: evaluate its weights as shipped");
  c->add_option("--data", a->data, "NAME=DIR of a prepared dataset (repeatable)")->required();
  c->add_option("--batch", a->batch, "sequences per forward")->capture_default_str();
  c->add_option("--max-sequences", a->max_sequences, "per corpus (0: all)")->capture_default_str();
  c->add_option("--threads", a->threads, "CPU threads (0: all)")->capture_default_str();
  c->add_flag("--exact-match", a->exact_match,
              "also the share of answers (each document's target tokens) that greedy decoding "
              "reproduces exactly");
  return {
      c, [a] {
        need_checkpoint_or_model("eval", a->checkpoint, a->model);
        std::unique_ptr<Model> owned;
        uint64_t seed = 1;
        if (!a->model.empty()) {
          MT_CHECK(has_weights(a->model), IoError, "eval --model '", a->model,
                   "': no safetensors weights in it");
          owned =
              std::move(load_hf_model(a->model, {},
                                      progress_printer(std::cerr, a->model, isatty(fileno(stderr))))
                            .model);
        } else {
          CheckpointModel cm = load_checkpoint_model(a->checkpoint);
          seed = cm.job.seed;
          owned = std::move(cm.model);
        }
        Model& model = *owned;
        Context ctx(ContextOptions{.threads = a->threads, .seed = seed});
        AdamW opt(model.params(), {});
        LocalExecutor exec(ctx, model, opt);
        if (a->exact_match)
          std::printf("%-12s %10s %12s %10s %10s %12s\n", "corpus", "loss", "perplexity", "tokens",
                      "answers", "exact_match");
        else
          std::printf("%-12s %10s %12s %10s\n", "corpus", "loss", "perplexity", "tokens");
        for (const std::string& nd : a->data) {
          const size_t eq = nd.find('=');
          MT_CHECK(eq != std::string::npos, ValueError, "--data '", nd, "' must be NAME=DIR");
          const PackedData d = load_dataset(nd.substr(eq + 1));
          MT_CHECK(d.vocab <= model.config().vocab, ConfigError, "dataset ", nd, " has vocabulary ",
                   d.vocab, ", beyond the model's ", model.config().vocab);
          const EvalResult r = evaluate(exec, d, a->batch, a->max_sequences);
          if (r.tokens == 0) {  // nothing to score: say so rather than print a number
            std::printf("%-12s %10s %12s %10d\n", nd.substr(0, eq).c_str(), "absent", "absent", 0);
          } else if (a->exact_match) {
            const AnswerMatch m =
                answer_exact_match(exec, model, ctx, d, a->batch, a->max_sequences);
            std::printf("%-12s %10.4f %12.2f %10lld %10lld %12.4f\n", nd.substr(0, eq).c_str(),
                        r.loss, std::exp(r.loss), static_cast<long long>(r.tokens),
                        static_cast<long long>(m.answers), m.accuracy());
          } else {
            std::printf("%-12s %10.4f %12.2f %10lld\n", nd.substr(0, eq).c_str(), r.loss,
                        std::exp(r.loss), static_cast<long long>(r.tokens));
          }
        }
        return 0;
      }};
}

}  // namespace mt::cli
