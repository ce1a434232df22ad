#include "train/dist_executor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/moe_layer.h"
#include "parallel/dist_trainer.h"
#include "parallel/nccl_comm.h"
#include "train/checkpoint_reader.h"
#include "train/dataset.h"
#include "train/device_batch.h"
#include "train/faults.h"
#include "train/files.h"

namespace mt {

namespace fs = std::filesystem;

namespace {

// The measurement knobs of the distributed step (docs/parallelism.md, "Measuring overlap"),
// read by DistSetup and nowhere else; unset in normal runs.
double env_number(const char* name, double otherwise) {
  const char* v = std::getenv(name);
  if (!v || !*v) return otherwise;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  MT_CHECK(end && *end == '\0' && x >= 0, ConfigError, name, " = '", v,
           "' is not a non-negative number");
  return x;
}

std::string step_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  return name;
}

std::string save_sharded(const std::string& root, par::Comm& world,
                         const std::vector<par::ShardPiece>& pieces, const TrainState& st,
                         int64_t optimizer_steps, const ModelConfig& cfg, const par::Mesh& mesh,
                         const std::string& job_toml) {
  const std::string name = step_name(st.step);
  const fs::path final_dir = fs::path(root) / name;
  const fs::path tmp = fs::path(root) / (name + ".tmp");
  SaveFaults faults(FaultPlan::from_env(), st.step);
  // A failure on any rank (a full disk) fails the save on every rank, at the same point, so the
  // job's checkpoint policy (checkpoint.on_error) decides the same everywhere and no rank waits
  // in a barrier for one that threw.
  std::string error;
  auto agree = [&](const std::function<void()>& part) {
    if (error.empty()) {
      try {
        part();
      } catch (const Error& e) {
        error = e.message();
      } catch (const fs::filesystem_error& e) {
        error = e.what();
      }
    }
    const int64_t failed = world.all_reduce_sum(static_cast<int64_t>(error.empty() ? 0 : 1));
    if (failed == 0) return;
    if (world.rank() == 0) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
    }
    MT_THROW(IoError, "checkpoint '", final_dir.string(), "' not saved: ",
             error.empty() ? cat(failed, " rank(s) failed to write their shard") : error);
  };
  // A shared file system is assumed: rank 0 prepares the directory every rank writes into.
  agree([&] {
    if (world.rank() == 0) {
      fs::remove_all(tmp);
      fs::create_directories(tmp);
    }
  });
  char file[64];
  std::snprintf(file, sizeof file, "shard-%05d-of-%05d.safetensors", world.rank(), world.size());
  agree([&] {
    TensorMap tensors;
    MetadataMap meta;
    for (const par::ShardPiece& p : pieces) {
      tensors[cat(p.name, "@", p.begin)] = p.data;
      meta[p.name] = nlohmann::json(p.full_shape.dims()).dump();
    }
    faults.before_file(tmp / file);
    write_safetensors((tmp / file).string(), tensors, meta);
    faults.after_file(tmp / file);
  });
  agree([&] {
    if (world.rank() != 0) return;
    nlohmann::json index = {{"format", kShardedCheckpointFormat},
                            {"world", mesh.world},
                            {"ep", mesh.ep},
                            {"tensors", {}}};
    for (int r = 0; r < world.size(); ++r) {
      std::snprintf(file, sizeof file, "shard-%05d-of-%05d.safetensors", r, world.size());
      MetadataMap m;
      for (const SafetensorsEntry& e : read_safetensors_header((tmp / file).string(), &m)) {
        const size_t at = e.name.rfind('@');
        const std::string t = e.name.substr(0, at);
        const int64_t begin = std::stoll(e.name.substr(at + 1));
        nlohmann::json& entry = index["tensors"][t];
        entry["shape"] = nlohmann::json::parse(m.at(t));
        entry["pieces"].push_back(
            {{"file", file}, {"key", e.name}, {"begin", begin}, {"end", begin + e.shape.at(0)}});
      }
    }
    auto write = [&](const char* f, const std::string& text) {
      faults.before_file(tmp / f);
      write_file_atomic(tmp / f, text);
      faults.after_file(tmp / f);
    };
    write("index.json", index.dump(1));
    const nlohmann::json state = {{"step", st.step},
                                  {"data_cursor", st.data_cursor},
                                  {"rng_seed", st.rng_seed},
                                  {"rng_counter", st.rng_counter},
                                  {"optimizer_steps", optimizer_steps},
                                  {"model_config", cfg.to_json()}};
    write("state.json", state.dump(2));
    write("job.toml", job_toml);
    nlohmann::json files = nlohmann::json::object();
    for (const auto& e : fs::directory_iterator(tmp))
      files[e.path().filename().string()] = {{"bytes", fs::file_size(e.path())},
                                             {"fnv1a64", file_checksum(e.path())}};
    write("manifest.json", nlohmann::json{{"files", files}}.dump(2));
    commit_checkpoint(root, name, faults);
  });
  return final_dir.string();
}

class DistExecutor : public StepExecutor {
 public:
  DistExecutor(Context& ctx, Model& model, DistSetup& s, const AdamWOptions& adam)
      : ctx_(ctx),
        model_(model),
        setup_(s),
        trainer_(model, s.mesh, s.groups,
                 {.a2a_chunks = s.a2a_chunks,
                  .adam = adam,
                  .fsdp = s.fsdp,
                  .shard_expert_weights = s.mesh.shard_expert_weights,
                  .exchange_at_ep1 = s.exchange_at_ep1,
                  .bucket_mib = s.bucket_mib,
                  .micro_batches = s.micro_batches}) {}

  void zero_grad() override { trainer_.zero_grad(); }
  std::string memory_line() const override {
    const par::MemoryReport m = trainer_.memory();
    std::ostringstream s;
    s << "parameters " << m.params << " B (FSDP shards " << m.fsdp_shards << " B, of which experts "
      << m.expert_shards << " B), gradients " << m.grads << " B, optimizer " << m.optimizer
      << " B, step buffers " << m.transient << " B, recompute "
      << (model_.recompute() == ActivationRecompute::None        ? "none"
          : model_.recompute() == ActivationRecompute::Selective ? "selective"
                                                                 : "full");
    return s.str();
  }
  // On a GPU the batch is staged into buffers kept across steps; its valid targets are counted
  // on the host copy.
  double forward_backward(const Batch& host) override {
    const Batch& b = staged_.stage(host, ctx_.device());
    return trainer_.forward_backward(ctx_, b.seq, b.ids, b.targets, host.target_tokens);
  }
  // Every rank evaluates the same batch (the experts need every rank in the exchange), so the
  // loss is already global.
  double forward_loss(const Batch& host) override {
    const Batch& b = staged_.stage(host, ctx_.device());
    const double loss = model_.forward(ctx_, b.seq, b.ids, b.targets, 0, Model::Pass::Eval);
    for (MoeLayer* m : model_.moe_layers())
      if (m) m->reset_expert_load();
    return loss;
  }
  double optimizer_step(float lr, double grad_scale) override {
    const double norm = trainer_.optimizer_step(ctx_, lr, grad_scale);
    // Refilled in place: the vectors keep their capacity from the first step.
    size_t n = 0;
    const auto& loads = trainer_.global_loads();
    for (size_t i = 0; i < loads.size(); ++i) {
      if (loads[i].empty()) continue;
      if (n == load_.size()) load_.emplace_back();
      fill_layer_load(load_[n++], static_cast<int>(i), loads[i]);
    }
    load_.resize(n);
    return norm;
  }
  const std::vector<LayerLoad>& expert_load() override { return load_; }
  const std::vector<AuxLoss>& aux_losses() override {
    aux_ = model_.aux_losses();
    for (AuxLoss& x : aux_) x.value = world().all_reduce_sum(x.value) / world().size();
    return aux_;
  }
  std::string save(const std::string& root, const TrainState& st,
                   const std::string& job_toml) override {
    return save_sharded(root, world(), trainer_.checkpoint_pieces(), st, trainer_.optimizer_steps(),
                        model_.config(), setup_.mesh, job_toml);
  }
  void load_weights(const par::PieceReader& read, const par::LoadProgress& progress) {
    trainer_.load_weights(read, progress);
  }
  TrainState load(const std::string& dir) override {
    MT_CHECK(fs::is_directory(dir), IoError, "checkpoint '", dir, "' does not exist");
    const CheckpointReader src(dir, model_.config());
    trainer_.load_pieces(
        [&](const std::string& n, int64_t b, int64_t e, float* out) { src.read(n, b, e, out); },
        src.optimizer_steps());
    return src.train_state();
  }
  bool is_root() const override { return setup_.mesh.rank == 0; }
  void place_experts(const std::vector<std::vector<int32_t>>& expert_rank) override {
    experts_moved_ += trainer_.place_experts(expert_rank);
  }
  void set_a2a_chunks(int chunks) override {
    for (MoeLayer* m : model_.moe_layers())
      if (m)
        if (auto* ep = dynamic_cast<par::ExpertParallel*>(m->expert_compute()))
          ep->set_chunks(chunks);
  }
  // Totals over ranks of the step's communication, the slowest rank's times, and the rows each
  // rank's experts computed.
  void add_metrics(nlohmann::json& line) override {
    if (experts_moved_ > 0) {  // placement ran since the last line
      line["placement"] = {{"experts_moved", experts_moved_}};
      experts_moved_ = 0;
    }
    const par::StepMetrics& m = trainer_.metrics();
    par::CommStats all;
    for (const par::CommStats* c : {&m.world, &m.ep, &m.edp})
      for (int k = 0; k < par::kNumCollectives; ++k) {
        all.per[k].calls += c->per[k].calls;
        all.per[k].bytes_sent += c->per[k].bytes_sent;
        all.per[k].bytes_recv += c->per[k].bytes_recv;
        all.per[k].seconds += c->per[k].seconds;
        all.per[k].device_seconds += c->per[k].device_seconds;
      }
    const int W = world().size();
    // Per rank: 4 totals, then per collective bytes sent and received, calls, device seconds.
    std::vector<double> mine = {m.comm_seconds(), m.idle_seconds(),
                                static_cast<double>(m.rows_received), m.device_seconds()};
    for (int k = 0; k < par::kNumCollectives; ++k) {
      mine.push_back(static_cast<double>(all.per[k].bytes_sent));
      mine.push_back(static_cast<double>(all.per[k].bytes_recv));
      mine.push_back(static_cast<double>(all.per[k].calls));
      mine.push_back(all.per[k].device_seconds);
    }
    const auto n = static_cast<int64_t>(mine.size());
    std::vector<double> every(mine.size() * static_cast<size_t>(W));
    world().all_gather(mine.data(), n, every.data(), par::Elem::F64);
    nlohmann::json comm = nlohmann::json::object(), calls = nlohmann::json::object();
    double comm_max = 0, idle_max = 0, device_max = 0;
    nlohmann::json rows = nlohmann::json::array(), idle = nlohmann::json::array();
    for (int r = 0; r < W; ++r) {
      const double* v = every.data() + static_cast<size_t>(r) * mine.size();
      comm_max = std::max(comm_max, v[0]);
      idle_max = std::max(idle_max, v[1]);
      device_max = std::max(device_max, v[3]);
      rows.push_back(static_cast<int64_t>(v[2]));
      idle.push_back(v[1]);
    }
    for (int k = 0; k < par::kNumCollectives; ++k) {
      double sent = 0, recv = 0, ncalls = 0, device = 0;
      for (int r = 0; r < W; ++r) {
        const double* v = every.data() + static_cast<size_t>(r) * mine.size() + 4 + 4 * k;
        sent += v[0];
        recv += v[1];
        ncalls += v[2];
        device = std::max(device, v[3]);
      }
      const char* name = par::collective_name(static_cast<par::Collective>(k));
      if (ncalls > 0)
        calls[name] = {{"calls", static_cast<int64_t>(ncalls)}, {"device_ms_max", device * 1e3}};
      if (sent == 0 && recv == 0) continue;
      comm[name] = {{"bytes_sent", static_cast<int64_t>(sent)},
                    {"bytes_recv", static_cast<int64_t>(recv)}};
    }
    line["comm"] = {{"world", W},
                    {"seconds_max", comm_max},
                    {"idle_seconds_max", idle_max},
                    {"idle_seconds_per_rank", idle},
                    {"rows_received_per_rank", rows},
                    {"device_seconds_max", device_max},
                    {"bytes", comm},
                    {"collectives", calls}};
  }

 private:
  par::Comm& world() { return *setup_.groups.world; }
  Context& ctx_;
  Model& model_;
  DistSetup& setup_;
  par::DistTrainer trainer_;
  DeviceBatch staged_;
  int64_t experts_moved_ = 0;  // by placement since the last metrics line
  std::vector<LayerLoad> load_;
  std::vector<AuxLoss> aux_;  // aux_losses()' result, averaged over ranks
};

}  // namespace

DistSetup::DistSetup(par::Comm& world, const ModelConfig& cfg, const Job& job)
    : mesh(par::make_mesh(world.size(), world.rank(), cfg.moe.num_experts,
                          {.ep = static_cast<int>(job.ep),
                           .shard_experts = job.shard_experts || job.shard_expert_weights,
                           .shard_expert_weights = job.shard_expert_weights})),
      groups(par::make_groups(world, mesh)),
      a2a_chunks(static_cast<int>(job.a2a_chunks)),
      fsdp(job.fsdp),
      micro_batches(static_cast<int>(job.grad_accum)),
      bucket_mib(env_number("MOETRAIN_BUCKET_MIB", par::DistOptions{}.bucket_mib)),
      exchange_at_ep1(env_number("MOETRAIN_EXCHANGE_AT_EP1", 0) != 0) {}

void DistSetup::use_nccl(par::Comm& world, Context& ctx, const par::CommOptions& opt) {
  par::CommOptions o = opt;
  o.simulated_us =
      std::llround(env_number("MOETRAIN_SIM_COMM_US", static_cast<double>(opt.simulated_us)));
  o.overlap = env_number("MOETRAIN_COMM_OVERLAP", opt.overlap ? 1 : 0) != 0;
  transport = par::make_nccl_comm(world, ctx, o);
  groups = par::make_groups(*transport, mesh);
}

std::unique_ptr<StepExecutor> make_dist_executor(Context& ctx, Model& model, DistSetup& setup,
                                                 const AdamWOptions& adam,
                                                 const par::PieceReader& weights,
                                                 const par::LoadProgress& progress) {
  auto exec = std::make_unique<DistExecutor>(ctx, model, setup, adam);
  if (weights) exec->load_weights(weights, progress);
  return exec;
}

bool is_sharded_checkpoint(const std::string& dir) {
  return fs::is_regular_file(fs::path(dir) / "index.json");
}

TrainState load_sharded_checkpoint(const std::string& dir, Model& model, AdamW* opt) {
  const CheckpointReader src(dir, model.config());
  // A GPU model (or a bf16 value) is filled from an fp32 host copy.
  Tensor host;
  auto read = [&](const std::string& name, Tensor& dst) {
    if (dst.device() == Device::CPU && dst.dtype() == DType::F32) {
      src.read(name, 0, dst.numel(), dst.f32());
      return;
    }
    if (!host.defined() || host.numel() < dst.numel()) host = Tensor::empty({dst.numel()});
    Tensor h = host.rows(0, dst.numel());
    src.read(name, 0, dst.numel(), h.f32());
    dst.copy_from(h);
  };
  size_t i = 0;
  for (const auto& p : model.params().all()) {
    // A parameter stored narrower than its fp32 master takes the checkpoint's fp32 values in the
    // master, then their rounding.
    Tensor* master =
        opt && p->trainable() && opt->masters().at(i).defined() ? &opt->masters()[i] : nullptr;
    read(p->name, master ? *master : p->value);
    if (master) p->value.copy_from(*master);
    if (!opt || !p->trainable()) continue;
    read("m." + p->name, opt->first_moments().at(i));
    read("v." + p->name, opt->second_moments().at(i));
    ++i;
  }
  if (opt) opt->set_steps(src.optimizer_steps());
  return src.train_state();
}

}  // namespace mt
