#include "train/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/precision.h"
#include "train/dataset.h"
#include "train/faults.h"
#include "train/files.h"

namespace mt {

namespace fs = std::filesystem;

namespace {

// The first key where two model configs differ, for "checkpoint from another model" messages.
std::string first_difference(const nlohmann::json& a, const nlohmann::json& b) {
  for (auto it = a.begin(); it != a.end(); ++it)
    if (!b.contains(it.key()) || b.at(it.key()) != it.value())
      return cat(it.key(), " = ", it.value().dump(), " in the checkpoint, ",
                 b.contains(it.key()) ? b.at(it.key()).dump() : "absent", " in this model");
  for (auto it = b.begin(); it != b.end(); ++it)
    if (!a.contains(it.key())) return cat(it.key(), " absent in the checkpoint");
  return "";
}

}  // namespace

std::string save_checkpoint(const std::string& root, const Model& model, const AdamW* opt,
                            const TrainState& st, const std::string& job_toml,
                            const std::function<void(const std::string&)>& after_file) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(st.step));
  const fs::path final_dir = fs::path(root) / name;
  const fs::path tmp = fs::path(root) / (std::string(name) + ".tmp");
  SaveFaults faults(FaultPlan::from_env(), st.step);
  try {
    fs::remove_all(tmp);  // the leftovers of a killed save
    fs::create_directories(tmp);
    // Each file: counted by the fault hook, then announced to the test hook.
    auto write = [&](const char* f, const std::function<void(const fs::path&)>& body) {
      faults.before_file(tmp / f);
      body(tmp / f);
      faults.after_file(tmp / f);
      if (after_file) after_file(f);
    };

    TensorMap weights, moments;
    size_t i = 0;
    for (const auto& p : model.params().all()) {
      weights[p->name] = p->value;
      if (opt && p->trainable()) {
        moments["m." + p->name] = opt->first_moments().at(i);
        moments["v." + p->name] = opt->second_moments().at(i);
        if (opt->masters().at(i).defined()) moments["master." + p->name] = opt->masters()[i];
        ++i;
      }
    }
    write("model.safetensors", [&](const fs::path& f) { write_safetensors(f.string(), weights); });
    if (opt)
      write("optimizer.safetensors",
            [&](const fs::path& f) { write_safetensors(f.string(), moments); });
    const nlohmann::json state = {{"step", st.step},
                                  {"data_cursor", st.data_cursor},
                                  {"rng_seed", st.rng_seed},
                                  {"rng_counter", st.rng_counter},
                                  {"optimizer_steps", opt ? opt->steps() : 0},
                                  {"model_config", model.config().to_json()}};
    write("state.json", [&](const fs::path& f) { write_file_atomic(f, state.dump(2)); });
    write("job.toml", [&](const fs::path& f) { write_file_atomic(f, job_toml); });
    nlohmann::json files = nlohmann::json::object();
    for (const auto& e : fs::directory_iterator(tmp))
      files[e.path().filename().string()] = {{"bytes", fs::file_size(e.path())},
                                             {"fnv1a64", file_checksum(e.path())}};
    const nlohmann::json manifest{{"precision", precision_name(model.precision())},
                                  {"files", files}};
    write("manifest.json", [&](const fs::path& f) { write_file_atomic(f, manifest.dump(2)); });
    commit_checkpoint(root, name, faults);
  } catch (const IoError& e) {
    std::error_code ec;
    fs::remove_all(tmp, ec);  // a failed save must not keep its partial files (a full disk)
    MT_THROW(IoError, "checkpoint '", final_dir.string(), "' not saved: ", e.message());
  } catch (const fs::filesystem_error& e) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    MT_THROW(IoError, "checkpoint '", final_dir.string(), "' not saved: ", e.what());
  }
  return final_dir.string();
}

void commit_checkpoint(const std::string& root, const std::string& name, SaveFaults& faults) {
  const fs::path dir = fs::path(root) / name, tmp = fs::path(root) / (name + ".tmp");
  // Every file was synced when written; the directory's entries reach the disk through it.
  fsync_path(tmp);
  faults.point("complete");
  // Saving over an existing step swaps the two directories: `latest` may name this step, and
  // it must name a complete directory at every instant.
  const bool displaced = install_dir(tmp, dir);
  faults.point("installed");
  const fs::path latest = fs::path(root) / "latest";
  faults.before_file(latest);
  write_file_atomic(latest, name + "\n");
  faults.after_file(latest);
  faults.point("latest");
  if (displaced) fs::remove_all(tmp);
}

std::string latest_checkpoint(const std::string& root) {
  const fs::path p = fs::path(root) / "latest";
  if (!fs::is_regular_file(p)) return "";
  std::string name = read_file(p);
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r')) name.pop_back();
  const fs::path dir = fs::path(root) / name;
  MT_CHECK(fs::is_directory(dir), IoError, "'", p.string(), "' names '", name,
           "', which does not exist");
  return dir.string();
}

namespace {

// Copies every tensor of `data` into the model's parameter of that name, converting to its
// stored dtype.
void assign_weights(const SafetensorsData& data, const std::string& path, Model& model) {
  size_t matched = 0;
  for (const auto& p : model.params().all()) {
    auto it = data.tensors.find(p->name);
    if (it == data.tensors.end()) {
      MT_CHECK(p->spec.role == ParamRole::Lora, ConfigError, "weights '", path,
               "' are from another model: no tensor '", p->name, "'");
      continue;
    }
    MT_CHECK(it->second.shape() == p->value.shape(), ConfigError, "weights '", path,
             "' are from another model: '", p->name, "' has shape ", it->second.shape(),
             ", this model ", p->value.shape());
    p->value.copy_from(it->second);
    ++matched;
  }
  for (const auto& [name, t] : data.tensors)
    MT_CHECK(model.params().find(name) != nullptr, ConfigError, "weights '", path,
             "' are from another model: this model has no parameter '", name, "'");
  (void)matched;
}

}  // namespace

void load_weights(const std::string& path, Model& model) {
  fs::path file = path;
  if (fs::is_directory(file) && fs::is_regular_file(file / "model.safetensors"))
    file /= "model.safetensors";
  MT_CHECK(fs::exists(file), IoError, "weights '", path, "' do not exist");
  assign_weights(fs::is_directory(file) ? read_safetensors_model(file.string())
                                        : read_safetensors(file.string()),
                 path, model);
}

TrainState load_checkpoint(const std::string& dir, Model& model, AdamW* opt) {
  const fs::path d = dir;
  MT_CHECK(fs::is_directory(d), IoError, "checkpoint '", dir, "' does not exist");
  MT_CHECK(fs::is_regular_file(d / "manifest.json"), IoError, "checkpoint '", dir,
           "' has no manifest.json (an incomplete save?)");
  nlohmann::json manifest = nlohmann::json::parse(read_file(d / "manifest.json"));
  for (auto it = manifest.at("files").begin(); it != manifest.at("files").end(); ++it) {
    const fs::path f = d / it.key();
    MT_CHECK(fs::is_regular_file(f), IoError, "checkpoint '", dir, "' lacks ", it.key());
    MT_CHECK(file_checksum(f) == it.value().at("fnv1a64").get<std::string>(), IoError,
             "checkpoint '", dir, "': ", it.key(), " does not match its checksum (corrupted)");
  }
  // Checkpoints written before precision policies existed were fp32 throughout.
  const std::string saved_as =
      manifest.contains("precision") ? manifest.at("precision").get<std::string>() : "fp32";
  const Precision saved =
      parse_precision(saved_as, cat("checkpoint '", dir, "' manifest precision"));
  nlohmann::json state = nlohmann::json::parse(read_file(d / "state.json"));
  const std::string diff = first_difference(state.at("model_config"), model.config().to_json());
  MT_CHECK(diff.empty(), ConfigError, "checkpoint '", dir,
           "' was written for another model: ", diff);
  const std::string weights_path = (d / "model.safetensors").string();
  const SafetensorsData weights = read_safetensors(weights_path);
  assign_weights(weights, weights_path, model);
  // The fp32 masters (saved with the optimizer state) are the trained values of parameters a
  // narrower policy stores rounded: they replace the rounded values, whatever this model's policy.
  SafetensorsData mom;
  const bool read_mom =
      opt || (saved.masters() && fs::is_regular_file(d / "optimizer.safetensors"));
  if (opt)
    MT_CHECK(fs::is_regular_file(d / "optimizer.safetensors"), IoError, "checkpoint '", dir,
             "' has no optimizer state");
  if (read_mom) mom = read_safetensors((d / "optimizer.safetensors").string());
  for (const auto& p : model.params().all()) {
    auto it = mom.tensors.find("master." + p->name);
    if (it != mom.tensors.end()) p->value.copy_from(it->second);
  }
  if (opt) {
    size_t i = 0;
    for (const auto& p : model.params().all()) {
      if (!p->trainable()) continue;
      if (Tensor& master = opt->masters().at(i); master.defined()) {
        // From the checkpoint's master, else from its weight: fp32 when saved under fp32.
        const Tensor* src = &p->value;
        if (auto m = mom.tensors.find("master." + p->name); m != mom.tensors.end())
          src = &m->second;
        else if (auto w = weights.tensors.find(p->name); w != weights.tensors.end())
          src = &w->second;
        master.copy_from(*src);
      }
      for (const char* k : {"m.", "v."}) {
        auto it = mom.tensors.find(k + p->name);
        MT_CHECK(it != mom.tensors.end(), ConfigError, "checkpoint '", dir,
                 "' has no optimizer state for '", p->name, "' (trained with other LoRA targets?)");
        Tensor& dst = k[0] == 'm' ? opt->first_moments().at(i) : opt->second_moments().at(i);
        MT_CHECK(it->second.shape() == dst.shape(), ConfigError, "checkpoint '", dir,
                 "': optimizer state for '", p->name, "' has shape ", it->second.shape());
        dst.copy_from(it->second);
      }
      ++i;
    }
    opt->set_steps(state.at("optimizer_steps").get<int64_t>());
  }
  return {.step = state.at("step").get<int64_t>(),
          .data_cursor = state.at("data_cursor").get<int64_t>(),
          .rng_seed = state.at("rng_seed").get<uint64_t>(),
          .rng_counter = state.at("rng_counter").get<uint64_t>(),
          .precision = saved_as};
}

void prune_checkpoints(const std::string& root, int64_t keep) {
  // The checkpoint `latest` names is never deleted: after a save killed between putting its
  // directory in place and updating `latest`, a newer directory exists that `latest` does not
  // name yet, and counting it must not delete the one a resume would read.
  std::string current;
  if (fs::is_regular_file(fs::path(root) / "latest")) {
    current = read_file(fs::path(root) / "latest");
    while (!current.empty() && (current.back() == '\n' || current.back() == '\r'))
      current.pop_back();
  }
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && n.rfind("step_", 0) == 0 && n.find(".tmp") == std::string::npos)
      dirs.push_back(e.path());
  }
  std::sort(dirs.begin(), dirs.end());
  for (size_t i = 0; i + static_cast<size_t>(keep) < dirs.size(); ++i)
    if (dirs[i].filename().string() != current) fs::remove_all(dirs[i]);
}

}  // namespace mt
