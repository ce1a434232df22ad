#include <iostream>
#include <map>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "io/hf_names.h"
#include "model/model.h"
#include "plan/kernels.h"
#include "train/job.h"

namespace mt::cli {

Command add_info_command(CLI::App& app) {
  auto model = std::make_shared<std::string>("small");
  CLI::App* c = app.add_subcommand("info", "describe a model: layer pattern and parameter counts");
  auto* pos = c->add_option("model", *model,
                            "preset (tiny, small, seed-2.8t), config.json or HF model directory")
                  ->capture_default_str();
  c->add_option("--model", *model, "the same as the positional argument")->excludes(pos);
  auto device = std::make_shared<std::string>("auto");
  auto precision = std::make_shared<std::string>("");
  c->add_option("--device", *device, "cpu, cuda or auto: the device whose kernels are listed")
      ->capture_default_str();
  c->add_option("--precision", *precision,
                "fp32 or bf16 (default: bf16 on a GPU, fp32 on the CPU)");
  return {c, [model, device, precision] {
            const HfConfig hf = load_model_config(*model);
            const ModelConfig& cfg = hf.model;
            int64_t total = 0, expert = 0;
            for (const NamedSpec& s : model_param_specs(cfg)) {
              total += s.spec.shape.numel();
              if (s.spec.role == ParamRole::Expert) expert += s.spec.shape.numel();
            }
            // Layer pattern with runs collapsed: "kda+ffn kda+moe x2 dsa+moe ...".
            std::cout << "model " << *model << ": " << cfg.layers.size() << " layers:";
            for (size_t i = 0; i < cfg.layers.size();) {
              size_t j = i;
              auto same = [&](size_t a, size_t b) {
                return cfg.layers[a].mixer == cfg.layers[b].mixer &&
                       cfg.layers[a].ffn == cfg.layers[b].ffn;
              };
              while (j < cfg.layers.size() && same(i, j)) ++j;
              std::cout << " " << mixer_name(cfg.layers[i].mixer)
                        << (cfg.layers[i].ffn == FfnKind::Dense ? "+ffn" : "+moe");
              if (j - i > 1) std::cout << " x" << j - i;
              i = j;
            }
            std::cout << "\nparameters: " << total << " total, " << expert << " in routed experts, "
                      << total - expert << " other\n";
            if (hf.model_type != "moetrain_hybrid")
              std::cout << "family: " << hf.model_type << "\n";
            Job job;
            job.device = *device;
            const Device dev = job_device(job);
            const std::string prec =
                !precision->empty() ? *precision : (dev == Device::CUDA ? "bf16" : "fp32");
            {
              const Context ctx(ContextOptions{.device = dev});
              std::cout << "device: " << ctx.describe() << ", precision " << prec << "\n";
            }
            std::cout << plan::describe_kernels(
                cfg,
                plan::layer_kernels(
                    cfg, dev == Device::CUDA ? plan::Backend::Cuda : plan::Backend::Cpu, prec));
            if (has_weights(*model)) {
              // Headers only: shapes and dtypes as shipped, nothing decoded.
              const SafetensorsModel st(*model, fp8_blocks(hf));
              std::map<std::string, int64_t> dtypes;
              for (const std::string& n : st.names()) ++dtypes[st.entry(n).dtype];
              std::cout << "weights: " << st.names().size() << " tensors in " << st.file_count()
                        << " file(s), " << st.total_bytes() << " bytes;";
              for (const auto& [d, n] : dtypes)
                std::cout << " " << d << " x" << n << (d == "F8_E4M3" ? " (block-scaled)" : "");
              std::cout << "\n";
            }
            return 0;
          }};
}

}  // namespace mt::cli
