#include <iostream>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "model/model.h"

namespace mt::cli {

Command add_info_command(CLI::App& app) {
  auto model = std::make_shared<std::string>("small");
  CLI::App* c = app.add_subcommand("info", "describe a model: layer pattern and parameter counts");
  c->add_option("model", *model, "preset (tiny, small, seed-2.8t) or config.json / model directory")
      ->capture_default_str();
  return {c, [model] {
            ModelConfig cfg = ModelConfig::load(*model);
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
            return 0;
          }};
}

}  // namespace mt::cli
