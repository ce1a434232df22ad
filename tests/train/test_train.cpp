// Jobs (strict TOML), LoRA selection, the training loop's bit-exact resume, checkpoint safety
// against a killed writer, checkpoints from another model, PEFT export layout, PEFT adapters
// applied to a base model, and per-corpus held-out loss in the metrics.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "decode/decode.h"
#include "harness/seed.h"
#include "harness/train_files.h"
#include "io/hf_names.h"
#include "io/safetensors.h"
#include "model/kda_layer.h"
#include "model/moe_layer.h"
#include "ops/gemm.h"
#include "ops/grouped_matmul.h"
#include "ops/kda.h"
#include "plan/model_stats.h"
#include "train/adapter.h"
#include "train/checkpoint.h"
#include "train/export.h"
#include "train/job.h"
#include "train/trainer.h"

namespace fs = std::filesystem;
using namespace mt;

namespace {

using test::temp_dir;

// Twenty sequences of several documents each.
std::string make_dataset(const fs::path& dir, uint64_t seed) {
  return test::write_tiny_dataset(dir, seed, 20);
}

// The base job: a fresh run seed and fresh training and held-out data, the same at every call
// within a test, so that a test building it more than once (a base run, then LoRA on it) trains on
// the same data each time.
std::string base_job(const fs::path& root) {
  const uint64_t seed = test::case_seed() >> 33, train = test::case_seed() + 1,
                 held = test::case_seed() + 2;
  return "[run]\ndir = \"" + (root / "run").string() + "\"\nseed = " + std::to_string(seed) +
         "\nthreads = 1\n[model]\nconfig = \"tiny\"\n[data]\ntrain = \"" +
         make_dataset(root / "train", train) + "\"\neval = { held = \"" +
         make_dataset(root / "held", held) +
         "\" }\n[optim]\nlr = 0.01\n[schedule]\nsteps = 6\nwarmup = 2\n[train]\nbatch = 2\n"
         "grad_accum = 2\n[log]\nprogress = \"off\"\n";
}

template <typename E>
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.message();
  }
  return "(no error)";
}

}  // namespace

TEST(Job, UnknownKeysAndWrongTypesNameTheKey) {
  const std::string ok = "[data]\ntrain = \"d\"\n";
  EXPECT_NE(error_of<ConfigError>([&] {
              Job::parse(ok + "[optim]\nlrr = 1.0\n", "j.toml");
            }).find("unknown key 'optim.lrr'"),
            std::string::npos);
  EXPECT_NE(error_of<ConfigError>([&] {
              Job::parse(ok + "[optim]\nlr = \"fast\"\n", "j.toml");
            }).find("'optim.lr' must be a number, got a string"),
            std::string::npos);
  EXPECT_NE(error_of<ConfigError>([&] {
              Job::parse(ok + "[schedule]\nsteps = 1.5\n", "j.toml");
            }).find("'schedule.steps' must be an integer, got a float"),
            std::string::npos);
  EXPECT_NE(error_of<ConfigError>([&] {
              Job::parse(ok, "j.toml", {"train.bach=3"});
            }).find("unknown key 'train.bach'"),
            std::string::npos);
  EXPECT_NE(error_of<ConfigError>([&] {
              Job::parse(ok + "[lora]\ntargets = [\"kda\", \"mlp\"]\n", "j.toml");
            }).find("unknown target 'mlp'"),
            std::string::npos);
  // Overrides are typed like TOML; the resolved job parses back to the same values.
  Job j = Job::parse(ok, "j.toml",
                     {"optim.lr=0.5", "schedule.steps=70", "model.config=tiny",
                      "lora.targets=[\"kda\",\"router\"]", "lora.kda.rank=4"});
  EXPECT_FLOAT_EQ(j.lr, 0.5f);
  EXPECT_EQ(j.steps, 70);
  EXPECT_EQ(j.model, "tiny");
  EXPECT_EQ(j.lora_groups.at("kda").rank, 4);
  Job k = Job::parse(j.to_toml(), "resolved");
  EXPECT_EQ(k.to_toml(), j.to_toml());
}

TEST(Job, LoraTargetsSelectParametersByGroup) {
  Job j = Job::parse(
      "[data]\ntrain = \"d\"\n[model]\nconfig = \"small\"\n[lora]\n"
      "targets = [\"kda\", \"attention\", \"router\"]\nrank = 4\n",
      "j.toml");
  const ModelConfig cfg = job_model_config(j);
  Model m(cfg, 1, job_model_options(j));
  int64_t trainable = 0;
  for (const auto& p : m.params().all()) {
    if (!p->trainable()) {
      EXPECT_NE(p->spec.role, ParamRole::Lora) << p->name;
      continue;
    }
    trainable += p->value.numel();
    const std::string g = lora_group_of(cfg, p->name);
    if (p->spec.role == ParamRole::Lora)
      EXPECT_TRUE(g == "kda" || g == "attention") << p->name;
    else
      EXPECT_EQ(g, "router") << p->name;
  }
  EXPECT_EQ(trainable, m.params().count(true));
  EXPECT_GT(trainable, 0);
  EXPECT_LT(static_cast<double>(trainable), 0.05 * static_cast<double>(m.params().count()));
  EXPECT_TRUE(glob_match("model.layers.*.mlp.gate.weight", "model.layers.12.mlp.gate.weight"));
  EXPECT_FALSE(glob_match("model.layers.*.mlp.gate.weight", "model.layers.1.mlp.gate.bias"));
}

TEST(Train, ResumeIsBitExactAndLossFalls) {
  fs::path root = temp_dir("resume");
  const std::string text = base_job(root);
  std::ostringstream log;
  Job full = Job::parse(text, "job", {"run.dir=\"" + (root / "full").string() + "\""});
  TrainResult a = run_job(full, {}, log);
  ASSERT_EQ(a.losses.size(), 6u);
  EXPECT_LT(a.losses.back(), a.losses.front());
  EXPECT_TRUE(fs::is_regular_file(root / "full" / "job.toml"));
  EXPECT_TRUE(fs::is_regular_file(root / "full" / "metrics.jsonl"));

  Job part = Job::parse(text, "job", {"checkpoint.every=3"});
  // Run the full 6-step job with checkpoints every 3, then resume from the step-3 checkpoint.
  TrainResult b = run_job(part, {}, log);
  const std::string ck3 = (root / "run" / "checkpoints" / "step_00000003").string();
  ASSERT_TRUE(fs::is_directory(ck3));
  Job again = Job::parse(text, "job", {"run.dir=\"" + (root / "again").string() + "\""});
  TrainResult c = run_job(again, {.resume_from = ck3}, log);
  ASSERT_EQ(c.first_step, 4);
  ASSERT_EQ(c.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(c.losses[i], a.losses[i + 3]) << "step " << i + 4;
  EXPECT_EQ(b.losses, a.losses);
  EXPECT_EQ(c.eval.at("held").loss, a.eval.at("held").loss);
}

TEST(Train, KilledSaveLeavesThePreviousCheckpoint) {
  fs::path root = temp_dir("kill");
  Model m(ModelConfig::load("tiny"), 5);
  AdamW opt(m.params(), {});
  const std::string first = save_checkpoint(root.string(), m, &opt, {.step = 1}, "job");
  // The child starts the next save and stops inside it; the parent kills it there.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    for (const auto& p : m.params().all()) p->value.f32()[0] += 1.0f;
    save_checkpoint(root.string(), m, &opt, {.step = 2}, "job", [&](const std::string& f) {
      if (f == "state.json") {
        char c = 'x';
        (void)!write(fds[1], &c, 1);
        pause();
      }
    });
    _exit(0);
  }
  close(fds[1]);
  char c;
  ASSERT_EQ(read(fds[0], &c, 1), 1);
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(latest_checkpoint(root.string()), first);
  EXPECT_FALSE(fs::exists(root / "step_00000002"));
  Model back(ModelConfig::load("tiny"), 99);
  EXPECT_EQ(load_checkpoint(first, back, nullptr).step, 1);
  for (const auto& p : m.params().all())
    EXPECT_EQ(back.params().at(p->name).value.f32()[0], p->value.f32()[0]) << p->name;
  // The next save cleans the half-written directory and completes.
  const std::string second = save_checkpoint(root.string(), m, &opt, {.step = 2}, "job");
  EXPECT_EQ(latest_checkpoint(root.string()), second);
  EXPECT_FALSE(fs::exists(root / "step_00000002.tmp"));
}

TEST(Train, CheckpointFromAnotherModelIsAClearError) {
  fs::path root = temp_dir("other");
  Model tiny(ModelConfig::load("tiny"), 5);
  const std::string ck = save_checkpoint(root.string(), tiny, nullptr, {.step = 1}, "job");
  ModelConfig cfg = ModelConfig::load("tiny");
  cfg.hidden = 32;
  cfg.kda.hidden = cfg.mla.hidden = cfg.dsa.mla.hidden = cfg.moe.hidden = cfg.dense.hidden = 32;
  Model other(cfg, 5);
  const std::string msg = error_of<ConfigError>([&] { load_checkpoint(ck, other, nullptr); });
  EXPECT_NE(msg.find("written for another model: hidden_size = 24"), std::string::npos) << msg;
  // A corrupted file is caught by the manifest.
  {
    std::fstream f(fs::path(ck) / "model.safetensors",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-4, std::ios::end);
    f.write("\x7f\x7f\x7f\x7f", 4);
  }
  EXPECT_NE(error_of<IoError>([&] { load_checkpoint(ck, tiny, nullptr); }).find("checksum"),
            std::string::npos);
}

TEST(Job, PrecisionKeyIsValidatedAndBf16IsRefusedOnTheCpu) {
  const std::string ok = "[data]\ntrain = \"d\"\n";
  EXPECT_EQ(Job::parse(ok, "j.toml").precision, "fp32");
  EXPECT_EQ(job_model_options(Job::parse(ok, "j.toml")).precision, Precision::fp32());
  const Job b = Job::parse(ok, "j.toml", {"model.precision=bf16"});
  EXPECT_EQ(job_model_options(b).precision, Precision::bf16());
  EXPECT_EQ(Job::parse(b.to_toml(), "resolved").precision, "bf16");
  const std::string bad =
      error_of<ConfigError>([&] { Job::parse(ok + "[model]\nprecision = \"fp16\"\n", "j.toml"); });
  EXPECT_NE(bad.find("'model.precision' = \"fp16\" must be \"fp32\" or \"bf16\""),
            std::string::npos)
      << bad;
  fs::path root = temp_dir("bf16");
  std::ostringstream log;
  const std::string msg = error_of<ConfigError>(
      [&] { run_job(Job::parse(base_job(root), "job", {"model.precision=bf16"}), {}, log); });
  EXPECT_NE(msg.find("model.precision = \"bf16\" cannot train on the CPU"), std::string::npos)
      << msg;
}

// train.recompute reaches the model, is validated by name, survives the resolved job, and the
// trainer gives the no-recompute losses bit for bit (same ops in the same order).
// kernels.grouped_gemm: a configuration name reaches every MoE layer of the model the job builds
// (their grouped GEMMs run it on the GPU); a name the op does not know is the key's error.
TEST(Job, GroupedGemmKeyReachesTheMoeLayers) {
  const std::string ok = "[data]\ntrain = \"d\"\n[model]\nconfig = \"tiny\"\n";
  const std::string name = "coop128x256c2x1:down=coop128x256c2x1";
  const Job j = Job::parse(ok, "j.toml", {"kernels.grouped_gemm=\"" + name + "\""});
  EXPECT_EQ(Job::parse(j.to_toml(), "resolved").grouped_gemm, name);
  const ModelOptions o = job_model_options(j);
  ASSERT_TRUE(o.grouped_gemm.has_value());
  EXPECT_EQ(ops::grouped_gemm_config_name(*o.grouped_gemm), name);
  Model m(job_model_config(j), 1, o);
  int moe = 0;
  for (MoeLayer* l : m.moe_layers()) {
    if (!l) continue;
    ASSERT_TRUE(l->grouped_gemm().has_value());
    EXPECT_EQ(ops::grouped_gemm_config_name(*l->grouped_gemm()), name);
    ++moe;
  }
  EXPECT_GT(moe, 0);
  // Unset: no configuration of its own (the environment's or the default applies).
  Model plain(job_model_config(Job::parse(ok, "j.toml")), 1);
  for (MoeLayer* l : plain.moe_layers()) {
    if (l) {
      EXPECT_FALSE(l->grouped_gemm().has_value());
    }
  }
  const std::string e = error_of<ConfigError>(
      [&] { Job::parse(ok, "j.toml", {"kernels.grouped_gemm=\"warp9000\""}); });
  EXPECT_NE(e.find("'kernels.grouped_gemm' = \"warp9000\""), std::string::npos) << e;
}

// kernels.kda (ops::parse_kda_kernels's form) reaches the config every KDA layer is built from,
// and with it the layer's memory plan: the prepared blocks kept for backward (keep_prepared) add
// their floats to a GPU plan, exactly kda_prepared_floats of them; the CPU plan ignores them.
TEST(Job, KdaKernelsKeyReachesTheKdaLayersAndTheirPlan) {
  const std::string ok = "[data]\ntrain = \"d\"\n[model]\nconfig = \"tiny\"\n";
  EXPECT_EQ(job_model_config(Job::parse(ok, "j.toml")).kda.kernels, ops::KdaKernels{});
  const std::string name = "keep_prepared=on:grads_v2=off";
  const Job j = Job::parse(ok, "j.toml", {"kernels.kda=\"" + name + "\""});
  EXPECT_EQ(Job::parse(j.to_toml(), "resolved").kda_kernels, name);
  const ModelConfig cfg = job_model_config(j);
  EXPECT_EQ(cfg.kda.kernels, ops::parse_kda_kernels(name));
  int kda_layers = 0;
  for (const LayerIR& l : cfg.layers) kda_layers += l.mixer == MixerKind::Kda;
  ASSERT_GT(kda_layers, 0) << "the tiny model has KDA layers";
  KdaConfig kc = cfg.kda;
  kc.head_dim = 64;  // the chunked kernels' shapes (chunk 64, head dims 64 or 128)
  kc.chunk = 64;
  kc.chunked = true;
  const SeqInfo seq = SeqInfo::from_lengths({100, 70});
  const auto planned = [&](const KdaConfig& c, Device d) {
    ArenaPlan p(DType::BF16, d);
    KdaLayer(c).plan_activations(seq, p);
    return p.bytes();
  };
  KdaConfig plain = kc;
  plain.kernels = {};
  const ops::KdaParams cp{.tokens = seq.tokens,
                          .heads = kc.heads,
                          .head_k = kc.head_dim,
                          .head_v = kc.head_dim,
                          .num_seqs = seq.num_seqs,
                          .chunk = kc.chunk};
  const size_t prepared =
      sizeof(float) * static_cast<size_t>(ops::kda_prepared_floats(
                          cp, ops::kda_saved_rows(cp, seq.cu_seqlens_host), DType::BF16));
  EXPECT_GE(planned(kc, Device::CUDA), planned(plain, Device::CUDA) + prepared);
  EXPECT_EQ(planned(kc, Device::CPU), planned(plain, Device::CPU));
  const std::string e =
      error_of<ConfigError>([&] { Job::parse(ok, "j.toml", {"kernels.kda=\"grads_v3=off\""}); });
  EXPECT_NE(e.find("'kernels.kda' = \"grads_v3=off\""), std::string::npos) << e;
  EXPECT_NE(e.find("unknown choice \"grads_v3\""), std::string::npos) << e;
}

TEST(Job, RecomputeKeyTrainsExactlyLikeNone) {
  const std::string ok = "[data]\ntrain = \"d\"\n";
  EXPECT_EQ(job_model_options(Job::parse(ok, "j.toml")).recompute, ActivationRecompute::None);
  const std::string bad =
      error_of<ConfigError>([&] { Job::parse(ok + "[train]\nrecompute = \"mixer\"\n", "j.toml"); });
  EXPECT_NE(bad.find("'train.recompute' = \"mixer\" must be none, selective or full"),
            std::string::npos)
      << bad;
  fs::path root = temp_dir("recompute");
  std::ostringstream log;
  const TrainResult none = run_job(Job::parse(base_job(root), "job"), {}, log);
  for (const auto& [name, mode] :
       {std::pair<const char*, ActivationRecompute>{"selective", ActivationRecompute::Selective},
        {"full", ActivationRecompute::Full}}) {
    SCOPED_TRACE(name);
    const Job j = Job::parse(
        base_job(root), "job",
        {std::string("train.recompute=") + name, "run.dir=\"" + (root / name).string() + "\""});
    EXPECT_EQ(job_model_options(j).recompute, mode);
    EXPECT_EQ(Job::parse(j.to_toml(), "resolved").recompute, name);
    const TrainResult r = run_job(j, {}, log);
    ASSERT_EQ(r.losses.size(), none.losses.size());
    for (size_t i = 0; i < r.losses.size(); ++i) EXPECT_EQ(r.losses[i], none.losses[i]) << i;
    EXPECT_EQ(r.eval.at("held").loss, none.eval.at("held").loss);
  }
}

namespace {

// x rounded to bf16 (8 significant bits, ties to even), written from the definition rather
// than with the engine's bit manipulation. Normal numbers only.
float rounded_bf16(float x) {
  int e = 0;
  const double m = std::frexp(static_cast<double>(x), &e);  // x = m 2^e, 0.5 <= |m| < 1
  return static_cast<float>(std::ldexp(std::nearbyint(std::ldexp(m, 8)), e - 8));
}

}  // namespace

// A checkpoint written before precision policies (its manifest has no "precision") loads as fp32,
// bit for bit, optimizer state included.
TEST(Checkpoint, ManifestWithoutPrecisionLoadsAsFp32) {
  fs::path root = temp_dir("old_manifest");
  Model m(ModelConfig::load("tiny"), 5);
  AdamW opt(m.params(), {});
  for (Tensor& t : opt.first_moments()) t.f32()[0] = 0.25f;
  opt.set_steps(4);
  const std::string ck = save_checkpoint(root.string(), m, &opt, {.step = 4}, "job");
  nlohmann::json manifest = nlohmann::json::parse(std::ifstream(fs::path(ck) / "manifest.json"));
  EXPECT_EQ(manifest.at("precision"), "fp32");
  manifest.erase("precision");
  std::ofstream(fs::path(ck) / "manifest.json") << manifest.dump(2);

  Model back(ModelConfig::load("tiny"), 99);
  AdamW back_opt(back.params(), {});
  const TrainState st = load_checkpoint(ck, back, &back_opt);
  EXPECT_EQ(st.precision, "fp32");
  EXPECT_EQ(st.step, 4);
  EXPECT_EQ(back_opt.steps(), 4);
  for (const auto& p : m.params().all()) {
    const Tensor& v = back.params().at(p->name).value;
    ASSERT_EQ(v.dtype(), DType::F32);
    for (int64_t i = 0; i < v.numel(); ++i) ASSERT_EQ(v.f32()[i], p->value.f32()[i]) << p->name;
  }
  for (const Tensor& t : back_opt.first_moments()) EXPECT_EQ(t.f32()[0], 0.25f);
}

// Resuming across policies: masters are fp32 in both, so trainable parameters carry over exactly;
// frozen weights round (fp32 -> bf16) or widen exactly (bf16 -> fp32).
TEST(Checkpoint, ResumesUnderAnotherPrecision) {
  fs::path root = temp_dir("precision");
  const ModelConfig cfg = plan::with_lora(ModelConfig::load("tiny"), {.rank = 2});
  const ModelOptions fp32{.freeze_base = true},
      bf16{.freeze_base = true, .precision = Precision::bf16()};
  // fp32 -> bf16: masters equal the fp32 values, stored values are their bf16 rounding.
  Model a(cfg, 5, fp32);
  AdamW a_opt(a.params(), {});
  for (const auto& p : a.params().all())  // LoRA B starts at 0: give every value some bits
    for (int64_t i = 0; i < p->value.numel(); ++i) p->value.f32()[i] += 0.001f * (i % 7) + 1e-5f;
  const std::string ck_a = save_checkpoint((root / "a").string(), a, &a_opt, {.step = 1}, "job");
  Model b(cfg, 6, bf16);
  AdamW b_opt(b.params(), {});
  EXPECT_EQ(load_checkpoint(ck_a, b, &b_opt).precision, "fp32");
  size_t k = 0;
  for (const auto& p : a.params().all()) {
    const Param& q = b.params().at(p->name);
    const bool buffer = p->spec.role == ParamRole::Buffer || p->spec.keep_fp32;
    ASSERT_EQ(q.value.dtype(), buffer ? DType::F32 : DType::BF16) << p->name;
    for (int64_t i = 0; i < p->value.numel(); ++i) {
      const float x = p->value.f32()[i];
      const float stored = buffer ? q.value.f32()[i] : bf16_to_f32(q.value.bf16()[i]);
      ASSERT_EQ(stored, buffer ? x : rounded_bf16(x)) << p->name << "[" << i << "]";
    }
    if (!p->trainable()) continue;
    const Tensor& master = b_opt.masters().at(k++);
    ASSERT_TRUE(master.defined()) << p->name;
    for (int64_t i = 0; i < p->value.numel(); ++i)
      ASSERT_EQ(master.f32()[i], p->value.f32()[i]) << p->name;
  }
  EXPECT_EQ(b_opt.master_bytes(), 4 * b.params().count(true));

  // A bf16 step on the CPU optimizer: the master moves, the stored value is its rounding.
  Context ctx(ContextOptions{.threads = 1, .seed = 1});
  for (const Tensor& g : b.params().grads())
    for (int64_t i = 0; i < g.numel(); ++i) g.f32()[i] = 0.01f * static_cast<float>(i % 5) - 0.02f;
  b_opt.step(ctx, b.params(), 1e-3f);
  k = 0;
  int64_t finer = 0;  // masters bf16 cannot hold: what a resume from the weights would lose
  for (const auto& p : b.params().all()) {
    if (!p->trainable()) continue;
    const Tensor& master = b_opt.masters().at(k++);
    for (int64_t i = 0; i < master.numel(); ++i) {
      ASSERT_EQ(bf16_to_f32(p->value.bf16()[i]), rounded_bf16(master.f32()[i])) << p->name;
      finer += rounded_bf16(master.f32()[i]) != master.f32()[i];
    }
  }
  EXPECT_GT(finer, 0);

  // bf16 -> fp32: trainable values are the masters (not their rounding), frozen ones widen.
  const std::string ck_b = save_checkpoint((root / "b").string(), b, &b_opt, {.step = 2}, "job");
  nlohmann::json manifest = nlohmann::json::parse(std::ifstream(fs::path(ck_b) / "manifest.json"));
  EXPECT_EQ(manifest.at("precision"), "bf16");
  for (AdamW* o : {static_cast<AdamW*>(nullptr), &a_opt}) {
    Model c(cfg, 7, fp32);
    EXPECT_EQ(load_checkpoint(ck_b, c, o).precision, "bf16");
    k = 0;
    for (const auto& p : b.params().all()) {
      const Tensor& v = c.params().at(p->name).value;
      ASSERT_EQ(v.dtype(), DType::F32);
      const Tensor* master = p->trainable() ? &b_opt.masters().at(k++) : nullptr;
      for (int64_t i = 0; i < v.numel(); ++i) {
        const float want = master                            ? master->f32()[i]
                           : p->value.dtype() == DType::BF16 ? bf16_to_f32(p->value.bf16()[i])
                                                             : p->value.f32()[i];
        ASSERT_EQ(v.f32()[i], want) << p->name << "[" << i << "]";
      }
    }
  }
}

// One process simulating EP ranks for load balancing: an EP size that does not divide the experts
// is the mesh's error, not a silent fall back to one rank.
TEST(Train, ExpertParallelSizeMustDivideTheExperts) {
  fs::path root = temp_dir("ep_rule");
  Job j = Job::parse(
      base_job(root), "job",
      {"parallel.ep=4", "balance.overflow=true", "schedule.steps=1", "schedule.warmup=0"});
  std::ostringstream log;
  EXPECT_NE(error_of<ConfigError>([&] {
              run_job(j, {}, log);
            }).find("parallel.ep: expert-parallel size 4 does not divide the 6 routed experts"),
            std::string::npos);
}

TEST(Export, PeftKeyNamesAndShapes) {
  fs::path root = temp_dir("peft");
  Job j = Job::parse(base_job(root), "job",
                     {"lora.targets=[\"kda\",\"attention\"]", "lora.rank=3", "lora.alpha=6.0",
                      "lora.attention.rank=2", "schedule.steps=2", "schedule.warmup=1"});
  std::ostringstream log;
  TrainResult r = run_job(j, {}, log);
  export_checkpoint(r.checkpoint, "peft", (root / "peft").string());
  SafetensorsData a = read_safetensors((root / "peft" / "adapter_model.safetensors").string());
  const ModelConfig cfg = job_model_config(j);
  // Reference names from the config: every KDA projection and every attention projection.
  const std::vector<std::string> kda = {"q_proj", "k_proj",   "v_proj",   "f_a_proj", "f_b_proj",
                                        "b_proj", "g_a_proj", "g_b_proj", "o_proj"};
  size_t expected = 0;
  for (size_t l = 0; l < cfg.layers.size(); ++l) {
    if (cfg.layers[l].mixer != MixerKind::Kda) continue;
    for (const std::string& mod : kda) {
      const std::string pre =
          "base_model.model.model.layers." + std::to_string(l) + ".self_attn." + mod;
      ASSERT_TRUE(a.tensors.count(pre + ".lora_A.weight")) << pre;
      const Tensor& A = a.tensors.at(pre + ".lora_A.weight");
      const Tensor& B = a.tensors.at(pre + ".lora_B.weight");
      EXPECT_EQ(A.dim(0), 3);
      EXPECT_EQ(B.dim(1), 3);
      EXPECT_EQ(A.dim(1), mod == "o_proj" ? cfg.kda.heads * cfg.kda.head_dim
                          : mod == "f_b_proj" || mod == "g_b_proj" ? cfg.kda.head_dim
                                                                   : cfg.hidden);
      expected += 2;
    }
  }
  const std::string o = "base_model.model.model.layers.3.self_attn.o_proj";
  ASSERT_TRUE(a.tensors.count(o + ".lora_A.weight"));
  EXPECT_EQ(a.tensors.at(o + ".lora_A.weight").dim(0), 2);
  EXPECT_EQ(a.tensors.at(o + ".lora_B.weight").shape(), (Shape{cfg.hidden, 2}));
  EXPECT_GT(a.tensors.size(), expected);
  std::ifstream cf(root / "peft" / "adapter_config.json");
  nlohmann::json c = nlohmann::json::parse(cf);
  EXPECT_EQ(c.at("peft_type"), "LORA");
  EXPECT_EQ(c.at("r"), 3);
  EXPECT_EQ(c.at("rank_pattern").at("model.layers.3.self_attn.o_proj"), 2);
  // hf: merged weights equal W + (alpha/r) B A computed here.
  export_checkpoint(r.checkpoint, "hf", (root / "hf").string());
  SafetensorsData h = read_safetensors((root / "hf" / "model.safetensors").string());
  Model m(cfg, 1, job_model_options(j));
  load_checkpoint(r.checkpoint, m, nullptr);
  const std::string q = "model.layers.0.self_attn.q_proj";
  const Tensor &W = m.params().at(q + ".weight").value,
               &A = m.params().at(q + ".lora_A.weight").value,
               &B = m.params().at(q + ".lora_B.weight").value;
  const Tensor& M = h.tensors.at(q + ".weight");
  for (int64_t o2 : {int64_t{0}, W.dim(0) - 1})
    for (int64_t i : {int64_t{0}, W.dim(1) - 1}) {
      double want = W.f32()[o2 * W.dim(1) + i];
      for (int64_t k = 0; k < 3; ++k) want += 2.0 * B.f32()[o2 * 3 + k] * A.f32()[k * W.dim(1) + i];
      EXPECT_NEAR(M.f32()[o2 * W.dim(1) + i], want, 1e-6);
    }
  EXPECT_FALSE(h.tensors.count(q + ".lora_A.weight"));
}

namespace {

// Logits [T, V] of a forward over ids (the loss path never materialises them).
std::vector<float> forward_logits(Context& ctx, Model& m, const SeqInfo& seq, const Tensor& ids,
                                  const Tensor& targets) {
  m.forward(ctx, seq, ids, targets);
  const Tensor& h = m.final_hidden();
  const bool tied = m.config().tie_embeddings;
  const Tensor& head = m.params().at(tied ? "model.embed_tokens.weight" : "lm_head.weight").value;
  Tensor logits = Tensor::empty({h.dim(0), m.config().vocab});
  ops::matmul(ctx, h, false, head, true, logits);
  return {logits.f32(), logits.f32() + logits.numel()};
}

}  // namespace

// The merged export (--format hf) is a plain model that computes what the LoRA model computes,
// routed-expert adapters included (merged per expert).
TEST(Export, MergedHfModelComputesWhatTheLoraModelComputes) {
  fs::path root = temp_dir("merge");
  Job j = Job::parse(
      base_job(root), "job",
      {"lora.targets=[\"kda\",\"attention\",\"routed_experts\",\"shared_experts\","
       "\"dense_ffn\"]",
       "lora.rank=2", "lora.alpha=5.0", "optim.lr=0.05", "schedule.steps=4", "schedule.warmup=1"});
  std::ostringstream log;
  TrainResult r = run_job(j, {}, log);
  export_checkpoint(r.checkpoint, "hf", (root / "hf").string());
  const ModelConfig cfg = job_model_config(j);
  Model lora(cfg, 1, job_model_options(j));
  load_checkpoint(r.checkpoint, lora, nullptr);
  LoadedModel merged = load_hf_model((root / "hf").string());
  for (const auto& p : merged.model->params().all())
    EXPECT_NE(p->spec.role, ParamRole::Lora) << p->name << " left in the merged model";

  Rng rng(test::test_seed());
  SeqInfo seq = SeqInfo::from_lengths({29, 18});
  Tensor ids = Tensor::empty({seq.tokens}, DType::I32),
         tgt = Tensor::empty({seq.tokens}, DType::I32);
  for (int64_t t = 0; t < seq.tokens; ++t) {
    ids.i32()[t] = static_cast<int32_t>(rng.below(cfg.vocab));
    tgt.i32()[t] = static_cast<int32_t>(rng.below(cfg.vocab));
  }
  // Compared by their logits, not their losses: a loss averages the logits' changes, which can
  // cancel (in 3 of 20 draws the adapters moved the loss by only 12 to 64 times the merge
  // tolerance, below the 100 asked for below).
  Context ctx(ContextOptions{.threads = 1});
  const std::vector<float> with_lora = forward_logits(ctx, lora, seq, ids, tgt);
  const std::vector<float> with_merge = forward_logits(ctx, *merged.model, seq, ids, tgt);
  for (const auto& p : lora.params().all())  // the base alone: adapters off
    if (p->name.find("lora_B") != std::string::npos) p->value.zero_();
  const std::vector<float> base_only = forward_logits(ctx, lora, seq, ids, tgt);
  double scale = 0, merge_err = 0, moved = 0;
  for (size_t i = 0; i < with_lora.size(); ++i) {
    scale = std::max(scale, std::abs(static_cast<double>(with_lora[i])));
    merge_err = std::max(merge_err, std::abs(static_cast<double>(with_merge[i]) - with_lora[i]));
    moved = std::max(moved, std::abs(static_cast<double>(base_only[i]) - with_lora[i]));
  }
  EXPECT_LE(merge_err, 1e-5 * scale);
  // The adapters, routed experts' included, change the logits far beyond that tolerance.
  EXPECT_GT(moved, 100 * 1e-5 * scale) << "adapters too small for the test to mean anything";
  const std::string ex = "model.layers.1.mlp.experts.gate_up_proj";
  const Tensor &wb = lora.params().at(ex).value, &wm = merged.model->params().at(ex).value;
  double diff = 0;
  for (int64_t i = 0; i < wb.numel(); ++i)
    diff = std::max(diff, double(std::abs(wb.f32()[i] - wm.f32()[i])));
  EXPECT_GT(diff, 1e-4) << "routed-expert adapters were not merged";
}

namespace {

std::vector<float> prompt_logits(Model& m, const std::vector<int32_t>& prompt) {
  Context ctx(ContextOptions{.threads = 1});
  const auto n = static_cast<int64_t>(prompt.size());
  Decoder dec(m, n);
  Tensor ids = Tensor::empty({n}, DType::I32);
  std::copy(prompt.begin(), prompt.end(), ids.i32());
  Tensor logits = Tensor::empty({n, m.config().vocab});
  dec.step(ctx, ids, logits);
  return {logits.f32(), logits.f32() + logits.numel()};
}

// Rewrites an adapter directory's safetensors or config through `edit`.
void edit_adapter(const fs::path& src, const fs::path& dst,
                  const std::function<void(TensorMap&, nlohmann::json&)>& edit) {
  fs::remove_all(dst);
  fs::create_directories(dst);
  TensorMap t = read_safetensors((src / "adapter_model.safetensors").string()).tensors;
  std::ifstream in(src / "adapter_config.json");
  nlohmann::json c = nlohmann::json::parse(in);
  edit(t, c);
  write_safetensors((dst / "adapter_model.safetensors").string(), t);
  std::ofstream(dst / "adapter_config.json") << c.dump(2);
}

}  // namespace

TEST(Export, PeftAdapterOnTheBaseEqualsTheLoraCheckpoint) {
  fs::path root = temp_dir("adapter");
  std::ostringstream log;
  // The base: a short full training, so the base is not the LoRA job's own initialisation.
  Job base = Job::parse(base_job(root), "job", {"schedule.steps=2", "schedule.warmup=1"});
  base.run_dir = (root / "base").string();
  const std::string base_ck = run_job(base, {}, log).checkpoint;
  // Every adapter kind, with a group whose rank and alpha differ from the defaults.
  Job lj = Job::parse(base_job(root), "job",
                      {"lora.targets=[\"kda\",\"attention\",\"shared_experts\","
                       "\"routed_experts\",\"dense_ffn\"]",
                       "lora.rank=3", "lora.alpha=6.0", "lora.attention.rank=2",
                       "lora.routed_experts.alpha=5.0", "schedule.steps=4", "optim.lr=0.05"});
  lj.run_dir = (root / "lora").string();
  lj.init = base_ck;
  const std::string lora_ck = run_job(lj, {}, log).checkpoint;
  const fs::path peft = root / "peft";
  export_checkpoint(lora_ck, "peft", peft.string());

  Model base_model(job_model_config(base), 9);
  load_checkpoint(base_ck, base_model, nullptr);
  Model direct(job_model_config(lj), 9);
  load_checkpoint(lora_ck, direct, nullptr);
  std::unique_ptr<Model> adapted = apply_peft_adapter(base_model, base, peft.string());

  // The LoRA run also moved the routers' selection biases (load balancing updates them every
  // step, frozen base or not); a PEFT adapter has no slot for them. They are the only base
  // tensors that differ: take the base's into the reference, so the comparison is the adapter.
  for (const auto& p : direct.params().all()) {
    if (p->spec.role == ParamRole::Lora) continue;
    const Tensor& b = base_model.params().at(p->name).value;
    if (std::equal(b.f32(), b.f32() + b.numel(), p->value.f32())) continue;
    EXPECT_TRUE(p->name.ends_with("mlp.gate.e_score_correction_bias")) << p->name;
    p->value.copy_from(b);
  }
  const std::vector<int32_t> prompt = {5, 17, 3, 40, 22, 9, 58, 1};
  const std::vector<float> want = prompt_logits(direct, prompt);
  const std::vector<float> got = prompt_logits(*adapted, prompt);
  const std::vector<float> plain = prompt_logits(base_model, prompt);
  ASSERT_EQ(got.size(), want.size());
  double diff = 0, from_base = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(got[i] - want[i])));
    from_base = std::max(from_base, static_cast<double>(std::abs(plain[i] - want[i])));
  }
  EXPECT_EQ(diff, 0.0) << from_base;  // same weights, same kernels: bit-identical
  EXPECT_GT(from_base, 1e-3) << "the adapter does not change the model";

  // Mismatched adapters: each error names the key or module.
  auto error_with = [&](const std::function<void(TensorMap&, nlohmann::json&)>& edit) {
    const fs::path bad = root / "bad";
    edit_adapter(peft, bad, edit);
    return error_of<ConfigError>([&] { apply_peft_adapter(base_model, base, bad.string()); });
  };
  const std::string q = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight";
  std::string msg = error_with([&](TensorMap& t, nlohmann::json&) { t.erase(q); });
  EXPECT_NE(msg.find("lacks tensor '" + q + "'"), std::string::npos) << msg;
  msg = error_with([&](TensorMap& t, nlohmann::json&) {
    t[q] = Tensor::zeros({t.at(q).dim(0) + 1, t.at(q).dim(1)});
  });
  const Shape qb = direct.params().at(q.substr(17)).value.shape();
  EXPECT_NE(msg.find(cat("'", q, "' has shape ", Shape{qb[0] + 1, qb[1]},
                         ", the base model expects ", qb)),
            std::string::npos)
      << msg;
  msg = error_with([&](TensorMap&, nlohmann::json& c) { c["r"] = 4; });
  EXPECT_NE(msg.find("rank mismatch"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lora_A.weight' has shape [3,"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 4"), std::string::npos) << msg;
  // Tensors and config agree on rank 2 for one KDA module, but the group has one rank.
  msg = error_with([&](TensorMap& t, nlohmann::json& c) {
    const std::string m = "model.layers.0.self_attn.q_proj";
    const std::string A = "base_model.model." + m + ".lora_A.weight";
    t[A] = Tensor::zeros({2, t.at(A).dim(1)});
    t[q] = Tensor::zeros({t.at(q).dim(0), 2});
    c["rank_pattern"][m] = 2;
  });
  EXPECT_NE(msg.find("rank mismatch in LoRA group 'kda'"), std::string::npos) << msg;
  msg = error_with([&](TensorMap& t, nlohmann::json&) { t["base_model.model.extra"] = t.at(q); });
  EXPECT_NE(msg.find(cat("'base_model.model.extra' (shape ", qb, ") matches no adapter")),
            std::string::npos)
      << msg;
  msg = error_with([&](TensorMap&, nlohmann::json& c) { c["base_model_name_or_path"] = "small"; });
  EXPECT_NE(msg.find("trained on base model 'small', not 'tiny'"), std::string::npos) << msg;
  // A differently shaped base of the same name: the first differing tensor is named.
  ModelConfig wide = job_model_config(base);
  wide.hidden = 32;
  wide.kda.hidden = wide.mla.hidden = wide.dsa.mla.hidden = wide.moe.hidden = wide.dense.hidden =
      32;
  Model other(wide, 9);
  Job other_job = base;
  msg = error_of<ConfigError>([&] { apply_peft_adapter(other, other_job, peft.string()); });
  EXPECT_NE(msg.find("the base model expects"), std::string::npos) << msg;
}

TEST(Train, HeldOutLossPerCorpusAtTheEvalInterval) {
  fs::path root = temp_dir("evalcurve");
  Job j = Job::parse(
      base_job(root), "job",
      {"log.eval_every=2", "checkpoint.every=2", "checkpoint.keep=10", "data.eval_sequences=4"});
  j.eval_data["other"] = make_dataset(root / "other", test::test_seed());
  std::ostringstream log;
  run_job(j, {}, log);
  std::map<int64_t, nlohmann::json> evals;
  std::ifstream in(fs::path(j.run_dir) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    nlohmann::json l = nlohmann::json::parse(line);
    if (l.contains("eval")) evals[l.at("step").get<int64_t>()] = l.at("eval");
  }
  ASSERT_EQ(evals.size(), 3u);  // steps 2, 4 and the last (6)
  // Reference: each step's checkpoint evaluated afresh, one sequence at a time.
  for (const auto& [step, e] : evals) {
    char name[32];
    std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
    Model m(job_model_config(j), 1, job_model_options(j));
    load_checkpoint((fs::path(j.run_dir) / "checkpoints" / name).string(), m, nullptr);
    Context ctx(ContextOptions{.threads = 1});
    AdamW opt(m.params(), {});
    LocalExecutor ex(ctx, m, opt);
    for (const auto& [corpus, dir] : j.eval_data) {
      const EvalResult want = evaluate(ex, load_dataset(dir), 1, 4);
      ASSERT_TRUE(e.contains(corpus)) << step << " " << corpus;
      EXPECT_NEAR(e.at(corpus).at("loss").get<double>(), want.loss, 1e-5) << step << corpus;
      EXPECT_EQ(e.at(corpus).at("tokens").get<int64_t>(), want.tokens);
    }
  }
  EXPECT_NE(evals.at(2).at("held").at("loss"), evals.at(6).at("held").at("loss"));
}

namespace {

// A deepseek_v3 directory as a hub checkpoint ships it: bf16 shards, per-expert tensors.
std::string make_hf_dir(const fs::path& dir, uint64_t seed) {
  const nlohmann::json cfg = {{"model_type", "deepseek_v3"},
                              {"vocab_size", 61},
                              {"hidden_size", 16},
                              {"intermediate_size", 20},
                              {"moe_intermediate_size", 8},
                              {"num_hidden_layers", 2},
                              {"num_attention_heads", 2},
                              {"q_lora_rank", 8},
                              {"kv_lora_rank", 6},
                              {"qk_nope_head_dim", 4},
                              {"qk_rope_head_dim", 2},
                              {"v_head_dim", 4},
                              {"n_routed_experts", 4},
                              {"num_experts_per_tok", 2},
                              {"n_shared_experts", 1},
                              {"n_group", 1},
                              {"topk_group", 1},
                              {"first_k_dense_replace", 1}};
  const HfConfig h = hf_config_from_json(cfg, "v3");
  Model m(h.model, seed);
  TensorMap bf;
  Rng rng(seed + 1);
  for (auto& [name, t] : export_hf_tensors(m, "deepseek_v3")) {
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = static_cast<float>(0.3 * rng.normal());
    Tensor b = Tensor::empty(t.shape(), DType::BF16);
    b.copy_from(t);
    bf[name] = b;
  }
  fs::create_directories(dir);
  write_safetensors_sharded(dir.string(), bf, {}, 4096);
  std::ofstream(dir / "config.json") << cfg.dump(2);
  return dir.string();
}

}  // namespace

// `train --model DIR`: the config and the starting weights come from the HF directory (bf16,
// sharded), LoRA trains, the resolved job reloads, and the exports use the family's layout.
TEST(Train, FineTunesAnHfDirectory) {
  fs::path root = temp_dir("hfdir");
  const std::string dir = make_hf_dir(root / "hf", test::test_seed());
  const std::string toml = base_job(root);
  EXPECT_NE(error_of<ConfigError>([&] {
              Job::parse(toml, "job", {"model.dir=\"" + dir + "\"", "model.config=tiny"});
            }).find("disagree"),
            std::string::npos);
  Job j =
      Job::parse(toml.substr(0, toml.find("[model]")) + toml.substr(toml.find("[data]")), "job",
                 {"model.dir=\"" + dir + "\"", "lora.targets=[\"attention\",\"shared_experts\"]",
                  "lora.rank=2", "schedule.steps=4", "schedule.warmup=1"});
  EXPECT_EQ(j.model, dir);
  EXPECT_EQ(Job::parse(j.to_toml(), "resolved").model_dir, dir);
  std::ostringstream log;
  TrainResult r = run_job(j, {}, log);
  // Frozen base weights are the directory's, exactly (bf16 values widened).
  LoadedModel shipped = load_hf_model(dir);
  Model trained(job_model_config(j), j.seed, job_model_options(j));
  load_checkpoint(r.checkpoint, trained, nullptr);
  for (const auto& p : shipped.model->params().all()) {
    const Param* q = trained.params().find(p->name);
    ASSERT_NE(q, nullptr) << p->name;
    if (q->trainable()) continue;
    EXPECT_EQ(0, std::memcmp(p->value.raw(), q->value.raw(), p->value.bytes())) << p->name;
  }
  ASSERT_EQ(r.losses.size(), 4u);
  // The loss falls on the same sequences: the whole training set through the directory's model
  // and through the trained one. The run's own losses are of other batches at every step, whose
  // spread is larger than what 4 small steps change (the last below the first in 10 of 20 draws).
  const PackedData data = load_dataset(j.train_data);
  std::vector<int64_t> every(data.ids.size() / static_cast<size_t>(data.seq_len));
  std::iota(every.begin(), every.end(), int64_t{0});
  const Batch all = make_batch(data, every);
  Context ctx(ContextOptions{.threads = 1});
  const double before = shipped.model->forward(ctx, all.seq, all.ids, all.targets);
  const double after = trained.forward(ctx, all.seq, all.ids, all.targets);
  // Beyond rounding (the loss of 480 tokens in fp32 rounds at about 1e-6 of itself); the falls
  // seen over 25 draws were 4.5e-4 to 1.8e-3 of the loss.
  EXPECT_LT(after, before * (1 - 1e-5)) << "before " << before << ", after " << after;
  // The merged export is a deepseek_v3 checkpoint (per-expert tensors, the original config).
  export_checkpoint(r.checkpoint, "hf", (root / "merged").string());
  const SafetensorsData m = read_safetensors_model((root / "merged").string());
  EXPECT_TRUE(m.tensors.count("model.layers.1.mlp.experts.3.down_proj.weight"));
  EXPECT_EQ(load_hf_config((root / "merged").string()).model_type, "deepseek_v3");
  EXPECT_NO_THROW(load_hf_model((root / "merged").string()));
  // The adapter export names transformers' modules.
  export_checkpoint(r.checkpoint, "peft", (root / "peft").string());
  const SafetensorsData a =
      read_safetensors((root / "peft" / "adapter_model.safetensors").string());
  EXPECT_TRUE(a.tensors.count("base_model.model.model.layers.0.self_attn.q_a_proj.lora_A.weight"));
}
