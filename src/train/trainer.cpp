#include "train/trainer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "core/device.h"
#include "core/error.h"
#include "io/hf_names.h"
#include "model/moe_layer.h"
#include "ops/elementwise.h"
#include "ops/moe_rules.h"
#include "plan/auto_plan.h"
#include "plan/kernels.h"
#include "plan/model_stats.h"
#include "train/dist_executor.h"
#include "train/faults.h"

namespace mt {

namespace fs = std::filesystem;

namespace {

// A template, not std::function: a capturing callable would allocate in every step.
template <typename F>
void for_each_moe(Model& m, F&& f) {
  for (int i = 0; i < m.num_layers(); ++i)
    if (auto* moe = dynamic_cast<MoeLayer*>(&m.ffn(i))) f(i, *moe);
}

double peak_rss_mb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;
}

// The data order: a fresh permutation of the sequences per epoch, derived from the seed only,
// so the position (a sequence count) is all a checkpoint needs to continue it.
class DataOrder {
 public:
  DataOrder(int64_t n, uint64_t seed) : n_(n), seed_(seed) {}
  int64_t at(int64_t cursor) {
    const int64_t epoch = cursor / n_;
    if (epoch != epoch_) {
      perm_.resize(static_cast<size_t>(n_));
      for (int64_t i = 0; i < n_; ++i) perm_[static_cast<size_t>(i)] = i;
      Rng rng = Rng(seed_).fork(static_cast<uint64_t>(epoch));
      for (int64_t i = n_ - 1; i > 0; --i)
        std::swap(perm_[static_cast<size_t>(i)], perm_[static_cast<size_t>(rng.below(i + 1))]);
      epoch_ = epoch;
    }
    return perm_[static_cast<size_t>(cursor % n_)];
  }

 private:
  int64_t n_;
  uint64_t seed_;
  int64_t epoch_ = -1;
  std::vector<int64_t> perm_;
};

// The injected gradient fault (train/faults.h): one element of the first trainable gradient.
void poison_gradient(Model& m) {
  for (const auto& p : m.params().all())
    if (p->trainable() && p->grad.defined() && p->grad.numel() > 0) {
      MT_CHECK(p->grad.device() == Device::CPU, ValueError,
               "MOETRAIN_FAULT_NAN=grad injects into host gradients only");
      p->grad.f32()[0] = std::nanf("");
      p->grad_zero = false;  // a layer that takes the mark would write over the NaN
      return;
    }
}

// Loss targets of sequence `s`. Every rank walks the whole global micro-batch, so counting them
// here gives every rank the global count without a collective.
int64_t sequence_targets(const PackedData& d, int64_t s) {
  const auto first = d.targets.begin() + static_cast<ptrdiff_t>(s * d.seq_len);
  return std::count_if(first, first + static_cast<ptrdiff_t>(d.seq_len),
                       [](int32_t t) { return t != kIgnoreIndex; });
}

std::string format_eta(double s) {
  char b[32];
  const auto t = static_cast<long long>(s);
  std::snprintf(b, sizeof b, "%lld:%02lld", t / 60, t % 60);
  return b;
}

}  // namespace

double LocalExecutor::forward_backward(const Batch& host) {
  const Batch& b = staged_.stage(host, ctx_.device());
  model_.set_images(&host.images);  // the batch outlives this step only
  const double loss = model_.forward(ctx_, b.seq, b.ids, b.targets, 0, Model::Pass::Train);
  model_.set_images(nullptr);
  model_.backward(ctx_);
  return loss;
}

double LocalExecutor::forward_loss(const Batch& host) {
  const Batch& b = staged_.stage(host, ctx_.device());
  model_.set_images(&host.images);
  const double loss = model_.forward(ctx_, b.seq, b.ids, b.targets, 0, Model::Pass::Eval);
  model_.set_images(nullptr);
  // Evaluation runs between steps: its routing must not count as training load.
  for_each_moe(model_, [](int, MoeLayer& m) { m.reset_expert_load(); });
  return loss;
}

void fill_layer_load(LayerLoad& s, int layer, const std::vector<int64_t>& l) {
  s.layer = layer;
  s.load.assign(l.begin(), l.end());
  s.max_over_mean = s.hot_cold = 0;
  s.dead = 0;
  int64_t mx = 0, mn = INT64_MAX, sum = 0;
  for (int64_t v : l) {
    mx = std::max(mx, v);
    sum += v;
    if (v > 0) mn = std::min(mn, v);
    s.dead += v == 0;
  }
  const double mean = l.empty() ? 0 : static_cast<double>(sum) / static_cast<double>(l.size());
  s.max_over_mean = mean > 0 ? static_cast<double>(mx) / mean : 0;
  s.hot_cold = mn == INT64_MAX ? 0 : static_cast<double>(mx) / static_cast<double>(mn);
}

double LocalExecutor::optimizer_step(float lr, double grad_scale) {
  model_.params().grads(grads_);
  if (grad_scale != 1.0)
    for (Tensor& g : grads_) ops::scale(ctx_, g, static_cast<float>(grad_scale), g);
  const double norm = opt_.step(ctx_, model_.params(), lr);
  if (!std::isfinite(norm)) {  // not applied (train.nonfinite): its routing loads go too
    for_each_moe(model_, [](int, MoeLayer& m) { m.reset_expert_load(); });
    return norm;
  }
  // Refilled in place: the vectors keep their capacity from the first step.
  size_t n = 0;
  for_each_moe(model_, [&](int layer, MoeLayer& m) {
    if (n == load_.size()) load_.emplace_back();
    fill_layer_load(load_[n++], layer, m.expert_load());
    m.update_selection_bias(ctx_);
    m.reset_expert_load();
  });
  load_.resize(n);
  return norm;
}

std::string LocalExecutor::save(const std::string& root, const TrainState& st,
                                const std::string& job_toml) {
  return save_checkpoint(root, model_, &opt_, st, job_toml);
}

TrainState LocalExecutor::load(const std::string& dir) {
  if (is_sharded_checkpoint(dir)) return load_sharded_checkpoint(dir, model_, &opt_);
  return load_checkpoint(dir, model_, &opt_);
}

double schedule_lr(const Job& job, int64_t step) {
  if (job.warmup > 0 && step <= job.warmup)
    return job.lr * static_cast<double>(step) / static_cast<double>(job.warmup);
  const double span = static_cast<double>(std::max<int64_t>(1, job.steps - job.warmup));
  const double frac = std::min(1.0, static_cast<double>(step - job.warmup) / span);
  const double lo = job.lr * job.min_lr_ratio;
  return lo + (job.lr - lo) * 0.5 * (1 + std::cos(3.141592653589793 * frac));
}

EvalResult evaluate(StepExecutor& exec, const PackedData& data, int64_t batch,
                    int64_t max_sequences) {
  const int64_t n =
      max_sequences > 0 ? std::min(max_sequences, data.sequences()) : data.sequences();
  double sum = 0;
  EvalResult r;
  for (int64_t s = 0; s < n; s += batch) {
    std::vector<int64_t> idx;
    for (int64_t k = s; k < std::min(n, s + batch); ++k) idx.push_back(k);
    Batch b = make_batch(data, idx);
    if (b.target_tokens == 0) continue;
    sum += exec.forward_loss(b) * static_cast<double>(b.target_tokens);
    r.tokens += b.target_tokens;
  }
  // No target token: the loss is absent (NaN, written as null in metrics), never a made-up 0.
  r.loss = r.tokens > 0 ? sum / static_cast<double>(r.tokens) : std::nan("");
  return r;
}

double unigram_baseline(const PackedData& train, const PackedData& heldout) {
  const int64_t v = std::max(train.vocab, heldout.vocab);
  std::vector<double> count(static_cast<size_t>(v), 1.0);  // add-one smoothing
  double total = static_cast<double>(v);
  for (int32_t t : train.targets)
    if (t != kIgnoreIndex) {
      count[static_cast<size_t>(t)] += 1;
      total += 1;
    }
  double ce = 0;
  int64_t n = 0;
  for (int32_t t : heldout.targets)
    if (t != kIgnoreIndex) {
      ce -= std::log(count[static_cast<size_t>(t)] / total);
      ++n;
    }
  return n > 0 ? ce / static_cast<double>(n) : std::nan("");  // absent, as in evaluate
}

namespace {

// The job with the planner's mesh and micro-batch (parallel.plan = "auto"); the resolved job
// records the chosen keys, so a rerun of its job.toml repeats the plan.
Job apply_auto_plan(const Job& job, const ModelConfig& cfg, int64_t seq, par::Comm* comm,
                    std::ostream& log) {
  const int64_t world = comm ? comm->size() : 1;
  plan::AutoRequest req{.cfg = cfg,
                        .freeze_base = job_model_options(job).freeze_base,
                        .world = world,
                        .seq = seq,
                        .batch = job.batch,
                        .grad_accum = job.grad_accum,
                        .fsdp = job.fsdp};
  if (job.mem_gb > 0) {
    req.mem_bytes = job.mem_gb * 1e9;
    req.mem_source = "parallel.mem_gb";
  } else {
    double host = plan::host_memory_bytes();
    // Every rank must choose the same plan: rank 0's host decides.
    if (comm) comm->broadcast(&host, 1, par::Elem::F64, 0);
    req.mem_bytes = host / static_cast<double>(world);
    req.mem_source = "host memory / " + std::to_string(world) + " rank(s)";
  }
  const plan::AutoPlan a = plan::choose_auto_plan(req);
  log << a.explanation;
  Job out = job;
  out.plan = "manual";
  out.ep = a.ep;
  out.a2a_chunks = a.a2a_chunks;
  out.shard_experts = a.shard_experts;
  out.shard_expert_weights = a.shard_expert_weights;
  out.fsdp = a.fsdp;
  out.recompute = plan::recompute_name(a.recompute);
  out.batch = a.batch;
  out.grad_accum = a.grad_accum;
  return out;
}

}  // namespace

TrainResult run_job(const Job& job_in, const TrainOptions& topt, std::ostream& out) {
  const PackedData train = load_dataset(job_in.train_data);
  std::map<std::string, PackedData> evals;
  for (const auto& [name, dir] : job_in.eval_data) evals.emplace(name, load_dataset(dir));

  const ModelConfig cfg = job_model_config(job_in);
  // Before anything collective (the auto plan broadcasts): every wait is bounded by the job's key.
  if (topt.world)
    topt.world->set_timeout(std::chrono::milliseconds(
        static_cast<int64_t>(std::llround(job_in.comm_timeout_s * 1000.0))));
  const FaultPlan faults = FaultPlan::from_env();
  std::ostringstream not_root;
  const bool root = !topt.world || topt.world->rank() == 0;
  const Job job = job_in.plan == "auto" ? apply_auto_plan(job_in, cfg, train.seq_len, topt.world,
                                                          root ? out : not_root)
                                        : job_in;
  for (const PackedData* d : [&] {
         std::vector<const PackedData*> all{&train};
         for (auto& [n, e] : evals) all.push_back(&e);
         return all;
       }())
    MT_CHECK(d->vocab <= cfg.vocab, ConfigError, "dataset vocabulary ", d->vocab,
             " exceeds the model's vocab_size ", cfg.vocab,
             " (token ids would fall outside the embedding)");
  // A mesh is validated before the model is allocated.
  std::unique_ptr<DistSetup> dist;
  const int world = topt.world ? topt.world->size() : 1;
  const int rank = topt.world ? topt.world->rank() : 0;
  if (topt.world) {
    MT_CHECK(job.batch % world == 0, ConfigError, "train.batch = ", job.batch,
             " must be a multiple of the world size ", world,
             " (each rank takes batch / world sequences of every micro-batch)");
    dist = std::make_unique<DistSetup>(*topt.world, cfg, job);
  }
  std::ostringstream quiet;
  std::ostream& log = rank == 0 ? out : quiet;
  int threads = job.threads;
  if (threads == 0 && world > 1)  // ranks share the host's cores (one host assumed)
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / world);
  const Device device = job_device(job);
  ModelOptions mopt = job_model_options(job);
  // A GPU mesh: one process per GPU, device = local rank % visible GPUs, and the trainer's
  // collectives over NCCL (made below, once the rank's context exists).
  const bool gpu_mesh = dist && device == Device::CUDA;
  int device_id = 0;
  std::string gpu_ranks;  // the banner's line of every rank's GPU
  if (gpu_mesh) {
    MT_CHECK(mopt.precision == Precision::fp32(), ConfigError, "model.precision = \"",
             job.precision,
             "\" on a GPU mesh: distributed training keeps fp32 parameters (flat "
             "fp32 shards and reductions); use model.precision = \"fp32\"");
    const int local = par::local_rank(*topt.world);
    device_id = local % std::max(1, cuda_device_count());
    std::vector<int64_t> ids(static_cast<size_t>(2 * world));
    const int64_t mine[2] = {local, device_id};
    topt.world->all_gather(mine, 2, ids.data(), par::Elem::I64);
    std::ostringstream line;
    line << "  GPUs (NCCL, one per rank, device = local rank % " << cuda_device_count() << "):";
    for (int r = 0; r < world; ++r)
      line << " rank " << r << " -> cuda:" << ids[static_cast<size_t>(2 * r + 1)];
    gpu_ranks = line.str() + "\n";
  }
  // On a GPU the planner sizes the op workspace (its estimate of the largest layer's scratch)
  // and the whole step is checked against the device's free memory before the model moves there.
  plan::MemoryBreakdown need;
  size_t workspace = ContextOptions{}.workspace_bytes;
  if (device == Device::CUDA) {
    plan::ParallelPlan pp;
    pp.mbs = job.batch;
    pp.seq = train.seq_len;
    pp.recompute =
        mopt.recompute == ActivationRecompute::Full ? plan::Recompute::Full : plan::Recompute::None;
    need = plan::predict_memory(
        cfg, pp,
        {.precision = mopt.precision, .freeze_base = mopt.freeze_base, .device = Device::CUDA});
    workspace = std::max(workspace, static_cast<size_t>(need.workspace));
  }
  Context ctx(ContextOptions{.device = device,
                             .device_id = device_id,
                             .threads = threads,
                             .seed = job.seed,
                             .workspace_bytes = workspace,
                             .deterministic = job.deterministic});
  MT_CHECK(device != Device::CPU || mopt.precision == Precision::fp32(), ConfigError,
           "model.precision = \"", job.precision,
           "\" cannot train on the CPU: its ops compute and store fp32 only (bf16 is for the CUDA "
           "engine: run.device = \"cuda\"; `moetrain plan --precision bf16` sizes it)");
  log << "device: " << ctx.describe() << "\n";
  if (gpu_mesh)
    dist->use_nccl(*topt.world, ctx,
                   {.timeout = std::chrono::milliseconds(
                        static_cast<int64_t>(std::llround(job.comm_timeout_s * 1000.0)))});
  // The kernel registry picks every layer's kernels; the choice and any fallback's reason are
  // logged once.
  mopt.kernels = plan::layer_kernels(
      cfg, device == Device::CUDA ? plan::Backend::Cuda : plan::Backend::Cpu, job.precision);
  log << plan::describe_kernels(cfg, mopt.kernels);
  // Under a mesh on the host, an HF directory's weights are read slice by slice once the mesh has
  // sliced the model, so no rank builds or reads the whole model (docs/parallelism.md).
  const bool fresh = topt.resume_from.empty() && !topt.resume;
  const bool tty_log = job.progress == "tty" || (job.progress == "auto" && isatty(fileno(stdout)));
  const bool sliced_load =
      dist && device == Device::CPU && job.init.empty() && !job.model_dir.empty() && fresh;
  mopt.defer_weights = sliced_load;
  Model model(cfg, job.seed, mopt);
  TrainResult r;
  r.total = model.params().count();  // before a mesh slices the experts
  r.trainable = model.params().count(true);
  if (!job.init.empty() && (topt.resume_from.empty() && !topt.resume)) {
    // Before experts are sliced: every rank loads the full weights, then keeps its share.
    std::string w = job.init;
    if (fs::is_regular_file(fs::path(w) / "latest")) w = latest_checkpoint(w);
    load_weights(w, model);
  } else if (!job.model_dir.empty() && fresh && !sliced_load) {
    // The HF directory's weights, streamed tensor by tensor; adapters keep their fresh values.
    const HfConfig hf = load_hf_config(job.model_dir);
    SafetensorsModel st(job.model_dir, fp8_blocks(hf));
    ImportOptions io{.keep_lora = true};
    if (job.progress != "off") io.progress = progress_printer(log, job.model_dir, tty_log);
    import_hf_tensors(model, hf.model_type, st, job.model_dir, io);
  }
  // Built and loaded on the host, then moved: the loaders and the initialisation stay
  // device-independent, and the GPU model starts from the CPU model's values. The plan is checked
  // against the device first, so a step that cannot fit stops here with its breakdown.
  if (device == Device::CUDA) {
    const DeviceMemory m = device_memory();  // the workspace is allocated already
    MT_CHECK(need.total() - need.workspace <= static_cast<double>(m.free), MemoryError,
             "the plan needs ", need.total() / double(size_t(1) << 30), " GiB on the GPU (",
             need.to_json().dump(), ") and ", static_cast<double>(m.free) / double(size_t(1) << 30),
             " GiB are free: lower train.batch or the sequence length, train LoRA adapters "
             "instead of full weights (lora.targets), use model.precision = \"bf16\", or "
             "recompute activations");
  }
  model.to_device(device);
  const AdamWOptions adam{.beta1 = job.beta1,
                          .beta2 = job.beta2,
                          .eps = job.eps,
                          .weight_decay = job.weight_decay,
                          .clip_norm = job.clip};
  // Before the executor: the skew device edits router biases that a mesh then shards.
  std::unique_ptr<balance::TrainBalancer> balancer;
  if (job.balance.any()) {
    const int64_t E = cfg.moe.num_experts;
    // One process simulates job.ep ranks; an EP size that does not fit the experts is an error
    // here as it is on a mesh (it used to fall back to 1 silently).
    const int64_t ep = dist ? dist->mesh.ep : job.ep;
    const std::string bad = ops::expert_parallel_error(ep, E);
    MT_CHECK(bad.empty(), ConfigError, "parallel.ep: ", bad);
    balancer = std::make_unique<balance::TrainBalancer>(job.balance, model, ep, topt.world);
  }
  std::unique_ptr<AdamW> opt;
  std::unique_ptr<StepExecutor> exec_ptr;
  if (dist) {
    log << dist->mesh.describe() << gpu_ranks;
    if (sliced_load) {
      const HfConfig hf = load_hf_config(job.model_dir);
      SafetensorsModel st(job.model_dir, fp8_blocks(hf));
      const HfSliceReader reader(model, hf.model_type, st, job.model_dir, {.keep_lora = true});
      // Every rank reports to its own log; only rank 0's is printed (the slices are alike).
      par::LoadProgress progress;
      if (job.progress != "off")
        progress = progress_printer(log, job.model_dir + " (this rank's slices)", tty_log);
      exec_ptr = make_dist_executor(
          ctx, model, *dist, adam,
          [&](const std::string& name, int64_t b, int64_t e, float* dst) {
            reader.read(model.params().at(name), b, e, dst);
          },
          progress);
      if (job.progress != "off")
        log << "loaded " << job.model_dir << ": this rank's slices, "
            << static_cast<double>(reader.elements_read()) * 4 / 1e6 << " MB of "
            << static_cast<double>(st.total_bytes()) / 1e6 << " MB in the files\n";
    } else {
      exec_ptr = make_dist_executor(ctx, model, *dist, adam);
    }
  } else {
    opt = std::make_unique<AdamW>(model.params(), adam);
    exec_ptr = std::make_unique<LocalExecutor>(ctx, model, *opt);
  }
  StepExecutor& exec = *exec_ptr;
  if (topt.dry_run) {
    // Every rank reports its own shards (whole lines, so mpirun's output stays readable).
    std::ostringstream line;
    line << "dry run rank " << rank << "/" << world << ": ";
    const std::string m = exec.memory_line();
    if (m.empty())
      line << "parameters " << model.params().count() << " (one process)";
    else
      line << m;
    out << line.str() + "\n" << std::flush;
    return r;
  }

  const std::string ckpt_root = (fs::path(job.run_dir) / "checkpoints").string();
  const std::string job_toml = job.to_toml();
  if (rank == 0) {
    fs::create_directories(ckpt_root);
    std::ofstream(fs::path(job.run_dir) / "job.toml.tmp") << job_toml;
    fs::rename(fs::path(job.run_dir) / "job.toml.tmp", fs::path(job.run_dir) / "job.toml");
  }

  TrainState st{.rng_seed = ctx.rng().seed(), .rng_counter = ctx.rng().counter()};
  std::string resume = topt.resume_from;
  if (topt.resume && resume.empty()) {
    resume = latest_checkpoint(ckpt_root);
    MT_CHECK(!resume.empty(), IoError, "--resume: no checkpoint under '", ckpt_root, "'");
  }
  if (!resume.empty()) {
    st = exec.load(resume);
    ctx.rng() = Rng(st.rng_seed, st.rng_counter);
    log << "resumed from " << resume << " at step " << st.step << "\n";
    if (st.precision != precision_name(mopt.precision))
      log << "checkpoint precision " << st.precision << ", this run "
          << precision_name(mopt.precision)
          << ": trainable parameters from their fp32 masters, frozen weights converted\n";
  }

  log << "model " << job.model << ": " << r.total << " parameters, " << r.trainable
      << " trainable (" << 100.0 * static_cast<double>(r.trainable) / static_cast<double>(r.total)
      << "%), " << train.sequences() << " training sequences of " << train.seq_len << "\n";

  std::ofstream metrics;
  if (rank == 0) metrics.open(fs::path(job.run_dir) / "metrics.jsonl", std::ios::app);
  const bool tty = job.progress == "tty" || (job.progress == "auto" && isatty(fileno(stdout)));
  const bool show = job.progress != "off";
  DataOrder order(train.sequences(), job.seed);
  r.first_step = st.step + 1;
  const auto t0 = std::chrono::steady_clock::now();
  int64_t tokens_done = 0;

  auto run_eval = [&](int64_t step) {
    nlohmann::json e = nlohmann::json::object();
    for (auto& [name, d] : evals) {
      EvalResult er = evaluate(exec, d, job.batch, job.eval_sequences);
      r.eval[name] = er;
      e[name] = {{"loss", er.loss}, {"ppl", std::exp(er.loss)}, {"tokens", er.tokens}};
    }
    metrics << nlohmann::json{{"step", step}, {"eval", e}}.dump() << "\n" << std::flush;
    return e;
  };

  for (int64_t step = st.step + 1; step <= job.steps; ++step) {
    const auto step_start = std::chrono::steady_clock::now();  // evaluation and saves excluded
    exec.zero_grad();
    // Before backward, which accumulates into it (+=): a mesh reduces its gradients in buckets
    // during the last micro-batch's backward, so a gradient changed after it would go unseen.
    if (faults.nan_at("grad", step, rank)) poison_gradient(model);
    double loss = 0;
    int64_t step_tokens = 0, step_targets = 0;
    for (int64_t a = 0; a < job.grad_accum; ++a) {
      // Every rank walks the same global order; rank r takes the r-th slice of the micro-batch.
      std::vector<int64_t> idx;
      const int64_t per_rank = job.batch / world;
      for (int64_t b = 0; b < job.batch; ++b) {
        const int64_t s = order.at(st.data_cursor++);
        step_targets += sequence_targets(train, s);
        if (b / per_rank == rank) idx.push_back(s);
      }
      Batch batch = make_batch(train, idx);
      loss += exec.forward_backward(batch) / static_cast<double>(job.grad_accum);
      if (balancer) balancer->after_forward(step);
      step_tokens += batch.seq.tokens * world;
    }
    if (faults.nan_at("loss", step, rank)) loss = std::nan("");
    const double lr = schedule_lr(job, step);
    // A non-finite loss scales the gradients by NaN: the executor's norm, reduced over every rank
    // on a mesh, is then NaN everywhere and every rank skips the update together.
    const bool bad_loss = !std::isfinite(loss);
    const double gnorm =
        exec.optimizer_step(static_cast<float>(lr),
                            bad_loss ? std::nan("") : 1.0 / static_cast<double>(job.grad_accum));
    const bool skipped = !std::isfinite(gnorm);
    if (skipped) {
      ++r.skipped_steps;
      const std::string what =
          bad_loss ? cat("loss ", loss) : cat("gradient norm ", gnorm, " (loss ", loss, ")");
      metrics << nlohmann::json{{"step", step},
                                {"nonfinite", what},
                                {"policy", job.nonfinite},
                                {"skipped_steps", r.skipped_steps}}
                     .dump()
              << "\n"
              << std::flush;
      MT_CHECK(job.nonfinite == "skip", ValueError, "step ", step, ": non-finite ", what,
               ", found before the optimizer step; nothing was applied and the run stops "
               "(train.nonfinite = \"stop\"; \"skip\" skips such steps). The last checkpoint: ",
               r.checkpoint.empty() ? "none written by this run" : r.checkpoint);
      log << "step " << step << ": non-finite " << what << ", skipped (train.nonfinite = \"skip\"; "
          << r.skipped_steps << " so far)\n";
    }
    if (balancer && !skipped) {
      std::vector<std::vector<int64_t>> loads(static_cast<size_t>(model.num_layers()));
      for (const LayerLoad& l : exec.expert_load()) loads.at(static_cast<size_t>(l.layer)) = l.load;
      if (const int c = balancer->after_step(loads); c > 0) exec.set_a2a_chunks(c);
      if (auto place = balancer->placement(step); !place.empty()) exec.place_experts(place);
    }
    st.step = step;
    tokens_done += step_tokens;
    // A step without a target token has no loss: logged as absent (NaN, null in metrics.jsonl),
    // not the 0 its micro-batches report. Its update (auxiliary losses, decay) still applies.
    if (step_targets == 0) loss = std::nan("");
    r.losses.push_back(loss);
    const auto step_end = std::chrono::steady_clock::now();
    r.step_seconds.push_back(std::chrono::duration<double>(step_end - step_start).count());
    r.seconds = std::chrono::duration<double>(step_end - t0).count();
    r.tokens_per_s = static_cast<double>(tokens_done) / r.seconds;
    const double eta = r.seconds / static_cast<double>(step - r.first_step + 1) *
                       static_cast<double>(job.steps - step);

    if (step % job.log_every == 0 || step == job.steps) {
      nlohmann::json loads = nlohmann::json::array();
      for (const LayerLoad& l : exec.expert_load())
        loads.push_back({{"layer", l.layer},
                         {"max_over_mean", l.max_over_mean},
                         {"hot_cold", l.hot_cold},
                         {"dead", l.dead}});
      nlohmann::json aux = nlohmann::json::object();
      for (const AuxLoss& a : exec.aux_losses()) aux[a.name] = a.value;
      nlohmann::json line{{"step", step},
                          {"loss", loss},
                          {"loss_per_corpus", {{"train", loss}}},
                          {"lr", lr},
                          {"grad_norm", gnorm},
                          {"skipped_steps", r.skipped_steps},
                          {"tokens_per_s", r.tokens_per_s},
                          {"step_seconds", r.step_seconds.back()},
                          {"peak_rss_mb", peak_rss_mb()},
                          {"expert_load", loads},
                          {"aux", aux}};
      exec.add_metrics(line);
      if (balancer) balancer->add_metrics(line);
      metrics << line.dump() << "\n";
    }
    if (show) {
      char line[200];
      std::snprintf(
          line, sizeof line,
          "step %5lld/%lld  loss %s  lr %.2e  grad-norm %.3f  %.0f tok/s  eta %s",
          static_cast<long long>(step), static_cast<long long>(job.steps),
          step_targets == 0 ? "absent" : cat(std::fixed, std::setprecision(4), loss).c_str(), lr,
          gnorm, r.tokens_per_s, format_eta(eta).c_str());
      if (tty)
        log << "\r" << line << (step == job.steps ? "\n" : "") << std::flush;
      else if (step % job.log_every == 0 || step == job.steps)
        log << line << "\n";
    }
    if (job.eval_every > 0 && step % job.eval_every == 0 && step != job.steps) run_eval(step);
    const bool last = step == job.steps;
    if (topt.save_checkpoints &&
        (last || (job.checkpoint_every > 0 && step % job.checkpoint_every == 0))) {
      st.rng_seed = ctx.rng().seed();
      st.rng_counter = ctx.rng().counter();
      try {
        r.checkpoint = exec.save(ckpt_root, st, job_toml);
        if (exec.is_root()) prune_checkpoints(ckpt_root, job.checkpoint_keep);
      } catch (const IoError& e) {
        // On a mesh every rank gets the same error (save_sharded agrees), so all decide alike.
        if (job.checkpoint_on_error == "stop") throw;
        ++r.failed_saves;
        metrics << nlohmann::json{{"step", step},
                                  {"checkpoint_error", e.message()},
                                  {"failed_saves", r.failed_saves}}
                       .dump()
                << "\n"
                << std::flush;
        log << "step " << step << ": " << e.message()
            << "; training continues (checkpoint.on_error = \"continue\"), the next save retries; "
               "the latest checkpoint is "
            << (r.checkpoint.empty() ? latest_checkpoint(ckpt_root) : r.checkpoint) << "\n";
      }
    }
  }
  if (!evals.empty()) {
    nlohmann::json e = run_eval(st.step);
    if (show) log << "eval at step " << st.step << ": " << e.dump() << "\n";
  }
  return r;
}

}  // namespace mt
