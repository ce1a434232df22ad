// Integers read from JSON (config.json, model presets). nlohmann's get<T>() converts any number
// with a plain cast: a float beyond T's range is undefined behaviour (a libFuzzer finding,
// fuzz/crashes/hf_config), a fraction or a too-wide integer is truncated or wrapped silently.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <type_traits>
#include <utility>

namespace mt {

// Whether `v` is a number that T holds exactly: an integer in T's range, or a float with an
// integral value in it (4.0). Anything else that is not a number passes: get<T>() names its type.
template <typename T>
bool json_integer_fits(const nlohmann::json& v) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  if (v.is_number_unsigned()) return std::in_range<T>(v.get<uint64_t>());
  if (v.is_number_integer()) return std::in_range<T>(v.get<int64_t>());
  if (!v.is_number_float()) return true;
  const double d = v.get<double>();
  // 2^digits is exact in a double, and every T's minimum is 0 or -2^digits.
  return std::isfinite(d) && d == std::trunc(d) &&
         d >= static_cast<double>(std::numeric_limits<T>::min()) &&
         d < std::ldexp(1.0, std::numeric_limits<T>::digits);
}

}  // namespace mt
