// Files for the training tests (tests/train): scratch directories and the tiny model's datasets.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace mt::test {

// A fresh, empty directory under the system's temp directory, named after the running test's
// suite, `name` and the process id: ctest runs each test in its own process, in parallel.
std::filesystem::path temp_dir(const std::string& name);

// A packed dataset for the `tiny` model (vocab 61, sequences of 24 tokens) written to dir:
// `sequences` sequences, each split into documents of doc_lengths (summing to 24) or, when empty,
// of random lengths from 3 to 14 tokens. The next id follows a learnable pattern,
// (id * 7 + 3) mod 61, 80% of the time, so training visibly lowers the loss. Returns dir.
std::string write_tiny_dataset(const std::filesystem::path& dir, uint64_t seed, int sequences,
                               const std::vector<int64_t>& doc_lengths = {});

}  // namespace mt::test
