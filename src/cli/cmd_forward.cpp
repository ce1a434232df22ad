#include <iostream>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "model/hf_forward.h"

namespace mt::cli {

Command add_forward_command(CLI::App& app) {
  struct Opts {
    std::string model, tokens, out;
    bool grads = false;
    int threads = 0;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand(
      "forward", "logits, loss and (--grads) HF-named gradients of a model on given token ids");
  c->add_option("--model", o->model, "model directory (config.json + safetensors)")->required();
  c->add_option("--tokens", o->tokens, "safetensors file with int tensor input_ids [B, T]")
      ->required();
  c->add_option("--out", o->out, "output safetensors: logits [B,T,V], loss [], gradients")
      ->required();
  c->add_flag("--grads", o->grads, "also write every parameter's gradient under its HF name");
  c->add_option("--threads", o->threads, "CPU threads (0: all)");
  return {c, [o] {
            LoadedModel lm = load_hf_model(o->model);
            SafetensorsData in = read_safetensors(o->tokens);
            auto it = in.tensors.find("input_ids");
            MT_CHECK(it != in.tensors.end(), IoError, o->tokens, ": no tensor 'input_ids'");
            Context ctx(ContextOptions{.threads = o->threads});
            HfForwardResult r = hf_forward(ctx, lm, it->second, o->grads);
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
