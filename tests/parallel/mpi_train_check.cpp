// Distributed-equals-single-process check, run under mpirun by ctest (tests/CMakeLists.txt).
// Every rank runs the single-process reference on the whole global batch itself (the model is
// tiny) and the distributed model on its own documents. Before each step after the first the
// reference takes the distributed state, so every step is compared from the same point: the
// losses, the final parameters (its expert slice against the same rows of the reference) and
// every piece of the sharded state, moments included (the gradients, tightly), each against an
// allowance derived from summation-order error (see `allow`; the larger of grad_tol of the
// tensor's largest gradient and the order noise that a second single-process pass over the same
// documents in another packing order measures, probe_order_noise). Exit status 0 only when every
// rank agrees. A rank that throws prints "rank R failed: ..." and aborts the job, so no peer can
// hang.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "core/context.h"
#include "core/rng.h"
#include "model/model.h"
#include "model/moe_layer.h"
#include "mpi_check.h"
#include "ops/gemm.h"
#include "parallel/balance/routing_sim.h"
#include "parallel/comm.h"
#include "parallel/dist_trainer.h"
#include "parallel/mesh.h"
#include "train/adamw.h"
#include "train/job.h"

namespace {

using mt::ValueError;

struct Args {
  int ep = 1, chunks = 1, steps = 20, experts = 12;
  bool lora = false, shard_experts = false, uneven = false, fsdp = false;
  bool shard_expert_weights = false;
  // Full training of these layers only (the rest frozen, base weights included): a frozen unit
  // between trainable ones, e.g. "0,2" (FSDP's gradient buffers alternate by unit parity).
  std::vector<int> train_layers;
  // Peak resident memory of the distributed step alone (no reference model, no comparison):
  // see run_rss. The model preset and the document lengths' multiplier size the run.
  bool measure_rss = false;
  std::string model = "tiny";
  int doc_scale = 1;
  // The distributed model only (the reference keeps all activations): none, selective, full.
  std::string recompute = "none";
  int fail_rank = -1, fail_step = -1;
  int stall_rank = -1;     // never joins the collectives of fail_step (sleeps instead)
  int timeout_ms = 30000;  // of every wait
  int place_every = 0;     // move experts between EP ranks before every n-th step (0: never)
  // Gradient buckets (DistOptions::bucket_mib) of this many KiB; 0: the default size.
  int bucket_kib = 0;
  double tol = 1e-5;
  // Of a gradient element, relative to the largest of its tensor: summation order only
  // (measured: up to 9.5e-6 over every configuration below, OpenBLAS Haswell and SkylakeX
  // kernels; a wrong gradient is off by O(1)). Tensors whose sum cancels (A_log: seed
  // 131690681598798438 reached 3.6e-5) are covered by the measured order noise instead.
  double grad_tol = 3e-5;
  // The check's own test: the second moments of A_log compared 1% off, a 0.5% gradient error
  // (the allowance widened by the order probe must still catch that; a wrong gradient is off by
  // O(1)), on whichever rank holds them.
  bool perturb = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() {
      MT_CHECK(i + 1 < argc, ValueError, "missing value after ", k);
      return std::atoi(argv[++i]);
    };
    if (k == "--ep")
      a.ep = next();
    else if (k == "--chunks")
      a.chunks = next();
    else if (k == "--bucket-kib")
      a.bucket_kib = next();
    else if (k == "--steps")
      a.steps = next();
    else if (k == "--experts")
      a.experts = next();
    else if (k == "--lora")
      a.lora = true;
    else if (k == "--tol") {
      MT_CHECK(i + 1 < argc, ValueError, "missing value after ", k);
      a.tol = std::atof(argv[++i]);
    } else if (k == "--grad-tol") {
      MT_CHECK(i + 1 < argc, ValueError, "missing value after ", k);
      a.grad_tol = std::atof(argv[++i]);
    } else if (k == "--uneven")
      a.uneven = true;
    else if (k == "--fsdp")
      a.fsdp = true;
    else if (k == "--recompute") {
      MT_CHECK(i + 1 < argc, ValueError, "missing value after ", k);
      a.recompute = argv[++i];
    } else if (k == "--shard-experts")
      a.shard_experts = true;
    else if (k == "--shard-expert-weights")
      a.shard_expert_weights = true;
    else if (k == "--measure-rss")
      a.measure_rss = true;
    else if (k == "--doc-scale")
      a.doc_scale = next();
    else if (k == "--model") {
      MT_CHECK(i + 1 < argc, ValueError, "missing value after ", k);
      a.model = argv[++i];
    } else if (k == "--fail-rank")
      a.fail_rank = next();
    else if (k == "--fail-step")
      a.fail_step = next();
    else if (k == "--stall-rank")
      a.stall_rank = next();
    else if (k == "--timeout-ms")
      a.timeout_ms = next();
    else if (k == "--perturb")
      a.perturb = true;
    else if (k == "--place-every")
      a.place_every = next();
    else if (k == "--train-layers") {
      MT_CHECK(i + 1 < argc, ValueError, "missing value after ", k);
      std::string list = argv[++i];
      for (size_t at = 0; at <= list.size();) {
        const size_t end = std::min(list.find(',', at), list.size());
        a.train_layers.push_back(std::stoi(list.substr(at, end - at)));
        at = end + 1;
      }
    } else
      MT_THROW(ValueError, "unknown argument ", k);
  }
  return a;
}

// Documents of rank r: lengths differ inside a rank but every rank holds the same total. With
// `uneven`, odd ranks hold three documents instead of two and some targets are ignored, so the
// ranks' shares of documents and targets differ (the weighting of DistTrainer::forward_backward).
std::vector<int64_t> doc_lens(int rank, bool uneven, int scale = 1) {
  if (uneven && rank % 2 == 1) return {4 * scale, 8 * scale, 12 * scale};
  return {9 * scale, 15 * scale};
}

// How many times the measured order difference of two single-process runs a distributed
// gradient may differ by (its reductions take yet other orders).
constexpr double kOrderMargin = 4;
// The DSA indexer's tensors: their gradients come through a top-k selection of keys, and the
// distributed run forms each rank's indexer scores in GEMMs of its own shapes, so a near tie can
// round the other way there and swap two nearly equal keys, which moves the gradient by more than
// summation order but by far less than a wrong gradient (O(1)). Seed 14418463275541764721 at world
// 3: an indexer LoRA B's gradient off by 3.8e-5 of its tensor's largest, where reordering the
// documents in one process moves it by 3e-7; no tensor passed 0.4 of its allowance in 40 other
// seeds.
constexpr double kIndexerGradTol = 1e-4;

struct Batch {
  mt::SeqInfo seq;
  mt::Tensor ids, targets;
};

// The documents of ranks [first, last) at step s: token values from a counter-based hash of the
// run's seed, so every rank can build any rank's documents. `reversed` packs the ranks' documents
// last rank first: the same tokens, summed in another order.
Batch make_batch(uint64_t seed, int64_t vocab, int step, int first, int last, bool uneven,
                 int scale = 1, bool reversed = false) {
  std::vector<int64_t> lens, ids;
  for (int i = first; i < last; ++i) {
    const int r = reversed ? last - 1 - (i - first) : i;
    const std::vector<int64_t> l = doc_lens(r, uneven, scale);
    for (size_t j = 0; j < l.size(); ++j) {
      lens.push_back(l[j]);
      ids.push_back(r * (uneven ? 8 : 2) + static_cast<int64_t>(j));  // balanced: as before
    }
  }
  Batch b;
  b.seq = mt::SeqInfo::from_lengths(lens);
  b.ids = mt::Tensor::empty({b.seq.tokens}, mt::DType::I32);
  b.targets = mt::Tensor::empty({b.seq.tokens}, mt::DType::I32);
  int64_t t = 0;
  for (size_t k = 0; k < lens.size(); ++k)
    for (int64_t i = 0; i < lens[k]; ++i, ++t) {
      uint64_t h =
          seed ^ ((static_cast<uint64_t>(step) * 1000003u + static_cast<uint64_t>(ids[k])) * 7919u +
                  static_cast<uint64_t>(i));
      h ^= h >> 13;
      h *= 0x9E3779B97F4A7C15ull;
      h ^= h >> 29;
      b.ids.i32()[t] = static_cast<int32_t>(h % static_cast<uint64_t>(vocab));
      b.targets.i32()[t] = static_cast<int32_t>((h >> 20) % static_cast<uint64_t>(vocab));
      if (uneven && (h >> 40) % 4 == 0) b.targets.i32()[t] = -100;
    }
  return b;
}

// The rows of `full` ([E, ...]) that this rank holds, in its local slot order.
mt::Tensor local_rows(const mt::Tensor& full, const mt::par::Mesh& mesh,
                      const std::vector<int32_t>& slots) {
  if (slots.empty())
    return full.rows(mesh.first_expert(), mesh.first_expert() + mesh.local_experts);
  std::vector<int64_t> dims = full.shape().dims();
  dims[0] = mesh.local_experts;
  mt::Tensor t = mt::Tensor::empty(mt::Shape(dims));
  const int64_t row = full.numel() / full.shape()[0];
  for (size_t e = 0; e < slots.size(); ++e) {
    if (slots[e] / mesh.local_experts != mesh.ep_rank) continue;
    std::memcpy(t.f32() + (slots[e] % mesh.local_experts) * row,
                full.f32() + static_cast<int64_t>(e) * row,
                static_cast<size_t>(row) * sizeof(float));
  }
  return t;
}

int layer_of(const std::string& name) {
  const std::string pre = "model.layers.";
  return name.compare(0, pre.size(), pre) == 0 ? std::stoi(name.substr(pre.size())) : -1;
}

using mt::test::status_bytes;

// The model under test: the preset, with LoRA rank 2 everywhere (experts too) when asked.
struct DriverModel {
  mt::ModelConfig cfg;
  mt::ModelOptions opt;
};
DriverModel driver_model(const Args& a) {
  DriverModel m{mt::ModelConfig::load(a.model), {}};
  if (a.model == "tiny") m.cfg.moe.num_experts = a.experts;
  if (a.lora) {
    const mt::LoraSpec lora{.rank = 2, .alpha = 4.f};
    m.cfg.kda.lora = m.cfg.mla.lora = m.cfg.dsa.mla.lora = m.cfg.moe.lora = m.cfg.dense.lora = lora;
    m.cfg.moe.expert_lora = lora;
    m.opt.freeze_base = true;
  }
  if (!a.train_layers.empty()) {
    m.opt.freeze_base = true;
    m.opt.also_train = [layers = a.train_layers](const std::string& name) {
      return std::find(layers.begin(), layers.end(), layer_of(name)) != layers.end();
    };
  }
  return m;
}

mt::par::DistOptions dist_options(const Args& a, const mt::AdamWOptions& adam) {
  mt::par::DistOptions o{.a2a_chunks = a.chunks,
                         .adam = adam,
                         .fsdp = a.fsdp,
                         .shard_expert_weights = a.shard_expert_weights};
  if (a.bucket_kib > 0) o.bucket_mib = a.bucket_kib / 1024.0;
  return o;
}

// Peak resident bytes of the distributed step, measured by the kernel rather than by the
// engine's own counters (tests/plan/test_engine_memory.cpp compares them with the planner):
//   baseline  VmRSS after MPI start-up and a warm-up that touches what every run touches before
//             the model exists: the BLAS packing buffers (a 1024^3 GEMM) and the MPI transport's
//             buffers (collectives of 4 MB);
//   peak      VmHWM over two steps, reset (clear_refs 5) once the trainer is built, because
//             building the model allocates every expert before the mesh slices them;
//   measured  peak - baseline.
// Large allocations must go straight to mmap and back (MALLOC_MMAP_THRESHOLD_), else freed
// memory stays resident in the heap and the peak depends on the allocation order.
int run_rss(mt::par::Comm& world, const Args& a, uint64_t seed) {
  using namespace mt;
  const int rank = world.rank();
  Context dctx(ContextOptions{.threads = 1});
  {
    Tensor x = Tensor::zeros({1024, 1024}), y = Tensor::zeros({1024, 1024});
    Tensor z = Tensor::empty({1024, 1024});
    ops::matmul(dctx, x, false, y, true, z);
    const int64_t n = int64_t{1} << 20;
    Tensor s = Tensor::zeros({n}), all = Tensor::empty({n * world.size()});
    world.all_gather(s.raw(), n, all.raw(), par::Elem::F32);
    const int64_t part = n / world.size();
    std::vector<int64_t> counts(static_cast<size_t>(world.size()), part), displs;
    for (int r = 0; r < world.size(); ++r) displs.push_back(r * part);
    Tensor q = Tensor::empty({n});
    world.iall_to_all_v(s.raw(), counts, displs, q.raw(), counts, displs, par::Elem::F32).wait();
  }
  const int64_t baseline = status_bytes("VmRSS");
  auto [cfg, mopt] = driver_model(a);
  mopt.recompute = parse_activation_recompute(a.recompute, "--recompute");
  const par::Mesh mesh = par::make_mesh(world.size(), rank, cfg.moe.num_experts,
                                        {.ep = a.ep,
                                         .shard_experts = a.shard_experts,
                                         .shard_expert_weights = a.shard_expert_weights});
  par::ProcessGroups groups = par::make_groups(world, mesh);
  Model model(cfg, seed, mopt);
  AdamWOptions adam;
  par::DistTrainer trainer(model, mesh, groups, dist_options(a, adam));
  test::reset_peak_rss();
  for (int s = 0; s < 2; ++s) {
    Batch b = make_batch(seed, cfg.vocab, s, rank, rank + 1, false, a.doc_scale);
    trainer.step(dctx, b.seq, b.ids, b.targets, 1e-3f);
  }
  const int64_t peak = status_bytes("VmHWM");
  std::printf("rss rank %d: baseline %lld peak %lld measured %lld\n", rank,
              static_cast<long long>(baseline), static_cast<long long>(peak),
              static_cast<long long>(peak - baseline));
  return 0;
}

// A single process's gradients over the same documents packed in another order differ from the
// reference's by summation order alone. Their largest difference per trainable tensor measures
// how far order moves that tensor's gradient, independently of the distributed engine. The
// probe's forward leaves the experts' load counts (which the router bias update reads) as the
// reference's forward left them, and the reference's gradients in place.
std::map<std::string, double> probe_order_noise(mt::Context& ctx, mt::Model& ref,
                                                const Batch& other) {
  using namespace mt;
  std::map<std::string, Tensor> keep;
  for (const auto& p : ref.params().all())
    if (p->trainable()) keep[p->name] = p->grad.clone();
  std::vector<std::vector<int64_t>> loads;
  for (MoeLayer* m : ref.moe_layers())
    loads.push_back(m ? m->expert_load() : std::vector<int64_t>{});
  ref.params().zero_grad();
  ref.forward(ctx, other.seq, other.ids, other.targets);
  ref.backward(ctx);
  std::map<std::string, double> noise;
  for (const auto& p : ref.params().all()) {
    if (!p->trainable()) continue;
    const Tensor& g0 = keep.at(p->name);
    double d = 0;
    for (int64_t i = 0; i < g0.numel(); ++i)
      d = std::max(d, static_cast<double>(std::abs(p->grad.f32()[i] - g0.f32()[i])));
    noise[p->name] = d;
    std::memcpy(p->grad.raw(), g0.raw(), g0.bytes());
  }
  std::vector<MoeLayer*> moes = ref.moe_layers();
  for (size_t i = 0; i < moes.size(); ++i)
    if (moes[i]) moes[i]->set_expert_load(loads[i]);
  return noise;
}

// seed: the run's (test::world_seed), of the weights and the documents.
int run(mt::par::Comm& world, const Args& a, uint64_t seed) {
  using namespace mt;
  if (a.measure_rss) return run_rss(world, a, seed);
  const int W = world.size(), rank = world.rank();
  const auto [cfg, mopt] = driver_model(a);
  // Before anything is allocated: an invalid mesh is a ConfigError here.
  const par::Mesh mesh = par::make_mesh(W, rank, cfg.moe.num_experts,
                                        {.ep = a.ep,
                                         .shard_experts = a.shard_experts,
                                         .shard_expert_weights = a.shard_expert_weights});
  if (rank == 0) std::printf("%s", mesh.describe().c_str());
  par::ProcessGroups groups = par::make_groups(world, mesh);

  Context ctx(ContextOptions{.threads = 1});
  const float lr = 1e-2f;
  AdamWOptions adam;
  adam.weight_decay = 0.01f;

  // Single-process reference over all ranks' documents. It does not run on its own: before every
  // step it takes the distributed run's whole state (parameters, moments, router biases), so each
  // step compares one distributed step with one single-process step from the same point. A free
  // run would compare two chaotic trajectories: summation order differs (one GEMM over all tokens
  // against per-rank sums), AdamW amplifies that near g = 0 (gain lr / (sqrt(v) + eps)), and the
  // router's and the indexer's top-k then flip on near-ties, a legitimate divergence of 1e-2.
  Model ref(cfg, seed, mopt);
  AdamW ref_opt(ref.params(), adam);
  std::vector<std::string> trainable;
  for (const auto& p : ref.params().all())
    if (p->trainable()) trainable.push_back(p->name);
  // Full tensor name ("m." / "v." for moments) -> the reference's tensor.
  auto ref_tensor = [&](const std::string& name) -> Tensor& {
    const bool mom = name.compare(0, 2, "m.") == 0 || name.compare(0, 2, "v.") == 0;
    if (!mom) return ref.params().at(name).value;
    const size_t k = static_cast<size_t>(
        std::find(trainable.begin(), trainable.end(), name.substr(2)) - trainable.begin());
    return name[0] == 'm' ? ref_opt.first_moments().at(k) : ref_opt.second_moments().at(k);
  };

  ModelOptions dopt = mopt;
  dopt.recompute = parse_activation_recompute(a.recompute, "--recompute");
  Model model(cfg, seed, dopt);
  // Its own context, so that its workspace peak is the distributed step's alone.
  Context dctx(ContextOptions{.threads = 1});
  par::DistTrainer trainer(model, mesh, groups, dist_options(a, adam));
  // The distributed state into the reference: every element is written by exactly one rank
  // (checked), so a sum over the world assembles it exactly (x + 0 = x).
  auto sync_reference = [&]() {
    std::vector<std::string> names;
    for (const auto& p : ref.params().all()) {
      names.push_back(p->name);
      if (p->trainable()) {
        names.push_back("m." + p->name);
        names.push_back("v." + p->name);
      }
    }
    std::map<std::string, int64_t> at;
    int64_t total = 0;
    for (const std::string& n : names) {
      at[n] = total;
      total += ref_tensor(n).numel();
    }
    Tensor flat = Tensor::zeros({total + 1});  // last: elements written
    for (const par::ShardPiece& sp : trainer.checkpoint_pieces()) {
      std::memcpy(flat.f32() + at.at(sp.name) + sp.begin, sp.data.f32(),
                  static_cast<size_t>(sp.end - sp.begin) * sizeof(float));
      flat.f32()[total] += static_cast<float>(sp.end - sp.begin);
    }
    world.all_reduce(flat.raw(), total + 1, par::Elem::F32);
    MT_CHECK(static_cast<int64_t>(flat.f32()[total]) == total, ValueError,
             "checkpoint pieces hold ", flat.f32()[total], " elements of ", total);
    for (const std::string& n : names)
      std::memcpy(ref_tensor(n).raw(), flat.f32() + at.at(n), ref_tensor(n).bytes());
    ref_opt.set_steps(trainer.optimizer_steps());
  };

  double max_loss_err = 0, max_place_err = 0;
  int64_t experts_moved = 0;
  std::map<std::string, double> order_noise;  // of the compared (last) step
  for (int s = 0; s < a.steps; ++s) {
    if (a.place_every > 0 && s > 0 && s % a.place_every == 0) {
      // Same inputs before and after the move: the model's outputs must not change.
      Batch pb = make_batch(seed, cfg.vocab, s, rank, rank + 1, a.uneven);
      std::vector<std::vector<int64_t>> keep;
      for (MoeLayer* m : model.moe_layers())
        keep.push_back(m ? m->expert_load() : std::vector<int64_t>{});
      const double before = model.forward(dctx, pb.seq, pb.ids, pb.targets);
      const Tensor h0 = model.final_hidden().clone();
      // Greedy packing of the last step's loads, then the ranks rotated by the placement count
      // so that experts move even when the packing repeats itself.
      std::vector<std::vector<int32_t>> place(static_cast<size_t>(model.num_layers()));
      const std::vector<std::vector<int64_t>>& loads = trainer.global_loads();
      for (size_t i = 0; i < loads.size(); ++i) {
        if (loads[i].empty()) continue;
        const std::vector<double> l(loads[i].begin(), loads[i].end());
        place[i] = balance::greedy_placement(l, a.ep);
        for (int32_t& r : place[i]) r = (r + s / a.place_every) % a.ep;
      }
      experts_moved += trainer.place_experts(place);
      const double after = model.forward(dctx, pb.seq, pb.ids, pb.targets);
      const Tensor& h1 = model.final_hidden();
      double err = std::abs(after - before);
      for (int64_t i = 0; i < h0.numel(); ++i)
        err = std::max(err, static_cast<double>(std::abs(h1.f32()[i] - h0.f32()[i])));
      max_place_err = std::max(max_place_err, err);
      std::vector<MoeLayer*> moes = model.moe_layers();
      for (size_t i = 0; i < moes.size(); ++i)
        if (moes[i]) moes[i]->set_expert_load(keep[i]);
    }
    // Step 0 starts from two independent builds of the same seed; later steps from the
    // distributed state.
    if (s > 0) sync_reference();
    if (rank == a.fail_rank && s == a.fail_step)
      MT_THROW(ValueError, "injected failure at step ", s);
    if (rank == a.stall_rank && s == a.fail_step) {
      // The peers must give up on their own; their abort ends this process.
      std::this_thread::sleep_for(std::chrono::seconds(60));
      MT_THROW(ValueError, "stalled rank was not ended by its peers");
    }
    const Batch gb = make_batch(seed, cfg.vocab, s, 0, W, a.uneven);
    ref.params().zero_grad();
    const double ref_loss = ref.forward(ctx, gb.seq, gb.ids, gb.targets);
    ref.backward(ctx);
    if (s == a.steps - 1)
      order_noise =
          probe_order_noise(ctx, ref, make_batch(seed, cfg.vocab, s, 0, W, a.uneven, 1, true));
    ref_opt.step(ctx, ref.params(), lr);
    for (MoeLayer* m : ref.moe_layers())
      if (m) m->update_selection_bias(ctx);

    Batch b = make_batch(seed, cfg.vocab, s, rank, rank + 1, a.uneven);
    par::StepResult r = trainer.step(dctx, b.seq, b.ids, b.targets, lr);
    const double err = std::abs(r.loss - ref_loss) / std::abs(ref_loss);
    max_loss_err = std::max(max_loss_err, err);
    if (rank == 0 && (s == 0 || s == a.steps - 1))
      std::printf("step %d: loss %.7f (one process %.7f)\n", s, r.loss, ref_loss);
  }
  std::printf("%s\n", trainer.metrics().line(rank).c_str());
  // Measured before gather_params, which makes the dense parameters whole again.
  const par::MemoryReport mem = trainer.memory();
  // Before anything else (gathering, checks) can run a forward of its own.
  const size_t acts_used = model.activation_bytes_used();
  std::printf(
      "rank %d memory: parameters %lld B, gradients %lld B, optimizer %lld B, peak step "
      "buffers %lld B, total %lld B\n",
      rank, static_cast<long long>(mem.params), static_cast<long long>(mem.grads),
      static_cast<long long>(mem.optimizer), static_cast<long long>(mem.transient),
      static_cast<long long>(mem.total()));
  bool mem_ok = true;
  if (a.fsdp) {
    // ZeRO-3 in memory: between steps no full dense tensor exists, each rank holds 1/W of the
    // dense elements (plus < W padding per flat buffer), and at most two units are gathered and
    // two unit gradients alive at once (the current one and the prefetch / the reduction).
    int64_t dense = 0, groups_n = 0;
    for (const auto& p : model.params().all()) {
      if (p->name.find(".mlp.experts.") != std::string::npos || p->spec.role == ParamRole::Buffer)
        continue;
      dense += static_cast<int64_t>(p->spec.shape.numel()) * 4;
      if (p->value.raw() != nullptr) {
        std::printf("rank %d: %s is still whole between steps\n", rank, p->name.c_str());
        mem_ok = false;
      }
    }
    groups_n = 2 * model.num_units();
    const int64_t lo = dense / W, hi = dense / W + 4 * groups_n;
    const int64_t shards = mem.fsdp_shards - mem.expert_shards;
    if (shards < lo || shards > hi || mem.fsdp_units_peak > 2 || mem.fsdp_grads_peak > 2) {
      std::printf("rank %d: shards %lld B outside [%lld, %lld], or more than 2 units gathered\n",
                  rank, static_cast<long long>(shards), static_cast<long long>(lo),
                  static_cast<long long>(hi));
      mem_ok = false;
    }
    std::printf(
        "rank %d fsdp: dense %lld B, shards %lld B, gather + unit gradient buffers %lld B, "
        "units gathered at once %d, unit gradients at once %d\n",
        rank, static_cast<long long>(dense), static_cast<long long>(mem.fsdp_shards),
        static_cast<long long>(mem.fsdp_buffers), mem.fsdp_units_peak, mem.fsdp_grads_peak);
  }
  if (a.shard_expert_weights) {
    // ZeRO-3 for experts: between steps no expert tensor is whole, and each rank holds
    // 1/replicas of its local experts (plus < replicas elements of padding per flat buffer).
    int64_t local = 0;
    for (const auto& p : model.params().all()) {
      if (!p->spec.per_expert) continue;
      local += static_cast<int64_t>(p->spec.shape.numel()) / cfg.moe.num_experts *
               mesh.local_experts * 4;
      if (p->value.raw() != nullptr) {
        std::printf("rank %d: %s is still whole between steps\n", rank, p->name.c_str());
        mem_ok = false;
      }
    }
    const int64_t R = mesh.replicas, lo = local / R, hi = local / R + 4 * 2 * model.num_units() * R;
    if (mem.expert_shards < lo || mem.expert_shards > hi || mem.fsdp_units_peak > 2 ||
        mem.fsdp_grads_peak > 2) {
      std::printf(
          "rank %d: expert shards %lld B outside [%lld, %lld], or more than 2 units "
          "gathered\n",
          rank, static_cast<long long>(mem.expert_shards), static_cast<long long>(lo),
          static_cast<long long>(hi));
      mem_ok = false;
    }
    std::printf("rank %d experts: local %lld B, shards %lld B over %lld replicas\n", rank,
                static_cast<long long>(local), static_cast<long long>(mem.expert_shards),
                static_cast<long long>(R));
  }
  trainer.gather_params();

  // Final parameters: dense ones whole, experts as this rank's rows of the reference.
  // What one step may differ by. Gradients differ by summation order only: at most grad_tol of
  // the tensor's largest element (delta). Moments are linear in the gradient (m: (1 - b1) delta,
  // v: (1 - b2) delta (2 |g| + delta)). AdamW turns a gradient error into a parameter error of
  // up to lr delta (1 + |m^| / (s + eps)) / (s + eps), s = sqrt(v^) (bias corrections folded,
  // (1 - b1) / bc1 <= 1 and sqrt((1 - b2) / bc2) <= 1): tight where the gradient is large, lr-sized
  // where it rounds to zero, so that elements with g ~ 0 step by lr with a random sign.
  const double t = static_cast<double>(ref_opt.steps());
  const double bc1 = 1 - std::pow(adam.beta1, t), bc2 = 1 - std::pow(adam.beta2, t);
  std::map<std::string, double> delta;  // per trainable tensor
  for (const auto& p : ref.params().all()) {
    if (!p->trainable()) continue;
    double g = 0;
    for (int64_t i = 0; i < p->grad.numel(); ++i)
      g = std::max(g, static_cast<double>(std::abs(p->grad.f32()[i])));
    // Where the tensor's sum cancels (a per-head A_log sums many terms of both signs into a small
    // gradient), the order error scales with the terms, not with the result: the measured
    // difference of two single-process orders, with a margin, bounds it there.
    const bool indexer = p->name.find(".indexer.") != std::string::npos;
    const double tol = indexer ? std::max(a.grad_tol, kIndexerGradTol) : a.grad_tol;
    delta[p->name] = std::max(tol * g, kOrderMargin * order_noise[p->name]);
  }
  auto value_allow = [&](const std::string& name, double m, double v) {
    const auto it = delta.find(name);
    if (it == delta.end()) return a.tol;  // frozen or a buffer: no optimizer in between
    const double sv = std::sqrt(v / bc2) + adam.eps;
    return a.tol + lr * it->second * (1 + std::abs(m / bc1) / sv) / sv;
  };
  // Full tensor name -> allowance of its element i (single-process coordinates).
  auto allow = [&](const std::string& name, int64_t i) {
    const bool mom = name.compare(0, 2, "m.") == 0 || name.compare(0, 2, "v.") == 0;
    const std::string base = mom ? name.substr(2) : name;
    const double d = delta.count(base) ? delta.at(base) : 0.0;
    // Plus one rounding of the stored fp32 moment, which may fall either way.
    const double ulp =
        d == 0 ? 0.0 : 2 * FLT_EPSILON * std::abs(static_cast<double>(ref_tensor(name).f32()[i]));
    if (name[0] == 'm' && mom) return (1 - adam.beta1) * d + ulp;
    if (mom) {
      const double g = std::abs(static_cast<double>(ref.params().at(base).grad.f32()[i]));
      return (1 - adam.beta2) * d * (2 * g + d) + ulp;
    }
    if (!delta.count(base)) return a.tol;
    return value_allow(base, ref_tensor("m." + base).f32()[i], ref_tensor("v." + base).f32()[i]);
  };
  // Error over allowance (<= 1 passes), relative to the value where it exceeds 1.
  auto ratio = [](double got, double want, double allowed) {
    const double d = std::abs(got - want) / std::max(1.0, std::abs(want));
    if (d == 0) return 0.0;
    return std::isfinite(d) ? d / allowed : HUGE_VAL;  // NaN must fail too
  };

  double max_param_err = 0, max_param_ratio = 0;
  std::string worst;
  int64_t compared = 0;
  for (const auto& p : model.params().all()) {
    const Param& q = ref.params().at(p->name);
    Tensor want = q.value, m, v;
    const bool trains = delta.count(p->name) > 0;
    if (trains) {
      m = ref_tensor("m." + p->name);
      v = ref_tensor("v." + p->name);
    }
    if (p->value.numel() != q.value.numel()) {
      const std::vector<int32_t> slots = trainer.expert_slots(layer_of(p->name));
      want = local_rows(q.value, mesh, slots);
      if (trains) {
        m = local_rows(m, mesh, slots);
        v = local_rows(v, mesh, slots);
      }
    }
    expect_shape(p->value, want.shape(), p->name.c_str());
    for (int64_t i = 0; i < want.numel(); ++i) {
      const double got = p->value.f32()[i], w = want.f32()[i];
      const double allowed = trains ? value_allow(p->name, m.f32()[i], v.f32()[i]) : a.tol;
      const double r = ratio(got, w, allowed);
      max_param_err = std::max(max_param_err, std::abs(got - w) / std::max(1.0, std::abs(w)));
      if (r > max_param_ratio) {
        max_param_ratio = r;
        worst = p->name;
      }
    }
    compared += want.numel();
  }
  // Moments (the gradients, tightly) and every other piece of the sharded state.
  double max_piece_ratio = 0;
  std::string worst_piece;
  for (const par::ShardPiece& sp : trainer.checkpoint_pieces()) {
    const Tensor& want = ref_tensor(sp.name);
    for (int64_t i = sp.begin; i < sp.end; ++i) {
      const double off =
          a.perturb && sp.name.rfind("v.", 0) == 0 && sp.name.find("A_log") != std::string::npos
              ? 1.01
              : 1.0;
      const double r = ratio(off * sp.data.f32()[i - sp.begin], want.f32()[i], allow(sp.name, i));
      if (r > max_piece_ratio) {
        max_piece_ratio = r;
        worst_piece = sp.name;
      }
    }
  }
  bool place_ok = true;
  if (a.place_every > 0) {
    // The checkpoint holds single-process coordinates: every piece against the reference's
    // values and moments, and every element written once over the world.
    int64_t elems = 0, want_elems = 0;
    for (const par::ShardPiece& sp : trainer.checkpoint_pieces()) elems += sp.end - sp.begin;
    for (const auto& p : ref.params().all())
      want_elems += p->value.numel() * (p->trainable() ? 3 : 1);
    elems = world.all_reduce_sum(elems);
    // Loading into the moved layout: wipe the local experts, read them back from the reference.
    for (const auto& p : model.params().all())
      if (p->value.numel() != ref.params().at(p->name).value.numel())
        std::memset(p->value.raw(), 0, p->value.bytes());
    trainer.load_pieces(
        [&](const std::string& name, int64_t b, int64_t e, float* out) {
          std::memcpy(out, ref_tensor(name).f32() + b, static_cast<size_t>(e - b) * sizeof(float));
        },
        trainer.optimizer_steps());
    double load_err = 0;
    for (const auto& p : model.params().all()) {
      const Param& q = ref.params().at(p->name);
      if (p->value.numel() == q.value.numel()) continue;
      const Tensor want = local_rows(q.value, mesh, trainer.expert_slots(layer_of(p->name)));
      for (int64_t i = 0; i < want.numel(); ++i)
        load_err =
            std::max(load_err, static_cast<double>(std::abs(p->value.f32()[i] - want.f32()[i])));
    }
    const int64_t total_moved = world.all_reduce_sum(experts_moved);
    place_ok = max_place_err <= 1e-6 && elems == want_elems && load_err == 0 &&
               (a.ep == 1 || total_moved > 0);
    std::printf(
        "rank %d placement: %lld experts moved, outputs before/after max diff %.3g, checkpoint "
        "pieces %lld of %lld elements, reload max err %.3g: %s\n",
        rank, static_cast<long long>(total_moved), max_place_err, static_cast<long long>(elems),
        static_cast<long long>(want_elems), load_err, place_ok ? "ok" : "MISMATCH");
  }
  const bool ok =
      place_ok && mem_ok && max_loss_err <= a.tol && max_param_ratio <= 1 && max_piece_ratio <= 1;
  const int64_t param_bytes = mem.params;
  std::printf(
      "rank %d: %lld parameters compared, max loss rel err %.3g, max param err %.3g, max "
      "param err / allowance %.3g (%s), max state piece err / allowance %.3g (%s), optimizer "
      "state %lld B, parameters %lld B: %s\n",
      rank, static_cast<long long>(compared), max_loss_err, max_param_err, max_param_ratio,
      worst.c_str(), max_piece_ratio, worst_piece.c_str(),
      static_cast<long long>(trainer.optimizer_bytes()), static_cast<long long>(param_bytes),
      ok ? "ok" : "MISMATCH");
  // Measured bytes per rank, read by tests/plan/test_engine_memory.cpp against the planner.
  const int64_t grad_bytes = mem.grads;
  std::printf(
      "memory rank %d: params %lld grads %lld optimizer %lld activations %lld workspace %lld "
      "step buffers %lld\n",
      rank, static_cast<long long>(param_bytes), static_cast<long long>(grad_bytes),
      static_cast<long long>(trainer.optimizer_bytes()), static_cast<long long>(acts_used),
      static_cast<long long>(dctx.workspace().peak()), static_cast<long long>(mem.transient));
  const int64_t bad = world.all_reduce_sum(static_cast<int64_t>(ok ? 0 : 1));
  if (rank == 0)
    std::printf("%s: %lld of %d ranks mismatched\n", bad ? "FAIL" : "PASS",
                static_cast<long long>(bad), W);
  return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  return mt::test::mpi_main(
      argc, argv, parse,
      [](const Args& a) {
        return mt::par::CommOptions{.timeout = std::chrono::milliseconds(a.timeout_ms)};
      },
      run);
}
