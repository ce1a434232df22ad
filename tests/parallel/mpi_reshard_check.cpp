// Resharding restores the state bitwise at load (docs/reliability.md, "Faults"). Two modes:
//   mpirun -np W mpi_reshard_check save CHECKPOINT OUT_ROOT [KEY=VALUE...]
//     every rank builds the checkpoint's own job (its job.toml, with the overrides: another
//     parallel.ep, parallel.fsdp) on a mesh of W ranks, loads CHECKPOINT and saves it again at
//     once, under OUT_ROOT: the save writes exactly what each rank holds (its pieces, in
//     one-process coordinates), so the new files are the restored in-memory state.
//   mpi_reshard_check compare A B
//     one process reads both checkpoints (sharded or not) whole and requires every weight, AdamW
//     moment, the optimizer's step count and the train state (step, data cursor, RNG) to be equal
//     bit for bit; it prints the number of tensors and bytes compared.
// tests/parallel/reshard_check.sh drives it; training on from a reshard is checked by losses in
// train_cli_check.sh.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/error.h"
#include "model/model.h"
#include "parallel/comm.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "train/dist_executor.h"
#include "train/files.h"
#include "train/job.h"

namespace {

using namespace mt;

Job checkpoint_job(const std::string& dir, const std::vector<std::string>& overrides) {
  return Job::parse(read_file(dir + "/job.toml"), dir + "/job.toml", overrides);
}

int save_after_load(par::Comm& world, const std::string& ck, const std::string& out,
                    const std::vector<std::string>& overrides) {
  const Job job = checkpoint_job(ck, overrides);
  const ModelConfig cfg = job_model_config(job);
  DistSetup setup(world, cfg, job);
  Context ctx(ContextOptions{.threads = 1, .seed = job.seed});
  Model model(cfg, job.seed, job_model_options(job));
  auto exec = make_dist_executor(ctx, model, setup, {});
  const TrainState st = exec->load(ck);
  const std::string dir = exec->save(out, st, job.to_toml());
  if (world.rank() == 0) std::printf("%s\n", dir.c_str());
  return 0;
}

struct Whole {
  Whole(const std::string& dir, const ModelConfig& cfg, const ModelOptions& mo)
      : model(cfg, 1, mo), opt(model.params(), {}) {
    st = is_sharded_checkpoint(dir) ? load_sharded_checkpoint(dir, model, &opt)
                                    : load_checkpoint(dir, model, &opt);
  }
  Model model;
  AdamW opt;
  TrainState st;
};

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && a.bytes() == b.bytes() &&
         std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

int compare(const std::string& a_dir, const std::string& b_dir) {
  const Job job = checkpoint_job(a_dir, {});
  const ModelConfig cfg = job_model_config(job);
  const Whole a(a_dir, cfg, job_model_options(job)), b(b_dir, cfg, job_model_options(job));
  int bad = 0;
  int64_t tensors = 0, bytes = 0;
  auto check = [&](const std::string& what, const Tensor& x, const Tensor& y) {
    ++tensors;
    bytes += static_cast<int64_t>(x.bytes());
    if (same_bits(x, y)) return;
    std::fprintf(stderr, "MISMATCH %s\n", what.c_str());
    ++bad;
  };
  const auto &pa = a.model.params().all(), &pb = b.model.params().all();
  size_t t = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    check(pa[i]->name, pa[i]->value, pb[i]->value);
    if (!pa[i]->trainable()) continue;
    check("m." + pa[i]->name, a.opt.first_moments().at(t), b.opt.first_moments().at(t));
    check("v." + pa[i]->name, a.opt.second_moments().at(t), b.opt.second_moments().at(t));
    ++t;
  }
  const auto state = [](const Whole& w) {
    return cat("step ", w.st.step, " cursor ", w.st.data_cursor, " rng ", w.st.rng_seed, "/",
               w.st.rng_counter, " optimizer steps ", w.opt.steps());
  };
  if (state(a) != state(b)) {
    std::fprintf(stderr, "MISMATCH state: %s vs %s\n", state(a).c_str(), state(b).c_str());
    ++bad;
  }
  std::printf("%s vs %s: %lld tensors, %lld bytes, %s; %d mismatches\n", a_dir.c_str(),
              b_dir.c_str(), static_cast<long long>(tensors), static_cast<long long>(bytes),
              state(a).c_str(), bad);
  return bad == 0 && tensors > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  par::MpiRuntime mpi(&argc, &argv);
  auto world = mpi.world();
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.size() >= 3 && args[0] == "save")
      return save_after_load(*world, args[1], args[2], {args.begin() + 3, args.end()});
    if (args.size() == 3 && args[0] == "compare") return compare(args[1], args[2]);
    std::fprintf(stderr, "usage: mpi_reshard_check save CK OUT [KEY=VALUE...] | compare A B\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d failed: %s\n", world->rank(), e.what());
    std::fflush(stderr);
    world->abort(2);
  }
  return 2;
}
