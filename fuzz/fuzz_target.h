// Shared by the fuzz targets (fuzz/*.cpp): the contract every parser is held to. An input either
// parses or raises an mt::Error (a typed error naming what is wrong); any other exception, a
// sanitizer report or a signal is a finding. Each target defines LLVMFuzzerTestOneInput, so the
// same file builds as a libFuzzer binary (clang, -DMOETRAIN_FUZZ=ON) and into the replay driver
// (fuzz/replay_main.cpp) that ctest runs with any compiler.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"

namespace mt::fuzz {

// Why the last input was rejected ("" when it parsed): the replay driver reports it per file, so
// a seed that no longer parses shows.
inline std::string& last_rejection() {
  static std::string why;
  return why;
}

// Runs `body`; an mt::Error is a correct rejection, anything else aborts with the message.
template <class F>
int run_one(F&& body) {
  last_rejection().clear();
  try {
    body();
  } catch (const Error& e) {
    last_rejection() = e.what();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: untyped exception: %s\n", e.what());
    std::abort();
  }
  return 0;
}

// A per-process scratch directory (parsers that take paths read the input from a file there).
inline const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("mt_fuzz_" + std::to_string(getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

inline std::string write_scratch(const std::string& name, const char* data, size_t n) {
  const std::string p = (scratch() / name).string();
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(data, static_cast<std::streamsize>(n));
  return p;
}

}  // namespace mt::fuzz
