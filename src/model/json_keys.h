// Strict reading of one JSON object (a config.json, one of its sub-objects, a model preset):
// typed reads that name the key and where it sits, and a record of every key read, so that what
// nothing read is refused by name. One reader for the three config parsers (model_config,
// io/hf_config, vision_config), which each kept their own copy.
#pragma once

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <type_traits>
#include <utility>

#include "core/error.h"
#include "model/json_integer.h"

namespace mt {

class JsonKeys {
 public:
  // Aliases: transformers writes some keys under attribute_map names; the first present wins and
  // messages name the first listed.
  using Names = std::initializer_list<const char*>;

  JsonKeys(const nlohmann::json& j, std::string where) : j_(j), where_(std::move(where)) {
    MT_CHECK(j.is_object(), ConfigError, where_, ": expected a JSON object");
  }
  bool has(Names names) const { return find(names) != nullptr; }
  bool has(const std::string& key) const { return present(key); }
  template <typename T>
  T get(Names names, T fallback) {
    use(names);
    const nlohmann::json* v = find(names);
    return v ? as<T>(*v, *names.begin()) : fallback;
  }
  template <typename T>
  T get(const std::string& key, T fallback) {
    used_.insert(key);
    return present(key) ? as<T>(j_.at(key), key) : fallback;
  }
  template <typename T>
  T need(Names names) {
    use(names);
    const nlohmann::json* v = find(names);
    MT_CHECK(v, ConfigError, where_, ": missing key '", *names.begin(), "'");
    return as<T>(*v, *names.begin());
  }
  template <typename T>
  T need(const std::string& key) {
    used_.insert(key);
    MT_CHECK(present(key), ConfigError, where_, ": missing key '", key, "'");
    return as<T>(j_.at(key), key);
  }
  // The value, or null when absent.
  const nlohmann::json* raw(const std::string& key) {
    used_.insert(key);
    return present(key) ? &j_.at(key) : nullptr;
  }
  // A nested object read by its own JsonKeys (an absent one reads as empty); `this` must outlive
  // it when it is absent.
  JsonKeys child(const std::string& key) {
    used_.insert(key);
    static const nlohmann::json empty = nlohmann::json::object();
    return JsonKeys(present(key) ? j_.at(key) : empty, where_ + "." + key);
  }
  // Keys with no effect on the forward/backward math (token ids, caching, bookkeeping).
  void ignore(Names names) { use(names); }
  void ignore(const std::string& key) { used_.insert(key); }
  // The keys transformers' PreTrainedConfig writes into every (sub-)config: bookkeeping, none of
  // them changes the math. Each parser ignores its family's further keys itself.
  void ignore_pretrained_config() {
    ignore({"architectures", "torch_dtype", "dtype", "transformers_version", "_name_or_path",
            "initializer_range", "output_attentions", "output_hidden_states", "return_dict",
            "id2label", "label2id", "use_cache", "chunk_size_feed_forward", "is_encoder_decoder",
            "problem_type"});
  }
  // A key that is accepted only with one value (the one the engine implements).
  template <typename T>
  void only(const std::string& key, T allowed) {
    used_.insert(key);
    if (!present(key)) return;
    MT_CHECK(as<T>(j_.at(key), key) == allowed, ConfigError, where_, ": '", key,
             "' = ", j_.at(key).dump(), " is not supported (only ", nlohmann::json(allowed).dump(),
             ")");
  }
  // Keys refused whatever their value, for `why`.
  void refuse(Names names, const char* why) const {
    for (const char* k : names)
      MT_CHECK(!present(k), ConfigError, where_, ": '", k, "' is not supported (", why, ")");
  }
  void reject_unknown() const {
    for (auto it = j_.begin(); it != j_.end(); ++it)
      MT_CHECK(used_.count(it.key()), ConfigError, where_, ": unknown or unsupported key '",
               it.key(), "'");
  }
  const std::string& where() const { return where_; }

 private:
  bool present(const std::string& key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  void use(Names names) {
    for (const char* n : names) used_.insert(n);
  }
  const nlohmann::json* find(Names names) const {
    for (const char* n : names)
      if (present(n)) return &j_.at(n);
    return nullptr;
  }
  template <typename T>
  T as(const nlohmann::json& v, const std::string& key) const {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
      MT_CHECK(json_integer_fits<T>(v), ConfigError, where_, ": key '", key, "' = ", v.dump(),
               " is not an integer in range");
    try {
      return v.get<T>();
    } catch (const nlohmann::json::exception&) {
      MT_THROW(ConfigError, where_, ": key '", key, "' has the wrong type (", v.type_name(), ")");
    }
  }

  const nlohmann::json& j_;
  std::string where_;
  std::set<std::string> used_;
};

// `key` (read from `where`) must be positive.
inline void require_positive(int64_t v, const std::string& where, const char* key) {
  MT_CHECK(v > 0, ConfigError, where, ": '", key, "' must be positive, got ", v);
}

}  // namespace mt
