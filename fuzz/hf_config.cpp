// Fuzz target: an HF config.json (text) through the JSON parser and hf_config_from_json, which
// maps kimi_linear / deepseek_v3 / deepseek_v32 / moetrain configs onto ModelConfig.
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_target.h"
#include "io/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return mt::fuzz::run_one([&] {
    const nlohmann::json j =
        nlohmann::json::parse(reinterpret_cast<const char*>(data),
                              reinterpret_cast<const char*>(data) + size, nullptr, false);
    if (j.is_discarded()) return;  // not JSON: load_hf_config reports that as an IoError
    mt::hf_config_from_json(j, "fuzz");
    // The file path too (reading, parse errors naming the file).
    mt::load_hf_config(
        mt::fuzz::write_scratch("config.json", reinterpret_cast<const char*>(data), size));
  });
}
