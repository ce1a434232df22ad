#include "parallel/dist_trainer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>

#include "model/moe_layer.h"
#include "parallel/dist_unit.h"
#include "parallel/fsdp.h"

namespace mt::par {

namespace {

std::string unit_name(int unit, int units) {
  if (unit == 0) return "embedding";
  if (unit == units - 1) return "head";
  return "layer " + std::to_string(unit - 1);
}

void add_stats(CommStats& into, const CommStats& s) {
  for (int c = 0; c < kNumCollectives; ++c) into.per[c] += s.per[c];
}

}  // namespace
double StepMetrics::comm_seconds() const {
  return world.total().seconds + ep.total().seconds + edp.total().seconds;
}

double StepMetrics::idle_seconds() const {
  return world.total().idle_seconds + ep.total().idle_seconds + edp.total().idle_seconds;
}

double StepMetrics::device_seconds() const {
  return world.total().device_seconds + ep.total().device_seconds + edp.total().device_seconds;
}

std::string StepMetrics::line(int rank) const {
  std::ostringstream os;
  os << "rank " << rank << ": comm " << comm_seconds() * 1e3 << " ms (idle " << idle_seconds() * 1e3
     << " ms, on the device " << device_seconds() * 1e3 << " ms), rows received " << rows_received;
  CommStats all;
  add_stats(all, world);
  add_stats(all, ep);
  add_stats(all, edp);
  for (int c = 0; c < kNumCollectives; ++c) {
    const CollectiveStats& s = all.per[c];
    if (s.calls == 0) continue;
    os << ", " << collective_name(static_cast<Collective>(c)) << " x" << s.calls << " sent "
       << s.bytes_sent << " B recv " << s.bytes_recv << " B";
  }
  return os.str();
}

DistTrainer::DistTrainer(Model& model, const Mesh& mesh, ProcessGroups& groups,
                         const DistOptions& opt)
    : model_(model),
      dev_(model.params().device()),
      mesh_(mesh),
      g_(groups),
      opt_(opt),
      moe_layers_(model.moe_layers()) {
  MT_CHECK(groups.world && groups.world->size() == mesh.world, InternalError,
           "process groups do not match the mesh");
  MT_CHECK(groups.world->memory() == dev_, ConfigError, "a model on ", device_name(dev_),
           " with a communicator of ", device_name(groups.world->memory()),
           " memory (MPI and the local comm move host memory, NCCL GPU memory)");
  for (const auto& p : model.params().all())
    MT_CHECK(is_placeholder(p->value) || p->value.dtype() == DType::F32, ConfigError,
             "distributed training keeps fp32 parameters (flat fp32 shards and reductions); ",
             p->name, " is ", dtype_name(p->value.dtype()),
             " (model.precision = \"fp32\" on a mesh)");
  std::vector<MoeLayer*> moes;
  for (MoeLayer* m : model.moe_layers())
    if (m) moes.push_back(m);
  if (!moes.empty()) {
    MT_CHECK(moes.front()->config().num_experts == mesh.num_experts, ConfigError, "mesh built for ",
             mesh.num_experts, " experts, the model has ", moes.front()->config().num_experts);
  }
  // Deferred weights this rank keeps whole get their memory now; the sliced ones get only their
  // slices (shard_experts, Fsdp), for load_pieces to fill.
  model.materialize_deferred([&](const Param& p) {
    return p.spec.per_expert ? mesh.ep == 1 && !opt.shard_expert_weights : !opt.fsdp;
  });
  if (mesh.ep > 1 || (opt.exchange_at_ep1 && !moes.empty())) {
    std::vector<ExpertCompute*> computes;
    // One set of exchange buffers for all layers: only one layer exchanges at a time.
    auto buffers = std::make_shared<DispatchBuffers>();
    for (size_t i = 0; i < moes.size(); ++i) {
      ep_.push_back(std::make_unique<ExpertParallel>(
          *groups.ep, mesh.num_experts,
          ExpertParallelOptions{.chunks = opt.a2a_chunks, .buffers = buffers}));
      computes.push_back(ep_.back().get());
    }
    model.shard_experts(mesh.first_expert(), mesh.local_experts, computes);
  }

  // The model's own unit of every parameter (its declared prefixes), so that nothing here reads
  // meaning into a parameter's name.
  const int U = model.num_units();
  for (int k = 0; k < U; ++k)
    for (const std::string& prefix : model.unit_prefixes(k))
      for (const auto& p : model.params().all())
        if (p->name.compare(0, prefix.size(), prefix) == 0) unit_of_[p.get()] = k;
  // Units in store order, so every rank builds the same flat layouts: the routed experts of all
  // layers form one unit (their replicas are the EDP group), each dense model unit another.
  // With shard_expert_weights each layer's experts are a unit of their own (their shards are the
  // layer's Fsdp expert part).
  std::map<int, Unit*> by_unit;  // key -1: the experts; -1 - k: the experts of model unit k
  for (const auto& p : model.params().all()) {
    if (!p->trainable()) continue;
    const bool expert = p->spec.per_expert;
    const int key = !expert ? model_unit(*p) : opt.shard_expert_weights ? -1 - model_unit(*p) : -1;
    Unit*& u = by_unit[key];
    if (!u) {
      units_.push_back(std::make_unique<Unit>());
      u = units_.back().get();
      u->name = !expert     ? unit_name(key, U)
                : key == -1 ? "experts"
                            : "experts of " + unit_name(-1 - key, U);
      u->model_unit = expert ? -1 - key : key;
      if (expert) {
        u->comm = groups.edp.get();
        u->sharded = opt.shard_expert_weights || (mesh.shard_experts && mesh.replicas > 1);
        u->counts_norm = u->sharded || groups.edp->rank() == 0;
        if (opt.shard_expert_weights) u->part = FsdpPart::Experts;
      } else {
        u->comm = groups.world;
      }
    }
    u->params.push_back(p.get());
    u->n += p->value.numel();
  }
  for (auto& u : units_) {
    const int64_t parts = u->sharded ? u->comm->size() : 1;
    u->padded = (u->n + parts - 1) / parts * parts;
    u->shard = u->padded / parts;
    u->m = Tensor::zeros({u->shard}, DType::F32, dev_);
    u->v = Tensor::zeros({u->shard}, DType::F32, dev_);
  }
  if (opt.fsdp || opt.shard_expert_weights) setup_fsdp();
  // Step buffers, planned once from the units' sizes (the worst case of every step): the
  // gradient buckets of the non-fsdp units, one parameter scratch of the largest unit, and the
  // expert loads of every MoE layer. memory() reports the same bytes.
  plan_buckets();
  int64_t widest = 0, widest_shard = 0;
  for (auto& u : units_) {
    if (u->fsdp >= 0) continue;
    widest = std::max(widest, u->padded);
    if (u->sharded) widest_shard = std::max(widest_shard, u->shard);
  }
  pflat_ = Tensor::zeros({std::max<int64_t>(widest, 1)}, DType::F32, dev_);
  mine_ = Tensor::zeros({std::max<int64_t>(widest_shard, 1)}, DType::F32, dev_);
  norm_grads_.reserve(units_.size());
  for (MoeLayer* m : model.moe_layers())
    loads_.emplace_back(m ? static_cast<size_t>(m->config().num_experts) : 0, int64_t{0});
}

void DistTrainer::setup_fsdp() {
  MT_CHECK(!opt_.fsdp || !model_.config().tie_embeddings, ConfigError,
           "fsdp: tied embeddings are not supported (the embedding and the head units would "
           "share one weight)");
  const int U = model_.num_units();
  std::vector<FsdpUnitSpec> specs(static_cast<size_t>(U));
  for (int k = 0; k < U; ++k)
    for (const std::string& prefix : model_.unit_prefixes(k))
      for (const auto& p : model_.params().all()) {
        if (p->name.compare(0, prefix.size(), prefix) != 0 || p->spec.role == ParamRole::Buffer)
          continue;
        FsdpUnitSpec& s = specs[static_cast<size_t>(k)];
        if (p->spec.per_expert) {
          if (opt_.shard_expert_weights)
            (p->trainable() ? s.expert_train : s.expert_frozen).push_back(p.get());
        } else if (opt_.fsdp) {
          (p->trainable() ? s.train : s.frozen).push_back(p.get());
        }
      }
  for (auto& u : units_) {
    const bool expert = u->part == FsdpPart::Experts;
    if (!(expert || (opt_.fsdp && u->comm == g_.world))) continue;
    u->fsdp = u->model_unit;
    // The optimizer's moments must share the gradient shard's layout.
    const FsdpUnitSpec& s = specs[static_cast<size_t>(u->fsdp)];
    MT_CHECK((expert ? s.expert_train : s.train) == u->params, InternalError, "fsdp unit ", u->fsdp,
             " differs from optimizer unit ", u->name);
  }
  fsdp_ = std::make_unique<Fsdp>(model_, *g_.world, g_.edp.get(), std::move(specs), dev_);
}

Shape DistTrainer::local_shape(const Param& p) const {
  return fsdp_ && fsdp_->owns(&p) ? fsdp_->local_shape(&p) : p.value.shape();
}

DistTrainer::~DistTrainer() {
  if (bucket_hooks_) model_.set_unit_hooks(fsdp_.get());
  for (Bucket& b : buckets_) {
    try {
      b.req.wait();
    } catch (...) {
      // A failed collective already surfaced to the step; the job is ending.
    }
  }
}

void DistTrainer::gather_params() {
  if (fsdp_) fsdp_->gather_to_store();
}

MemoryReport DistTrainer::memory() const {
  MemoryReport r;
  r.optimizer = optimizer_bytes();
  for (const auto& p : model_.params().all()) {
    if (fsdp_ && fsdp_->owns(p.get())) continue;
    r.params += static_cast<int64_t>(p->value.bytes());
    if (p->trainable()) r.grads += static_cast<int64_t>(p->grad.bytes());
  }
  int64_t step = 0, largest = 0;
  for (const auto& u : units_) {
    if (u->fsdp >= 0) continue;
    // Every unit's part of its bucket (flat, and the reduced row when sharded), one pflat + shard
    // scratch for all (the constructor's plan).
    step += u->padded * 4 + (u->sharded ? u->shard * 4 : 0);
    largest = std::max(largest, u->padded * 4 + (u->sharded ? u->shard * 4 : 0));
  }
  r.transient = step + largest;
  if (fsdp_) {
    r.params += fsdp_->memory().shard_bytes;
    r.grads += fsdp_->memory().grad_bytes;
    r.transient = std::max(r.transient, fsdp_->memory().buffer_bytes);
    r.fsdp_shards = fsdp_->memory().shard_bytes;
    r.expert_shards = fsdp_->memory().expert_shard_bytes;
    r.fsdp_buffers = fsdp_->memory().buffer_bytes;
    r.fsdp_units_peak = fsdp_->memory().live_units_peak;
    r.fsdp_grads_peak = fsdp_->memory().live_grads_peak;
  }
  return r;
}

int64_t DistTrainer::optimizer_bytes() const {
  int64_t b = 0;
  for (const auto& u : units_) b += static_cast<int64_t>(u->m.bytes() + u->v.bytes());
  return b;
}

DistTrainer::Shares DistTrainer::check_balanced(const SeqInfo& seq, const Tensor& targets,
                                                int64_t valid) {
  if (valid < 0) {
    MT_CHECK(targets.device() == Device::CPU, ValueError, "forward_backward: targets on ",
             device_name(targets.device()),
             " need their count of valid targets from the caller (reading them back would wait)");
    valid = 0;
    for (int64_t i = 0; i < targets.numel(); ++i) valid += targets.i32()[i] != -100;
  }
  int64_t mine[3] = {seq.tokens, seq.num_seqs, valid};
  std::vector<int64_t>& all = balance_;  // kept: a step allocates nothing
  all.resize(3 * static_cast<size_t>(mesh_.world));
  g_.world->all_gather(mine, 3, all.data(), Elem::I64);
  int64_t docs = 0, targets_all = 0;
  for (int r = 0; r < mesh_.world; ++r) {
    const size_t o = 3 * static_cast<size_t>(r);
    docs += all[o + 1];
    targets_all += all[o + 2];
    // Equal tokens make the per-token aux loss (router z) the mean of the rank means; targets
    // and documents differ freely and are weighted instead (forward_backward).
    MT_CHECK(all[o] == all[0], ValueError, "unbalanced batch: rank ", r, " has ", all[o],
             " tokens, rank 0 has ", all[0], " (every rank needs the same number of tokens)");
  }
  const double W = mesh_.world;
  Shares s;
  s.valid = valid;
  s.ce = targets_all > 0 ? static_cast<double>(valid) / static_cast<double>(targets_all) : 1 / W;
  s.docs = docs > 0 ? static_cast<double>(seq.num_seqs) / static_cast<double>(docs) : 1 / W;
  return s;
}

void DistTrainer::zero_grad() {
  g_.world->stats() = {};
  g_.ep->stats() = {};
  g_.edp->stats() = {};
  for (auto& e : ep_) e->reset_stats();
  micro_ = 0;
  for (Bucket& b : buckets_) {  // an optimizer step that never came: its reductions are void
    b.req.wait();
    b.posted = false;
  }
  model_.params().zero_grad();
  if (fsdp_) fsdp_->zero_grad();
}

double DistTrainer::forward_backward(Context& ctx, const SeqInfo& seq, const Tensor& ids,
                                     const Tensor& targets, int64_t valid) {
  MT_CHECK(ctx.device() == dev_, ValueError, "forward_backward on ", device_name(ctx.device()),
           " for a model on ", device_name(dev_));
  if (fsdp_) fsdp_->set_context(&ctx);
  step_ctx_ = &ctx;
  // More micro-batches than DistOptions::micro_batches: the buckets posted in an earlier
  // backward miss this one's gradients; optimizer_step reduces them again.
  for (Bucket& b : buckets_) {
    b.req.wait();
    b.posted = false;
  }
  const Shares sh = check_balanced(seq, targets, valid);
  // Weights are exactly 1 when the ranks hold equal shares, so the balanced case is untouched. Set
  // before the forward, which may compute the head's gradient with the loss (Model::Pass).
  model_.set_loss_weight(sh.valid > 0 ? static_cast<float>(sh.ce * mesh_.world) : 0.f,
                         static_cast<float>(sh.docs * mesh_.world));
  const double loss = model_.forward(ctx, seq, ids, targets, 0, Model::Pass::Train);
  model_.backward(ctx);
  ++micro_;
  model_.set_loss_weight(1.f, 1.f);
  return g_.world->all_reduce_sum(sh.valid > 0 ? loss * sh.ce : 0.0);
}

StepResult DistTrainer::step(Context& ctx, const SeqInfo& seq, const Tensor& ids,
                             const Tensor& targets, float lr) {
  zero_grad();
  StepResult res;
  res.loss = forward_backward(ctx, seq, ids, targets);
  res.grad_norm = optimizer_step(ctx, lr);
  return res;
}
bool DistTrainer::is_local_expert(const Param& p) const {
  return mesh_.ep > 1 && p.spec.per_expert;
}

int DistTrainer::model_unit(const Param& p) const {
  const auto it = unit_of_.find(&p);
  MT_CHECK(it != unit_of_.end(), InternalError, "parameter ", p.name, " is in no model unit");
  return it->second;
}

std::vector<int32_t> DistTrainer::expert_slots(int layer) const {
  if (layer < 0 || static_cast<size_t>(layer) >= slots_.size()) return {};
  return slots_[static_cast<size_t>(layer)];
}

}  // namespace mt::par
