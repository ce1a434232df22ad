// The auto-tuner over real steps (train/tune.h) on the tiny model: every setting of a small grid
// measured, the job's own first, the fastest reported with its --set flags; a setting the engine
// refuses recorded and passed over; bad spaces refused before any trial; trials write no
// checkpoints and their metrics carry each step's time.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "harness/seed.h"
#include "harness/train_files.h"
#include "ops/kda.h"
#include "train/job.h"
#include "train/tune.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

// A tiny job (threads 1, no evaluation) and its file.
std::string write_job(const fs::path& root) {
  const std::string data = test::write_tiny_dataset(root / "train", test::case_seed(), 12);
  const std::string text = "[run]\ndir = \"" + (root / "run").string() +
                           "\"\nthreads = 1\n[model]\nconfig = \"tiny\"\n[data]\ntrain = \"" +
                           data +
                           "\"\n[schedule]\nsteps = 50\nwarmup = 5\n[train]\nbatch = 2\n"
                           "[log]\nprogress = \"off\"\n";
  const fs::path job = root / "job.toml";
  std::ofstream(job) << text;
  return job.string();
}

TEST(TuneJob, MeasuresEverySettingOfASmallGridAndKeepsTheFastest) {
  const fs::path root = test::temp_dir("tune");
  const std::string job = write_job(root);
  const TuneOptions opt{.space = "run.threads=1,2;train.recompute=none,full",
                        .trials = 10,
                        .steps = 2,
                        .warmup = 1,
                        .initial = 1,
                        .min_gain = 0,
                        .seed = test::case_seed(),
                        .work_dir = (root / "trials").string()};
  std::ostringstream log;
  const TuneResult r = tune_job(job, {}, opt, log);
  ASSERT_EQ(r.trials.size(), 4u) << log.str();
  EXPECT_EQ(r.stopped, "exhausted");
  // The job's own settings first: threads 1, recompute none.
  EXPECT_EQ(r.trials[0].index, 0);
  EXPECT_EQ(r.trials[0].overrides,
            (std::vector<std::string>{"run.threads=1", "train.recompute=none"}));
  std::set<int64_t> seen;
  for (const TuneTrial& t : r.trials) {
    EXPECT_TRUE(t.error.empty()) << t.error;
    EXPECT_GT(t.step_seconds, 0);
    EXPECT_GT(t.tokens_per_s, 0);
    seen.insert(t.index);
  }
  EXPECT_EQ(seen.size(), 4u);
  ASSERT_GE(r.best, 0);
  for (const TuneTrial& t : r.trials)
    EXPECT_LE(r.trials[static_cast<size_t>(r.best)].step_seconds, t.step_seconds);
  const std::string out = log.str();
  EXPECT_NE(out.find("use: --set " + r.trials[static_cast<size_t>(r.best)].overrides[0]),
            std::string::npos)
      << out;
  const nlohmann::json j = r.to_json();
  EXPECT_EQ(j["trials"].size(), 4u);
  EXPECT_TRUE(j.contains("best"));
  EXPECT_GE(j["speedup_over_own"].get<double>(), 1.0);
  // Each trial ran warmup + steps steps, logged their times and saved nothing; the job's own run
  // directory was never touched.
  for (size_t i = 0; i < 4; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "trial_%03zu", i);
    std::ifstream metrics(root / "trials" / name / "metrics.jsonl");
    int lines = 0;
    for (std::string l; std::getline(metrics, l);) {
      const nlohmann::json m = nlohmann::json::parse(l);
      if (!m.contains("loss")) continue;
      EXPECT_GT(m["step_seconds"].get<double>(), 0);
      ++lines;
    }
    EXPECT_EQ(lines, 3) << name;
    const fs::path ck = root / "trials" / name / "checkpoints";
    EXPECT_TRUE(!fs::exists(ck) || fs::is_empty(ck)) << name;
  }
  EXPECT_FALSE(fs::exists(root / "run" / "metrics.jsonl"));
  // The confirmation: the job's own settings and the best once more each, unless the best is the
  // job's own; the speedup is the ratio of the two settings' means.
  if (r.best > 0) {
    ASSERT_EQ(r.confirm_own.size(), 2u);
    ASSERT_EQ(r.confirm_best.size(), 2u);
    EXPECT_EQ(r.confirm_own[0], r.trials[0].step_seconds);
    EXPECT_NEAR(r.confirmed_speedup,
                (r.confirm_own[0] + r.confirm_own[1]) / (r.confirm_best[0] + r.confirm_best[1]),
                1e-12);
    EXPECT_TRUE(fs::exists(root / "trials" / "trial_005" / "metrics.jsonl"));
    EXPECT_TRUE(j.contains("confirmed"));
  } else {
    EXPECT_EQ(r.confirmed_speedup, 0.0);
    EXPECT_FALSE(fs::exists(root / "trials" / "trial_004"));
  }
}

TEST(TuneJob, ASettingTheEngineRefusesIsRecordedAndPassedOver) {
  const fs::path root = test::temp_dir("tune_refused");
  const std::string job = write_job(root);
  // bf16 parses as a job value but the CPU engine refuses to train it.
  const TuneOptions opt{.space = "model.precision=fp32,bf16",
                        .trials = 5,
                        .steps = 1,
                        .warmup = 0,
                        .initial = 0,
                        .min_gain = 0};
  std::ostringstream log;
  const TuneResult r = tune_job(job, {"run.device=\"cpu\""}, opt, log);
  ASSERT_EQ(r.trials.size(), 2u) << log.str();
  EXPECT_TRUE(r.trials[0].error.empty()) << r.trials[0].error;
  EXPECT_NE(r.trials[1].error.find("model.precision"), std::string::npos) << r.trials[1].error;
  EXPECT_EQ(r.best, 0);
  EXPECT_NE(log.str().find("failed: "), std::string::npos);
}

TEST(TuneJob, TheJobsOwnSettingsOutsideTheGridAreMeasuredFirst) {
  const fs::path root = test::temp_dir("tune_outside");
  const std::string job = write_job(root);
  const TuneOptions opt{
      .space = "run.threads=2", .trials = 5, .steps = 1, .warmup = 0, .confirm = false};
  std::ostringstream log;
  const TuneResult r = tune_job(job, {}, opt, log);
  ASSERT_EQ(r.trials.size(), 2u) << log.str();
  EXPECT_EQ(r.trials[0].index, -1);
  EXPECT_TRUE(r.trials[0].overrides.empty());
  EXPECT_EQ(r.trials[1].overrides, std::vector<std::string>{"run.threads=2"});
  EXPECT_NE(log.str().find("lie outside them"), std::string::npos);
  EXPECT_EQ(r.confirmed_speedup, 0.0);  // --no-confirm
  EXPECT_EQ(log.str().find("confirming"), std::string::npos);
}

// --space auto on the CPU: recompute and threads (powers of two up to the cores), no GPU kernels;
// on a mesh of 4 also all-to-all chunks and the EP sizes that divide the world and the experts;
// and a tuning over it runs.
TEST(TuneJob, AutoSpaceFitsTheDeviceAndTheMesh) {
  const fs::path root = test::temp_dir("tune_auto");
  const std::string path = write_job(root);
  const Job job = Job::load(path, {"run.device=\"cpu\""});
  const std::string one = auto_tune_space(job, 1);
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  EXPECT_EQ(one.find("train.recompute=none,selective,full;run.threads=1"), 0u) << one;
  EXPECT_NE(one.find(cat(",", cores)), std::string::npos) << one;
  EXPECT_EQ(one.find("kernels.grouped_gemm"), std::string::npos) << one;
  EXPECT_EQ(one.find("kernels.kda"), std::string::npos) << one;
  // What a GPU run would add for the KDA layers: every choice a value the job takes, none twice.
  std::set<std::string> kda_names;
  for (const char* k : kAutoKdaKernels) {
    const Job with = Job::load(path, {"run.device=\"cpu\"", cat("kernels.kda=\"", k, "\"")});
    kda_names.insert(ops::kda_kernels_name(job_model_config(with).kda.kernels));
  }
  EXPECT_EQ(kda_names.size(), std::size(kAutoKdaKernels));
  EXPECT_EQ(one.find("parallel."), std::string::npos) << one;
  const std::string mesh = auto_tune_space(job, 4);
  const int64_t experts = job_model_config(job).moe.num_experts;
  std::string eps;
  for (int e : {1, 2, 4})
    if (experts % e == 0) {
      if (!eps.empty()) eps += ",";
      eps += std::to_string(e);
    }
  EXPECT_NE(mesh.find(cat(";parallel.a2a_chunks=1,2,4;parallel.ep=", eps)), std::string::npos)
      << mesh;
  std::ostringstream log;
  const TuneResult r = tune_job(path, {"run.device=\"cpu\""},
                                {.space = "auto", .trials = 2, .steps = 1, .warmup = 0}, log);
  EXPECT_EQ(r.trials.size(), 2u) << log.str();
  EXPECT_NE(log.str().find("(train.recompute=none,selective,full;run.threads="), std::string::npos)
      << log.str();
}

TEST(TuneJob, BadSpacesFailBeforeAnyTrial) {
  const fs::path root = test::temp_dir("tune_bad");
  const std::string job = write_job(root);
  std::ostringstream log;
  const auto fails = [&](const std::string& space, const std::string& says) {
    TuneOptions opt{.space = space, .work_dir = (root / "trials").string()};
    try {
      tune_job(job, {}, opt, log);
      ADD_FAILURE() << space << ": no error";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << space << ": " << e.what();
    }
  };
  fails("run.threads=1,two", "run.threads");
  fails("run.nonsense=1", "run.nonsense");
  fails("run.threads", "not key=value");
  EXPECT_FALSE(fs::exists(root / "trials"));
  EXPECT_TRUE(log.str().empty());
}

}  // namespace
}  // namespace mt
