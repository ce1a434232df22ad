// Degenerate inputs get an explicit answer, never a made-up figure (docs/reliability.md, "Inputs"):
// documents too short to have a target, empty datasets and batches, held-out data without a
// target token (loss absent, not 0), and LoRA targets or train globs that select nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "harness/seed.h"
#include "harness/train_files.h"
#include "train/dataset.h"
#include "train/demo.h"
#include "train/job.h"
#include "train/trainer.h"

namespace fs = std::filesystem;
using namespace mt;

namespace {

using test::temp_dir;

const Tokenizer& tokenizer() {
  static const Tokenizer tok = [] {
    std::vector<std::string> texts;
    for (const Document& d :
         read_corpus({.inputs = {"/usr/share/games/fortunes/computers"}, .separator = "%"}))
      texts.push_back(d.text);
    return Tokenizer::train(texts, {.vocab = 400});
  }();
  return tok;
}

// Random ids for the tiny model (vocab 61) whose targets are all masked (prompt tokens).
PackedData masked_data(uint64_t seed) {
  Rng rng(seed);
  PackedData p{.seq_len = 12, .vocab = 61, .documents = 3};
  for (int s = 0; s < 3; ++s) {
    p.segments.push_back({5, 7});
    for (int64_t t = 0; t < p.seq_len; ++t) {
      p.ids.push_back(static_cast<int32_t>(rng.below(61)));
      p.targets.push_back(kIgnoreIndex);
    }
  }
  return p;
}

template <typename E>
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(Degenerate, DocumentsTooShortForATargetAreSkippedAndOnlySuchIsAnError) {
  const Tokenizer& tok = tokenizer();
  // An empty text is just the end-of-document token: no pair (input, next token) to learn from.
  const PackedData p = pack_documents({{.text = ""}, {.text = "a fortune"}, {.text = ""}}, tok, 16);
  EXPECT_EQ(p.documents, 1);
  EXPECT_GT(p.target_tokens(), 0);
  EXPECT_NE(error_of<ValueError>([&] {
              pack_documents({{.text = ""}, {.text = ""}}, tok, 16);
            }),
            "(no error)");
}

TEST(Degenerate, EmptyDatasetAndEmptyBatchAreErrors) {
  const fs::path dir = temp_dir("empty");
  std::ofstream(dir / "index.json")
      << R"({"format": "moetrain-tokens-v1", "seq_len": 8, "vocab_size": 61, "documents": 0,
             "sequences": 0, "segments": [], "shards": []})";
  EXPECT_NE(error_of<IoError>([&] { load_dataset(dir.string()); }).find("holds no sequence"),
            std::string::npos);
  const PackedData p = masked_data(test::test_seed());
  EXPECT_NE(error_of<ValueError>([&] { make_batch(p, {}); }).find("at least one sequence"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(Degenerate, HeldOutDataWithoutTargetsHasAnAbsentLossNotZero) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE(test::seed_note());
  const PackedData held = masked_data(seed);
  Model model(ModelConfig::load("tiny"), seed);
  Context ctx(ContextOptions{.threads = 1, .seed = seed});
  AdamW opt(model.params(), {});
  LocalExecutor exec(ctx, model, opt);
  const EvalResult r = evaluate(exec, held, 2, 0);
  EXPECT_EQ(r.tokens, 0);
  EXPECT_TRUE(std::isnan(r.loss)) << r.loss;
  // The same data with one real target scores exactly that token.
  PackedData one = held;
  one.targets[4] = 7;
  const EvalResult r1 = evaluate(exec, one, 2, 0);
  EXPECT_EQ(r1.tokens, 1);
  EXPECT_TRUE(std::isfinite(r1.loss) && r1.loss > 0);
  // The unigram baseline, likewise.
  EXPECT_TRUE(std::isnan(unigram_baseline(one, held)));
  EXPECT_TRUE(std::isfinite(unigram_baseline(one, one)));
}

TEST(Degenerate, LoraTargetOrTrainGlobMatchingNothingIsAConfigError) {
  const fs::path dir = temp_dir("lora");
  // `tiny` without its dense first layer: every FFN is an MoE, so "dense_ffn" selects nothing.
  nlohmann::json c = ModelConfig::load("tiny").to_json();
  c["first_k_dense_replace"] = 0;
  std::ofstream(dir / "config.json") << c.dump();
  auto job = [&](const std::string& lora) {
    return Job::parse("[data]\ntrain = \"d\"\n[model]\nconfig = \"" +
                          (dir / "config.json").string() + "\"\n[lora]\n" + lora + "\nrank = 2\n",
                      "j.toml");
  };
  EXPECT_NO_THROW(job_model_config(job("targets = [\"kda\", \"routed_experts\"]")));
  const std::string e =
      error_of<ConfigError>([&] { job_model_config(job("targets = [\"kda\", \"dense_ffn\"]")); });
  EXPECT_NE(e.find("lora.targets: 'dense_ffn' matches no module"), std::string::npos) << e;
  const std::string g = error_of<ConfigError>([&] {
    job_model_config(job("targets = [\"kda\"]\ntrain = [\"model.norm.weight\", \"model.nrom.*\"]"));
  });
  EXPECT_NE(g.find("lora.train: pattern 'model.nrom.*' matches no parameter"), std::string::npos)
      << g;
  fs::remove_all(dir);
}

// A training step whose micro-batches hold no target token (a prompt longer than whole
// sequences) has no loss: metrics.jsonl writes null and the progress line says so, never 0. It is
// no fault either: under the default train.nonfinite = "stop" the run goes on to the end.
// Four sequences, batch 2, four steps: two epochs, so the one sequence with targets is drawn
// exactly twice and exactly two steps have a loss.
TEST(Degenerate, TrainingStepWithoutTargetsLogsItsLossAsAbsentNotZero) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE(test::seed_note());
  const fs::path dir = temp_dir("step");
  PackedData p = masked_data(seed);
  p.segments.push_back({12});
  for (int64_t t = 0; t < p.seq_len; ++t) {
    p.ids.push_back(static_cast<int32_t>(t % 61));
    p.targets.push_back(kIgnoreIndex);
  }
  const PackedData none = p;
  for (int64_t t = 12; t < 24; ++t)
    p.targets[static_cast<size_t>(t)] = static_cast<int32_t>(t % 61);
  auto train = [&](const PackedData& d, const std::string& name) {
    write_dataset(d, (dir / name).string());
    const Job job = Job::parse(
        "[run]\nthreads = 1\n[model]\nconfig = \"tiny\"\n[data]\ntrain = \"" +
            (dir / name).string() +
            "\"\n[schedule]\nsteps = 4\nwarmup = 1\n[train]\nbatch = 2\n[checkpoint]\nevery = 0\n"
            "[log]\nprogress = \"plain\"\n",
        "j.toml", {"run.dir=\"" + (dir / (name + "_run")).string() + "\""});
    std::ostringstream log;
    const TrainResult r = run_job(job, {}, log);
    std::vector<nlohmann::json> lines;
    std::ifstream in(dir / (name + "_run") / "metrics.jsonl");
    for (std::string l; std::getline(in, l);)
      if (const auto j = nlohmann::json::parse(l); j.contains("loss")) lines.push_back(j);
    EXPECT_EQ(lines.size(), 4u);
    EXPECT_EQ(r.skipped_steps, 0);
    return std::make_tuple(r, lines, log.str());
  };
  const auto [r0, lines0, log0] = train(none, "none");
  ASSERT_EQ(r0.losses.size(), 4u);
  for (size_t i = 0; i < lines0.size(); ++i) {
    EXPECT_TRUE(std::isnan(r0.losses[i])) << r0.losses[i];
    EXPECT_TRUE(lines0[i].at("loss").is_null()) << lines0[i].dump();
    EXPECT_TRUE(lines0[i].at("loss_per_corpus").at("train").is_null()) << lines0[i].dump();
  }
  EXPECT_NE(log0.find("loss absent"), std::string::npos) << log0;
  EXPECT_EQ(log0.find("loss nan"), std::string::npos) << log0;
  EXPECT_EQ(log0.find("loss 0.0000"), std::string::npos) << log0;
  const auto [r1, lines1, log1] = train(p, "one");
  int with_loss = 0;
  for (size_t i = 0; i < lines1.size(); ++i) {
    const bool has = !lines1[i].at("loss").is_null();
    with_loss += has;
    EXPECT_EQ(has, std::isfinite(r1.losses[i]));
    if (has) {
      EXPECT_GT(lines1[i].at("loss").get<double>(), 0.5);
    }
  }
  EXPECT_EQ(with_loss, 2);
  fs::remove_all(dir);
}

// The demo on corpora too small for its three splits: an error naming the empty split and the
// option that gives more (before any tokenizer is trained), not a packing error later.
TEST(Degenerate, DemoOnTooLittleCodeNamesTheEmptySplitAndTheOption) {
  const fs::path root = temp_dir("demo_small");
  fs::create_directories(root / "code");
  fs::create_directories(root / "prose");
  for (const char* f : {"a.py", "b.py"}) std::ofstream(root / "code" / f) << "def f():\n  pass\n";
  std::ofstream prose(root / "prose" / "quotes");
  for (int i = 0; i < 200; ++i) prose << "saying number " << i << "\n%\n";
  prose.close();
  std::ostringstream log;
  try {
    run_demo({.code_dir = (root / "code").string(),
              .prose_dir = (root / "prose").string(),
              .work_dir = (root / "work").string()},
             log);
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("demo: the code "), std::string::npos) << m;
    EXPECT_NE(m.find("split holds no document"), std::string::npos) << m;
    EXPECT_NE(m.find("--code-bytes"), std::string::npos) << m;
  }
  EXPECT_FALSE(fs::exists(root / "work" / "tokenizer.model"));
}
