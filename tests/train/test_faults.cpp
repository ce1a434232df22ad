// Faults (docs/reliability.md, "Faults"): checkpoints survive SIGKILL at any byte of a save and
// at random times, saving over the step `latest` names never leaves it naming a missing
// directory, a full disk fails the save naming the file under either checkpoint.on_error policy,
// a NaN loss or gradient is caught before the optimizer step under either train.nonfinite
// policy, and a stopped-and-resumed run equals an uninterrupted one bitwise in every state
// (weights, AdamW moments, step counts, RNG, data position). The kills run the real command
// (MT_CLI) in a child process; every randomised choice prints its seed.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "harness/seed.h"
#include "harness/train_files.h"
#include "train/checkpoint.h"
#include "train/dataset.h"
#include "train/files.h"
#include "train/job.h"
#include "train/trainer.h"

extern char** environ;

namespace fs = std::filesystem;
using namespace mt;

namespace {

using test::temp_dir;

// A job file for the tiny model; every test's runs differ only in run.dir and the overrides. Its
// run seed and data are the test's fresh draw (case_seed: alike at every call within the test; the
// run seed shifted into a non-negative TOML integer).
fs::path write_job(const fs::path& root, int64_t steps, int64_t every) {
  const fs::path f = root / "job.toml";
  std::ofstream(f) << "[run]\nseed = " << (test::case_seed() >> 1)
                   << "\nthreads = 1\n[model]\nconfig = \"tiny\"\n[data]\ntrain = \""
                   << test::write_tiny_dataset(root / "train", test::case_seed() + 1, 16, {12, 12})
                   << "\"\n[optim]\nlr = 0.01\n[schedule]\nsteps = " << steps
                   << "\nwarmup = 2\n[train]\nbatch = 2\ngrad_accum = 2\n[checkpoint]\n"
                   << "every = " << every << "\nkeep = 100\n[log]\nprogress = \"off\"\n";
  return f;
}

// Starts `moetrain train` (the real command) with extra environment; returns its pid.
pid_t start_cli(const fs::path& job, const fs::path& run, const std::vector<std::string>& extra,
                const std::vector<std::string>& env_extra) {
  std::vector<std::string> args = {MT_CLI,       "train", "--job",
                                   job.string(), "--set", "run.dir=\"" + run.string() + "\""};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e)
    if (std::string(*e).rfind("MOETRAIN_FAULT_", 0) != 0) env.emplace_back(*e);
  env.insert(env.end(), env_extra.begin(), env_extra.end());
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  for (auto& e : env) envp.push_back(e.data());
  argv.push_back(nullptr);
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  const std::string log = (run.parent_path() / (run.filename().string() + ".log")).string();
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, MT_CLI, &fa, nullptr, argv.data(), envp.data()), 0);
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

int wait_status(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

void run_cli_ok(const fs::path& job, const fs::path& run, const std::vector<std::string>& extra) {
  const int st = wait_status(start_cli(job, run, extra, {}));
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
      << "moetrain train failed; see " << run.string() << ".log";
}

// Every state a checkpoint holds, byte for byte: weights, AdamW moments (and their step count),
// the step, data position and RNG (state.json). The schedule is a function of the step.
void expect_same_state(const fs::path& want, const fs::path& got) {
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "state.json"}) {
    ASSERT_TRUE(fs::is_regular_file(got / f)) << (got / f).string();
    EXPECT_TRUE(read_file(want / f) == read_file(got / f))
        << f << " of " << got.string() << " differs from " << want.string();
  }
}

std::string step_dir(int64_t s) {
  char b[32];
  std::snprintf(b, sizeof b, "step_%08lld", static_cast<long long>(s));
  return b;
}

// The bytes a save writes, in order (train/faults.h counts them so).
int64_t save_bytes(const fs::path& ck) {
  int64_t n = 0;
  for (const char* f :
       {"model.safetensors", "optimizer.safetensors", "state.json", "job.toml", "manifest.json"})
    n += static_cast<int64_t>(fs::file_size(ck / f));
  return n + static_cast<int64_t>(step_dir(0).size()) + 1;  // + `latest`
}

// `latest` names a complete checkpoint (its manifest verifies) that loads into the model.
fs::path expect_loadable_latest(const fs::path& root) {
  const std::string dir = latest_checkpoint(root.string());
  EXPECT_FALSE(dir.empty()) << "no latest under " << root.string();
  if (dir.empty()) return {};
  Model m(ModelConfig::load("tiny"), 1);
  AdamW opt(m.params(), {});
  EXPECT_NO_THROW(load_checkpoint(dir, m, &opt)) << dir;
  return dir;
}

}  // namespace

// SIGKILL at >= 20 byte offsets of the step-4 save (inside the weights' header and tensor data,
// the moments, every JSON file, `latest`) and at its named points; after each, `latest` names a
// complete checkpoint and resuming from it ends bitwise equal to the uninterrupted run.
TEST(Faults, KillAtAnyByteOfASaveResumesBitExact) {
  const fs::path root = temp_dir("bytes");
  const fs::path job = write_job(root, 6, 2);
  // Every run, the reference too, runs in the same directory: the saved job.toml names it, and
  // the manifest's checksum of job.toml is unpadded hex, so another name could shorten the save
  // by a byte and move the kill at `total - 1` past its end (the run then exits 0, unkilled).
  const fs::path run = root / "run";
  run_cli_ok(job, run, {});
  fs::rename(run, root / "ref");
  fs::rename(root / "run.log", root / "ref.log");
  const fs::path ref = root / "ref" / "checkpoints";
  const fs::path ck4 = ref / step_dir(4);
  const int64_t total = save_bytes(ck4);
  const int64_t model = static_cast<int64_t>(fs::file_size(ck4 / "model.safetensors"));
  const int64_t optim = static_cast<int64_t>(fs::file_size(ck4 / "optimizer.safetensors"));
  std::vector<int64_t> offsets = {0,
                                  1,
                                  7,
                                  8,
                                  40,
                                  model / 2,
                                  model - 1,
                                  model,
                                  model + 9,
                                  model + optim / 3,
                                  model + optim - 1,
                                  model + optim,
                                  model + optim + 17,
                                  total - 40,
                                  total - 12,
                                  total - 1};
  SCOPED_TRACE(test::seed_note() + " (offsets drawn from it)");
  std::mt19937_64 gen(test::test_seed());
  while (offsets.size() < 24)
    offsets.push_back(static_cast<int64_t>(gen() % static_cast<uint64_t>(total)));
  std::vector<std::vector<std::string>> kills;
  for (int64_t o : offsets) kills.push_back({"MOETRAIN_FAULT_KILL_AT_BYTE=" + std::to_string(o)});
  for (const char* p : {"complete", "installed", "latest"})
    kills.push_back({std::string("MOETRAIN_FAULT_KILL_AT=") + p});
  for (auto env : kills) {
    SCOPED_TRACE(env[0]);
    env.push_back("MOETRAIN_FAULT_KILL_SAVE_STEP=4");
    const int st = wait_status(start_cli(job, run, {}, env));
    ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)
        << "not killed: status " << st << "; its step-4 save wrote "
        << (fs::exists(run / "checkpoints" / step_dir(4))
                ? save_bytes(run / "checkpoints" / step_dir(4))
                : 0)
        << " bytes, the reference's " << total;
    const fs::path latest = expect_loadable_latest(run / "checkpoints");
    const bool past_latest = env[0] == "MOETRAIN_FAULT_KILL_AT=latest";
    EXPECT_EQ(latest.filename().string(), step_dir(past_latest ? 4 : 2));
    expect_same_state(ref / latest.filename(), latest);
    run_cli_ok(job, run, {"--resume"});
    expect_same_state(ref / step_dir(6), run / "checkpoints" / step_dir(6));
    // The offsets above hold only while every save writes the reference's bytes.
    EXPECT_EQ(save_bytes(run / "checkpoints" / step_dir(4)), total);
    fs::remove_all(run);
    fs::remove(root / "run.log");
  }
  fs::remove_all(root);
}

// Saving over the step `latest` names (a resume from an older checkpoint reaches it again):
// killed anywhere in that save, `latest` still names a complete directory, and a reader polling
// `latest` during repeated saves never finds it naming a missing or incomplete one.
TEST(Faults, SavingOverTheLatestStepNeverLeavesItMissing) {
  const fs::path root = temp_dir("over");
  const fs::path job = write_job(root, 6, 2);
  run_cli_ok(job, root / "ref", {});
  const fs::path ref = root / "ref" / "checkpoints";
  for (const std::string& kill : {std::string("MOETRAIN_FAULT_KILL_AT=complete"),
                                  std::string("MOETRAIN_FAULT_KILL_AT=installed"),
                                  std::string("MOETRAIN_FAULT_KILL_AT=latest"),
                                  std::string("MOETRAIN_FAULT_KILL_AT_BYTE=5000")}) {
    SCOPED_TRACE(kill);
    const fs::path run = root / "run", ck = run / "checkpoints";
    fs::remove_all(run);
    fs::create_directories(ck);
    for (int s : {2, 4}) fs::copy(ref / step_dir(s), ck / step_dir(s), fs::copy_options::recursive);
    write_file_atomic(ck / "latest", step_dir(4) + "\n");
    const int st = wait_status(start_cli(job, run, {"--resume-from", (ck / step_dir(2)).string()},
                                         {kill, "MOETRAIN_FAULT_KILL_SAVE_STEP=4"}));
    ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << "not killed: status " << st;
    const fs::path latest = expect_loadable_latest(ck);
    EXPECT_EQ(latest.filename().string(), step_dir(4));
    expect_same_state(ref / step_dir(4), latest);
  }
  // In process: a reader thread checks `latest` while the same step is saved over and over.
  Model m(ModelConfig::load("tiny"), 3);
  AdamW opt(m.params(), {});
  const fs::path dir = root / "poll";
  save_checkpoint(dir.string(), m, &opt, {.step = 4}, "job");
  std::atomic<bool> done{false};
  std::atomic<int> reads{0}, bad{0};
  std::thread reader([&] {
    while (!done) {
      const std::string d = latest_checkpoint(dir.string());
      if (!fs::is_regular_file(fs::path(d) / "manifest.json")) ++bad;
      ++reads;
    }
  });
  for (int i = 0; i < 20; ++i) save_checkpoint(dir.string(), m, &opt, {.step = 4}, "job");
  done = true;
  reader.join();
  EXPECT_GT(reads.load(), 0);
  EXPECT_EQ(bad.load(), 0) << "of " << reads.load() << " reads of latest";
  fs::remove_all(root);
}

// Real SIGKILLs from outside at random times (checkpoints every step): whatever the moment,
// `latest` loads, and resuming until the end gives the uninterrupted run's state bitwise.
TEST(Faults, ExternalSigkillAtRandomTimesResumesBitExact) {
  const fs::path root = temp_dir("random");
  const fs::path job = write_job(root, 8, 1);
  const auto t0 = std::chrono::steady_clock::now();
  run_cli_ok(job, root / "ref", {});
  const double run_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const fs::path ref = root / "ref" / "checkpoints";
  SCOPED_TRACE(test::seed_note() + " (kill times drawn from it)");
  std::mt19937_64 gen(test::test_seed());
  const fs::path run = root / "run";
  int kills = 0;
  // The reference run's time only estimates this one's (a loaded machine speeds up or slows
  // down between runs): a sequence in which no kill landed starts again from scratch, up to
  // five times, so the test always exercises at least one real kill.
  for (int attempt = 0; attempt < 5 && kills == 0; ++attempt) {
    fs::remove_all(run);
    for (int round = 0; round < 12; ++round) {
      const bool have = !latest_checkpoint((run / "checkpoints").string()).empty();
      const pid_t pid = start_cli(
          job, run, have ? std::vector<std::string>{"--resume"} : std::vector<std::string>{}, {});
      const auto delay = std::chrono::microseconds(static_cast<int64_t>(
          std::uniform_real_distribution<double>(0.05, 1.0)(gen) * run_ms * 1000));
      std::this_thread::sleep_for(delay);
      kill(pid, SIGKILL);
      const int st = wait_status(pid);
      if (WIFSIGNALED(st)) {
        ++kills;
        if (!latest_checkpoint((run / "checkpoints").string()).empty())
          expect_loadable_latest(run / "checkpoints");
      } else {
        ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
        break;  // it finished before the kill
      }
    }
  }
  EXPECT_GT(kills, 0);
  run_cli_ok(job, run,
             latest_checkpoint((run / "checkpoints").string()).empty()
                 ? std::vector<std::string>{}
                 : std::vector<std::string>{"--resume"});
  expect_same_state(ref / step_dir(8), run / "checkpoints" / step_dir(8));
  fs::remove_all(root);
}

namespace {

// The file-size limit a full disk acts like, with SIGXFSZ ignored so writes fail with EFBIG.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    old_sig_ = signal(SIGXFSZ, SIG_IGN);
    getrlimit(RLIMIT_FSIZE, &old_);
    rlimit l = old_;
    l.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &l);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &old_);
    signal(SIGXFSZ, old_sig_);
  }

 private:
  rlimit old_{};
  sighandler_t old_sig_;
};

std::vector<nlohmann::json> metrics_lines(const fs::path& run) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace

// A save larger than the file-size limit: IoError naming the checkpoint and the file with the
// system's reason; no partial directory; the previous checkpoint intact and still the latest.
TEST(Faults, FullDiskFailsTheSaveNamingTheFileAndKeepsThePrevious) {
  const fs::path root = temp_dir("full");
  Model m(ModelConfig::load("tiny"), 4);
  AdamW opt(m.params(), {});
  const std::string first = save_checkpoint(root.string(), m, &opt, {.step = 1}, "job");
  const std::string before = read_file(fs::path(first) / "model.safetensors");
  std::string msg;
  {
    FileSizeLimit limit(4096);
    try {
      save_checkpoint(root.string(), m, &opt, {.step = 2}, "job");
    } catch (const IoError& e) {
      msg = e.message();
    }
  }
  EXPECT_NE(msg.find("step_00000002' not saved"), std::string::npos) << msg;
  EXPECT_NE(msg.find("step_00000002.tmp/model.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("File too large"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(root / "step_00000002.tmp"));
  EXPECT_FALSE(fs::exists(root / "step_00000002"));
  EXPECT_EQ(latest_checkpoint(root.string()), first);
  EXPECT_TRUE(read_file(fs::path(first) / "model.safetensors") == before);
  expect_loadable_latest(root);
  fs::remove_all(root);
}

// checkpoint.on_error: "stop" ends the run with the save's error; "continue" logs it in the
// metrics, trains on, and the next save succeeds (an injected ENOSPC at the step-2 save).
TEST(Faults, CheckpointErrorPolicyStopsOrContinues) {
  const fs::path root = temp_dir("policy");
  const fs::path jobf = write_job(root, 4, 1);
  setenv("MOETRAIN_FAULT_ENOSPC_SAVE_STEP", "2", 1);
  std::ostringstream log;
  Job stop = Job::load(jobf.string(), {"run.dir=\"" + (root / "stop").string() + "\""});
  std::string msg;
  try {
    run_job(stop, {}, log);
  } catch (const IoError& e) {
    msg = e.message();
  }
  EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
  EXPECT_NE(msg.find("step_00000002.tmp/model.safetensors"), std::string::npos) << msg;
  EXPECT_EQ(fs::path(latest_checkpoint((root / "stop" / "checkpoints").string())).filename(),
            step_dir(1));
  Job cont = Job::load(jobf.string(), {"run.dir=\"" + (root / "cont").string() + "\"",
                                       "checkpoint.on_error=\"continue\""});
  const TrainResult r = run_job(cont, {}, log);
  unsetenv("MOETRAIN_FAULT_ENOSPC_SAVE_STEP");
  EXPECT_EQ(r.failed_saves, 1);
  EXPECT_EQ(r.losses.size(), 4u);
  EXPECT_FALSE(fs::exists(root / "cont" / "checkpoints" / step_dir(2)));
  EXPECT_TRUE(fs::is_directory(root / "cont" / "checkpoints" / step_dir(3)));
  EXPECT_EQ(fs::path(latest_checkpoint((root / "cont" / "checkpoints").string())).filename(),
            step_dir(4));
  bool logged = false;
  for (const auto& l : metrics_lines(root / "cont"))
    if (l.contains("checkpoint_error"))
      logged =
          l.at("step") == 2 && l.at("failed_saves") == 1 &&
          l.at("checkpoint_error").get<std::string>().find("No space left") != std::string::npos;
  EXPECT_TRUE(logged);
  fs::remove_all(root);
}

// A NaN loss or gradient at step 3 is found before the optimizer step. "skip": the step changes
// no weight and no moment (its checkpoint equals step 2's bitwise in both), it is counted, and
// training goes on to finite weights; "stop": the run ends naming the step and the policy, and
// step 2's checkpoint stays the latest.
TEST(Faults, NonFiniteLossOrGradientIsSkippedOrStops) {
  for (const char* what : {"loss", "grad"}) {
    SCOPED_TRACE(what);
    const fs::path root = temp_dir(std::string("nan_") + what);
    const fs::path jobf = write_job(root, 5, 1);
    setenv("MOETRAIN_FAULT_NAN", what, 1);
    setenv("MOETRAIN_FAULT_NAN_STEP", "3", 1);
    std::ostringstream log;
    Job skip = Job::load(jobf.string(), {"run.dir=\"" + (root / "skip").string() + "\"",
                                         "train.nonfinite=\"skip\""});
    const TrainResult r = run_job(skip, {}, log);
    EXPECT_EQ(r.skipped_steps, 1);
    const fs::path ck = root / "skip" / "checkpoints";
    for (const char* f : {"model.safetensors", "optimizer.safetensors"})
      EXPECT_TRUE(read_file(ck / step_dir(2) / f) == read_file(ck / step_dir(3) / f)) << f;
    EXPECT_FALSE(read_file(ck / step_dir(3) / "model.safetensors") ==
                 read_file(ck / step_dir(4) / "model.safetensors"));
    const auto state = [&](int s) {
      return nlohmann::json::parse(read_file(ck / step_dir(s) / "state.json"));
    };
    EXPECT_EQ(state(3).at("optimizer_steps"), 2);
    EXPECT_EQ(state(5).at("optimizer_steps"), 4);
    EXPECT_GT(state(3).at("data_cursor"), state(2).at("data_cursor"));  // the data moves on
    for (double l : {r.losses[3], r.losses[4]}) EXPECT_TRUE(std::isfinite(l));
    bool logged = false;
    for (const auto& l : metrics_lines(root / "skip"))
      if (l.contains("nonfinite")) logged = l.at("step") == 3 && l.at("skipped_steps") == 1;
    EXPECT_TRUE(logged);

    Job stop = Job::load(jobf.string(), {"run.dir=\"" + (root / "stop").string() + "\""});
    std::string msg;
    try {
      run_job(stop, {}, log);
    } catch (const ValueError& e) {
      msg = e.message();
    }
    unsetenv("MOETRAIN_FAULT_NAN");
    unsetenv("MOETRAIN_FAULT_NAN_STEP");
    EXPECT_NE(msg.find("step 3: non-finite"), std::string::npos) << msg;
    EXPECT_NE(msg.find("train.nonfinite = \"stop\""), std::string::npos) << msg;
    const fs::path sc = root / "stop" / "checkpoints";
    EXPECT_EQ(fs::path(latest_checkpoint(sc.string())).filename(), step_dir(2));
    EXPECT_FALSE(fs::exists(sc / step_dir(3)));
    EXPECT_TRUE(read_file(sc / step_dir(2) / "model.safetensors") ==
                read_file(ck / step_dir(2) / "model.safetensors"));
    fs::remove_all(root);
  }
}

// Stop after step 3 and resume: the final checkpoint equals the uninterrupted run's in every
// state, byte for byte (weights, AdamW moments and step count, RNG, data position), and so do
// the per-step losses and learning rates of the resumed steps.
TEST(Faults, StopAndResumeEqualsAnUninterruptedRunInEveryState) {
  const fs::path root = temp_dir("resume");
  const fs::path jobf = write_job(root, 6, 3);
  std::ostringstream log;
  const TrainResult full =
      run_job(Job::load(jobf.string(), {"run.dir=\"" + (root / "full").string() + "\""}), {}, log);
  // Stopped after step 3 (its checkpoint), resumed by another process into another directory.
  const TrainResult resumed =
      run_job(Job::load(jobf.string(), {"run.dir=\"" + (root / "part").string() + "\""}),
              {.resume_from = (root / "full" / "checkpoints" / step_dir(3)).string()}, log);
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(resumed.losses[i], full.losses[i + 3]);
  expect_same_state(root / "full" / "checkpoints" / step_dir(6),
                    root / "part" / "checkpoints" / step_dir(6));
  std::map<int64_t, double> lr_full, lr_res;
  for (const auto& l : metrics_lines(root / "full"))
    if (l.contains("lr")) lr_full[l.at("step")] = l.at("lr");
  for (const auto& l : metrics_lines(root / "part"))
    if (l.contains("lr") && l.at("step").get<int64_t>() > 3) lr_res[l.at("step")] = l.at("lr");
  for (const auto& [s, lr] : lr_res) EXPECT_EQ(lr, lr_full.at(s)) << "step " << s;
  EXPECT_EQ(lr_res.size(), 3u);
  fs::remove_all(root);
}

TEST(Faults, PolicyKeysAreValidated) {
  const fs::path root = temp_dir("keys");
  const fs::path jobf = write_job(root, 2, 1);
  for (const std::string& kv :
       {std::string("train.nonfinite=\"ignore\""), std::string("checkpoint.on_error=\"retry\""),
        std::string("parallel.comm_timeout_s=0")}) {
    std::string msg;
    try {
      Job::load(jobf.string(), {kv});
    } catch (const ConfigError& e) {
      msg = e.message();
    }
    EXPECT_NE(msg.find(kv.substr(0, kv.find('='))), std::string::npos) << kv << ": " << msg;
  }
  fs::remove_all(root);
}
