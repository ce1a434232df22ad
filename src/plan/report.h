// Human-readable and machine-readable renderings of a search: the `moetrain plan` table, its
// JSON, and the Markdown that docs/seed-scale.md is generated from.
#pragma once

#include <ostream>
#include <string>

#include "plan/kernels.h"
#include "plan/search.h"

namespace mt::plan {

struct PlanRequest {
  std::string model_name;
  ModelConfig cfg;  // with the LoRA adapters applied
  int64_t world = 1;
  Hardware hw;
  SearchOptions options;
  Backend backend = Backend::Cuda;
};

struct PlanReport {
  PlanRequest request;
  SearchResult result;
  std::vector<KernelChoice> kernels;
};

PlanReport run_plan(const PlanRequest& req);

void print_text(std::ostream& os, const PlanReport& r);
void print_markdown(std::ostream& os, const PlanReport& r);
nlohmann::json report_json(const PlanReport& r);

// Devices of `mem_bytes` needed just to hold one copy of the weights at `bytes_per_param`.
int64_t devices_for_weights(int64_t params, double bytes_per_param, double mem_bytes);

}  // namespace mt::plan
