// An enum's names written once, as a table that naming and parsing both read (instead of a
// switch that names and a chain of ifs that parses). Each table is checked to have one row per
// value where it is defined (a static_assert on its size), which the switch's -Wswitch did.
#pragma once

#include <cstddef>
#include <iterator>
#include <optional>
#include <string_view>

namespace mt {

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

// The name of `e` in `names`; "?" for a value the table lacks.
template <typename E, size_t N>
constexpr const char* name_of(const EnumName<E> (&names)[N], E e) {
  for (const EnumName<E>& n : names)
    if (n.value == e) return n.name;
  return "?";
}

// The value named `s`, if the table has it.
template <typename E, size_t N>
constexpr std::optional<E> value_of(const EnumName<E> (&names)[N], std::string_view s) {
  for (const EnumName<E>& n : names)
    if (s == n.name) return n.value;
  return std::nullopt;
}

}  // namespace mt
