#include "train/bench_decode.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <vector>

#include "decode/decode.h"
#include "model/model.h"
#include "train/bench_setup.h"

namespace mt {

namespace {

int32_t argmax(const Tensor& logits) {
  const float* p = logits.f32();
  return static_cast<int32_t>(std::max_element(p, p + logits.numel()) - p);
}

struct DecodeRun {
  double prompt_s = 0, decode_s = 0;
  std::vector<int32_t> ids;  // the greedy tokens
};

// The prompt in one step (its last row's logits), then o.tokens greedy single-token steps; the
// logits come back to the host every step, as in `generate`.
DecodeRun decode(Context& ctx, Model& model, const DecodeBenchOptions& o, const Tensor& prompt,
                 const DecoderOptions& dopt) {
  Decoder dec(model, o.prompt + o.tokens + 1, dopt);
  Tensor row = Tensor::empty({1, model.config().vocab}), one = Tensor::empty({1}, DType::I32);
  DecodeRun r;
  auto t0 = std::chrono::steady_clock::now();
  dec.step(ctx, prompt, row);
  r.prompt_s = seconds_since(t0);  // the step ends with the logits on the host
  t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < o.tokens; ++i) {
    one.i32()[0] = argmax(row);
    r.ids.push_back(one.i32()[0]);
    dec.step(ctx, one, row);
  }
  r.decode_s = seconds_since(t0);
  return r;
}

}  // namespace

nlohmann::json run_decode_bench(const DecodeBenchOptions& o, std::ostream& log) {
  MT_CHECK(o.prompt > 0 && o.tokens > 0 && o.workspace_gib > 0, ValueError, "bench decode: prompt ",
           o.prompt, ", tokens ", o.tokens, ", workspace_gib ", o.workspace_gib,
           " must be positive");
  const auto [device, cfg, mopt] =
      bench_model(bench_job(o.model, o.precision, o.device), "bench decode");
  Context ctx(ContextOptions{
      .device = device,
      .seed = o.seed,
      .workspace_bytes = static_cast<size_t>(o.workspace_gib * double(size_t(1) << 30))});
  log << "device: " << ctx.describe() << "\n";
  auto t0 = std::chrono::steady_clock::now();
  Model model(cfg, o.seed, mopt);
  log << "model built in " << seconds_since(t0) << " s: " << model.params().count()
      << " parameters\n";
  Tensor prompt = Tensor::empty({o.prompt}, DType::I32);
  Rng rng(o.seed);
  random_ids(prompt, cfg.vocab, rng);

  // A short untimed run first: kernels loaded, arenas and staging buffers sized.
  DecodeBenchOptions warm = o;
  warm.tokens = std::min<int64_t>(o.tokens, 4);
  (void)decode(ctx, model, warm, prompt, {});
  (void)decode(ctx, model, warm, prompt, {.kda_recurrent_max = 0});

  nlohmann::json j;
  j["bench"] = "decode";
  j["model"] = o.model;
  j["device"] = ctx.describe();
  j["precision"] = o.precision;
  j["params"] = model.params().count();
  j["prompt_tokens"] = o.prompt;
  j["decode_tokens"] = o.tokens;
  std::vector<int32_t> first;
  for (const auto& [name, max] :
       {std::pair<const char*, int64_t>{"recurrent", DecoderOptions{}.kda_recurrent_max},
        {"chunked", 0}}) {
    const DecodeRun r = decode(ctx, model, o, prompt, {.kda_recurrent_max = max});
    const double tok_s = static_cast<double>(o.tokens) / r.decode_s;
    log << "bench decode, KDA " << name << ": prompt " << o.prompt << " tokens in " << r.prompt_s
        << " s, " << o.tokens << " tokens at " << tok_s << " tokens/s\n";
    j["runs"].push_back({{"kda_step", name},
                         {"prompt_s", r.prompt_s},
                         {"prompt_tokens_per_s", static_cast<double>(o.prompt) / r.prompt_s},
                         {"decode_s", r.decode_s},
                         {"decode_tokens_per_s", tok_s},
                         {"ms_per_token", 1e3 * r.decode_s / static_cast<double>(o.tokens)}});
    if (first.empty()) {
      first = r.ids;
    } else {
      // Greedy ids agree until the paths' rounding differences meet a near-tie of the logits.
      int64_t same = 0;
      while (same < o.tokens &&
             first[static_cast<size_t>(same)] == r.ids[static_cast<size_t>(same)])
        ++same;
      j["greedy_ids_agree_for"] = same;
    }
  }
  return j;
}

}  // namespace mt
