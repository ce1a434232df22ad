#include "train/demo.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "model/model.h"
#include "train/adamw.h"

namespace mt {

namespace {

std::vector<uint8_t> read_corpus(const std::string& dir) {
  namespace fs = std::filesystem;
  MT_CHECK(fs::is_directory(dir), IoError, "demo corpus directory '", dir, "' does not exist");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());  // the same corpus order on every machine
  std::vector<uint8_t> bytes;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    bytes.insert(bytes.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  MT_CHECK(bytes.size() > 4096, IoError, "demo corpus in '", dir, "' is too small (", bytes.size(),
           " bytes)");
  return bytes;
}

// Fills ids/targets with `batch` windows of seq+1 bytes starting at the given offsets.
void fill_batch(const std::vector<uint8_t>& text, const std::vector<size_t>& starts, int64_t seq,
                Tensor& ids, Tensor& targets) {
  for (size_t b = 0; b < starts.size(); ++b)
    for (int64_t t = 0; t < seq; ++t) {
      ids.i32()[static_cast<int64_t>(b) * seq + t] = text[starts[b] + static_cast<size_t>(t)];
      targets.i32()[static_cast<int64_t>(b) * seq + t] =
          text[starts[b] + static_cast<size_t>(t) + 1];
    }
}

double evaluate(Context& ctx, Model& model, const std::vector<uint8_t>& held,
                const DemoOptions& o) {
  SeqInfo seq = SeqInfo::uniform(1, o.seq);
  Tensor ids = Tensor::empty({o.seq}, DType::I32), targets = Tensor::empty({o.seq}, DType::I32);
  size_t span = held.size() - static_cast<size_t>(o.seq) - 1;
  double sum = 0;
  for (int64_t w = 0; w < o.eval_windows; ++w) {
    fill_batch(held, {span * static_cast<size_t>(w) / static_cast<size_t>(o.eval_windows)}, o.seq,
               ids, targets);
    sum += model.forward(ctx, seq, ids, targets);
  }
  return sum / static_cast<double>(o.eval_windows);
}

}  // namespace

DemoResult run_demo(const DemoOptions& o, std::ostream& log) {
  MT_CHECK(o.steps > 0 && o.batch > 0 && o.seq > 1, ValueError,
           "demo needs steps, batch > 0 and seq > 1");
  ModelConfig cfg = ModelConfig::load(o.model);
  MT_CHECK(cfg.vocab >= 256, ConfigError, "the byte-level demo needs vocab_size >= 256, model has ",
           cfg.vocab);
  std::vector<uint8_t> text = read_corpus(o.corpus_dir);
  size_t split = text.size() * 9 / 10;
  std::vector<uint8_t> train(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(split));
  std::vector<uint8_t> held(text.begin() + static_cast<std::ptrdiff_t>(split), text.end());
  MT_CHECK(held.size() > static_cast<size_t>(o.seq) + 1, ValueError, "seq ", o.seq,
           " too long for the corpus");

  Context ctx(ContextOptions{.threads = o.threads, .seed = o.seed});
  Model model(cfg, o.seed);
  AdamW opt(model.params(), AdamWOptions{.weight_decay = 0.01f});
  log << "moetrain demo: model " << o.model << " (" << cfg.layers.size() << " layers, "
      << model.params().count() / 1000 << "k parameters), corpus " << o.corpus_dir << " ("
      << train.size() << " train / " << held.size() << " held-out bytes), " << o.steps
      << " steps of " << o.batch << "x" << o.seq << " tokens, " << ctx.threads() << " threads\n";

  DemoResult r;
  r.eval_before = evaluate(ctx, model, held, o);
  log << "held-out loss before training: " << r.eval_before << "\n";

  SeqInfo seq = SeqInfo::uniform(o.batch, o.seq);
  Tensor ids = Tensor::empty({seq.tokens}, DType::I32),
         targets = Tensor::empty({seq.tokens}, DType::I32);
  Rng data_rng = ctx.rng().fork(17);
  const bool tty = isatty(fileno(stdout));
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t step = 1; step <= o.steps; ++step) {
    std::vector<size_t> starts;
    for (int64_t b = 0; b < o.batch; ++b)
      starts.push_back(
          static_cast<size_t>(data_rng.below(static_cast<int64_t>(train.size()) - o.seq - 1)));
    fill_batch(train, starts, o.seq, ids, targets);
    model.params().zero_grad();
    double loss = model.forward(ctx, seq, ids, targets);
    model.backward(ctx);
    // Linear warm-up, then cosine decay to 10%.
    double frac = static_cast<double>(step - o.warmup) /
                  static_cast<double>(std::max<int64_t>(1, o.steps - o.warmup));
    double lr = step <= o.warmup ? o.lr * static_cast<double>(step) / static_cast<double>(o.warmup)
                                 : o.lr * (0.1 + 0.45 * (1 + std::cos(3.141592653589793 * frac)));
    double gnorm = opt.step(ctx, model.params(), static_cast<float>(lr));
    if (step == 1) r.first_loss = loss;
    r.last_loss = loss;
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.tokens_per_s = static_cast<double>(step * seq.tokens) / secs;
    double eta = secs / static_cast<double>(step) * static_cast<double>(o.steps - step);
    char line[200];
    std::snprintf(line, sizeof line,
                  "step %4lld/%lld  loss %.4f  grad-norm %.3f  lr %.2e  %.0f tok/s  eta %.0fs",
                  static_cast<long long>(step), static_cast<long long>(o.steps), loss, gnorm, lr,
                  r.tokens_per_s, eta);
    if (tty) {
      log << "\r" << line << std::flush;
      if (step == o.steps) log << "\n";
    } else {
      log << line << "\n";
    }
  }
  r.eval_after = evaluate(ctx, model, held, o);
  log << "held-out loss after training: " << r.eval_after << " (before " << r.eval_before << ")\n";
  return r;
}

}  // namespace mt
