#include "harness/train_files.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"
#include "train/dataset.h"

namespace mt::test {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string suite = info ? info->test_suite_name() : "test";
  fs::path d = fs::temp_directory_path() / cat("mt_", suite, "_", name, "_", getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string write_tiny_dataset(const fs::path& dir, uint64_t seed, int sequences,
                               const std::vector<int64_t>& doc_lengths) {
  constexpr int32_t kVocab = 61;
  PackedData p{.seq_len = 24, .vocab = kVocab, .documents = 0};
  MT_CHECK(doc_lengths.empty() ||
               std::accumulate(doc_lengths.begin(), doc_lengths.end(), int64_t{0}) == p.seq_len,
           ValueError, "tiny dataset: document lengths must sum to ", p.seq_len);
  Rng rng(seed);
  for (int s = 0; s < sequences; ++s) {
    std::vector<int64_t> seg = doc_lengths;
    if (seg.empty())
      for (int64_t left = p.seq_len; left > 0;) {
        const int64_t l = std::min<int64_t>(left, 3 + rng.below(12));
        seg.push_back(l);
        left -= l;
      }
    p.documents += static_cast<int64_t>(seg.size());
    p.segments.push_back(seg);
    int32_t id = static_cast<int32_t>(rng.below(kVocab));
    for (int64_t t = 0; t < p.seq_len; ++t) {
      p.ids.push_back(id);
      id = rng.uniform() < 0.8 ? (id * 7 + 3) % kVocab : static_cast<int32_t>(rng.below(kVocab));
      p.targets.push_back(id);
    }
  }
  write_dataset(p, dir.string());
  return dir.string();
}

}  // namespace mt::test
