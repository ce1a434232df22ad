// Loading an HF checkpoint under mpirun, each rank reading only its own slices, run by ctest
// (tests/CMakeLists.txt). Rank 0 writes a multi-shard deepseek_v3 checkpoint of a few hundred MB
// into --dir; then every rank builds the model with deferred weights (ModelOptions::
// defer_weights), slices it (DistTrainer: FSDP units over the world, experts over EP) and fills
// its slices through an HfSliceReader. Checked on every rank:
//   memory  the peak resident growth from before the model exists to the end of the load
//           (VmHWM, reset by clear_refs 5, minus VmRSS then; the kernel's count, not the
//           engine's) stays below --max-fraction of the model's bytes: a rank that built or read
//           the whole model would hold all of it;
//   values  every piece the rank holds (DistTrainer::checkpoint_pieces, LoRA adapters included)
//           equals the same elements of a single-process load of the same directory, bit for bit;
//   loss    the distributed forward over all ranks' documents equals the single-process forward
//           over the same documents (summation order only).
// Exit status 0 only when every rank passes. A rank that throws aborts the job.
#include <malloc.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/rng.h"
#include "io/hf_names.h"
#include "mpi_check.h"
#include "parallel/comm.h"
#include "parallel/dist_trainer.h"
#include "parallel/mesh.h"

namespace {

namespace fs = std::filesystem;
using mt::ValueError;

struct Args {
  std::string dir;
  int ep = 0;  // 0: the world size
  double max_fraction = 1.0;
  int experts = 32;
  // The negative control: the model built whole on every rank (no deferred weights), as before
  // ranks read their slices; the memory bound must then fail.
  bool whole = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--whole") {
      a.whole = true;
      continue;
    }
    MT_CHECK(i + 1 < argc, ValueError, "missing value after ", k);
    const char* v = argv[++i];
    if (k == "--dir")
      a.dir = v;
    else if (k == "--ep")
      a.ep = std::atoi(v);
    else if (k == "--max-fraction")
      a.max_fraction = std::atof(v);
    else if (k == "--experts")
      a.experts = std::atoi(v);
    else
      MT_THROW(ValueError, "unknown argument ", k);
  }
  MT_CHECK(!a.dir.empty(), ValueError, "--dir is required");
  return a;
}

using mt::test::status_bytes;

// About 200 MB of f32 weights with 32 experts, nearly all of them routed experts, as in the
// models this is for.
mt::HfConfig checkpoint_config(int experts) {
  nlohmann::json j = nlohmann::json::parse(R"({
    "model_type": "deepseek_v3", "vocab_size": 8192, "hidden_size": 256,
    "intermediate_size": 512, "moe_intermediate_size": 256, "num_hidden_layers": 8,
    "num_attention_heads": 4, "q_lora_rank": 64, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8, "v_head_dim": 16, "num_experts_per_tok": 2, "n_shared_experts": 1,
    "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1
  })");
  j["n_routed_experts"] = experts;
  return mt::hf_config_from_json(j, "mpi_load_check");
}

// Documents of rank r (two, of different lengths), deterministic.
struct Batch {
  mt::SeqInfo seq;
  mt::Tensor ids, targets;
};
Batch make_batch(uint64_t seed, int64_t vocab, int first, int last) {
  std::vector<int64_t> lens;
  for (int r = first; r < last; ++r) lens.insert(lens.end(), {11, 21});
  Batch b;
  b.seq = mt::SeqInfo::from_lengths(lens);
  b.ids = mt::Tensor::empty({b.seq.tokens}, mt::DType::I32);
  b.targets = mt::Tensor::empty({b.seq.tokens}, mt::DType::I32);
  mt::Rng rng(seed);
  // Every rank draws the same global stream and keeps its own part of it.
  const int64_t skip = static_cast<int64_t>(first) * 32;
  for (int64_t i = 0; i < skip; ++i) (void)rng.next_u64(), (void)rng.next_u64();
  for (int64_t t = 0; t < b.seq.tokens; ++t) {
    b.ids.i32()[t] = static_cast<int32_t>(rng.below(vocab));
    b.targets.i32()[t] = static_cast<int32_t>(rng.below(vocab));
  }
  return b;
}

// seed: the run's (test::world_seed): the checkpoint's values, the adapters', the documents.
int run(mt::par::Comm& world, const Args& a, uint64_t seed) {
  using namespace mt;
  const int W = world.size(), rank = world.rank();
  const HfConfig h = checkpoint_config(a.experts);
  // Trained as adapters on a frozen base (the setting this is for): the base weights carry no
  // gradient or optimizer memory, so what a rank holds is its slices of the weights.
  ModelConfig cfg = h.model;
  cfg.mla.lora = {.rank = 2, .alpha = 4.f};
  const ModelOptions sliced{.freeze_base = true, .defer_weights = !a.whole};
  int64_t model_bytes = 0;
  for (const NamedSpec& s : model_param_specs(h.model)) model_bytes += s.spec.shape.numel() * 4;
  if (rank == 0) {
    // The checkpoint, written in 16 MB shards; its values are an ordinary build's.
    Model src(h.model, seed);
    save_hf_model(src, h, a.dir, uint64_t{16} << 20);
  }
  world.barrier();
  size_t shards = 0;
  for (const auto& e : fs::directory_iterator(a.dir))
    shards += e.path().extension() == ".safetensors";

  // Memory: the baseline is taken with the writer's memory handed back and MPI started.
  malloc_trim(0);
  test::reset_peak_rss();
  const int64_t baseline = status_bytes("VmRSS");
  const int ep = a.ep > 0 ? a.ep : W;
  const par::Mesh mesh = par::make_mesh(W, rank, cfg.moe.num_experts, {.ep = ep});
  par::ProcessGroups groups = par::make_groups(world, mesh);
  Model model(cfg, seed + 1, sliced);
  par::DistTrainer trainer(model, mesh, groups, {.fsdp = true});
  // The load's progress (what the train command displays): monotone, one total, ending at it,
  // which is the bytes of the rank's slices.
  uint64_t progress_done = 0, progress_total = 0, read_bytes = 0, filled = 0;
  bool progress_ok = true;
  {
    SafetensorsModel st(a.dir, fp8_blocks(h));
    const HfSliceReader reader(model, h.model_type, st, a.dir, {.keep_lora = true});
    trainer.load_weights(
        [&](const std::string& name, int64_t b, int64_t e, float* out) {
          reader.read(model.params().at(name), b, e, out);
          filled += static_cast<uint64_t>(e - b) * sizeof(float);
        },
        [&](uint64_t done, uint64_t total) {
          progress_ok = progress_ok && done >= progress_done && done <= total &&
                        (progress_total == 0 || total == progress_total);
          progress_done = done;
          progress_total = total;
        });
    read_bytes = reader.elements_read() * sizeof(float);
  }
  const int64_t peak = status_bytes("VmHWM") - baseline;
  const double fraction = static_cast<double>(peak) / static_cast<double>(model_bytes);
  std::printf(
      "rank %d/%d: model %.1f MB in %zu shards; peak growth while loading %.1f MB = %.1f%%"
      " of the model (limit %.0f%%)\n",
      rank, W, model_bytes / 1e6, shards, peak / 1e6, 100 * fraction, 100 * a.max_fraction);
  int failures = 0;
  if (fraction >= a.max_fraction) {
    std::printf("rank %d: FAIL peak growth %.1f%% of the model, limit %.0f%%\n", rank,
                100 * fraction, 100 * a.max_fraction);
    ++failures;
  }

  // Values: a single-process load of the same setting (fresh adapters drawn as an ordinary
  // build draws them, then the checkpoint).
  Model ref(cfg, seed + 1, {.freeze_base = true});
  {
    SafetensorsModel st(a.dir, fp8_blocks(h));
    import_hf_tensors(ref, h.model_type, st, a.dir, {.keep_lora = true});
  }
  int64_t pieces = 0, elements = 0;
  for (const par::ShardPiece& p : trainer.checkpoint_pieces()) {
    if (p.name.rfind("m.", 0) == 0 || p.name.rfind("v.", 0) == 0) continue;
    const Param* q = ref.params().find(p.name);
    MT_CHECK(q, ValueError, "piece of an unknown parameter ", p.name);
    ++pieces;
    elements += p.end - p.begin;
    if (std::memcmp(p.data.raw(), q->value.f32() + p.begin,
                    static_cast<size_t>(p.end - p.begin) * sizeof(float)) != 0) {
      std::printf("rank %d: FAIL %s [%lld, %lld) differs from the single-process load\n", rank,
                  p.name.c_str(), static_cast<long long>(p.begin), static_cast<long long>(p.end));
      ++failures;
    }
  }
  std::printf("rank %d: %lld pieces (%lld elements) equal the single-process load\n", rank,
              static_cast<long long>(pieces), static_cast<long long>(elements));
  // Progress counts what the rank fills: the checkpoint's bytes plus the adapters it keeps.
  std::printf("rank %d: load progress ended at %llu of %llu bytes (%llu filled, %llu read)\n", rank,
              static_cast<unsigned long long>(progress_done),
              static_cast<unsigned long long>(progress_total),
              static_cast<unsigned long long>(filled), static_cast<unsigned long long>(read_bytes));
  if (!progress_ok || progress_done != progress_total || progress_total != filled ||
      read_bytes > filled || read_bytes == 0) {
    std::printf("rank %d: FAIL the load's progress is not monotone up to the rank's slices\n",
                rank);
    ++failures;
  }

  // Loss: the distributed forward over every rank's documents against one process over all.
  Context ctx(ContextOptions{.threads = 1});
  const Batch mine = make_batch(seed, cfg.vocab, rank, rank + 1);
  const double dist_loss = trainer.forward_backward(ctx, mine.seq, mine.ids, mine.targets);
  const Batch all = make_batch(seed, cfg.vocab, 0, W);
  const double ref_loss = ref.forward(ctx, all.seq, all.ids, all.targets);
  const double diff = std::fabs(dist_loss - ref_loss);
  std::printf("rank %d: loss %.9f distributed, %.9f one process (|diff| %.2e)\n", rank, dist_loss,
              ref_loss, diff);
  // Summation order only: per-rank means weighted and summed against one mean.
  if (!(std::isfinite(dist_loss) && diff <= 1e-5 * std::fabs(ref_loss))) {
    std::printf("rank %d: FAIL losses differ\n", rank);
    ++failures;
  }
  const double failed = world.all_reduce_sum(static_cast<double>(failures));
  world.barrier();
  if (rank == 0) fs::remove_all(a.dir);
  return failed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return mt::test::mpi_main(
      argc, argv, parse, [](const Args&) { return mt::par::CommOptions{}; }, run);
}
