// The fuzz targets without libFuzzer: replays every file of the given corpus and crash folders,
// then runs a fixed number of deterministic mutations (seeded) of the corpus through the target.
// ctest runs this with any compiler (CI's gcc build); a finding aborts, and the input that caused
// it is written to ./fuzz-finding.bin first. Longer, coverage-guided runs: docs/reliability.md.
// Usage: fuzz_replay_X [--seed S] [--mutations N] PATH...
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/rng.h"
#include "fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

namespace fs = std::filesystem;

// The input under test, for the signal handler (which may only call async-signal-safe functions).
const std::string* g_current = nullptr;

void on_fatal(int sig) {
  if (g_current) {
    const int fd = ::open("fuzz-finding.bin", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      [[maybe_unused]] ssize_t n = ::write(fd, g_current->data(), g_current->size());
      ::close(fd);
    }
    const char msg[] = "fuzz replay: finding written to ./fuzz-finding.bin\n";
    [[maybe_unused]] ssize_t n = ::write(2, msg, sizeof msg - 1);
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void run(const std::string& s) {
  g_current = &s;
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  g_current = nullptr;
}

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Byte-level edits like libFuzzer's basic mutators, plus splices between corpus entries.
std::string mutate(mt::Rng& rng, std::string s, const std::vector<std::string>& corpus) {
  auto pos = [&](size_t n) { return static_cast<size_t>(rng.below(static_cast<int64_t>(n) + 1)); };
  const int edits = 1 + static_cast<int>(rng.below(4));
  for (int e = 0; e < edits; ++e) {
    switch (rng.below(7)) {
      case 0:  // flip bits of a byte
        if (!s.empty()) s[pos(s.size() - 1)] ^= static_cast<char>(1 + rng.below(255));
        break;
      case 1:  // truncate
        s.resize(pos(s.size()));
        break;
      case 2:  // insert a run of one random byte
        s.insert(pos(s.size()), std::string(1 + rng.below(8), static_cast<char>(rng.below(256))));
        break;
      case 3:  // a digit (lengths, offsets, sizes are decimal text in JSON and TOML)
        if (!s.empty()) s[pos(s.size() - 1)] = static_cast<char>('0' + rng.below(10));
        break;
      case 4:  // duplicate a slice
        if (s.size() > 2) {
          const size_t a = pos(s.size() - 1), n = pos(s.size() - a);
          s.insert(a, s.substr(a, n));
        }
        break;
      case 5:  // erase a slice
        if (!s.empty()) {
          const size_t a = pos(s.size() - 1);
          s.erase(a, pos(std::min<size_t>(16, s.size() - a)));
        }
        break;
      default: {  // splice: this input's head with another's tail
        const std::string& o =
            corpus[static_cast<size_t>(rng.below(static_cast<int64_t>(corpus.size())))];
        s = s.substr(0, pos(s.size())) + o.substr(pos(o.size()));
      }
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = 1;
  int64_t mutations = 0;
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seed" && i + 1 < argc) {
      seed = std::stoull(argv[++i]);
    } else if (a == "--mutations" && i + 1 < argc) {
      mutations = std::stoll(argv[++i]);
    } else if (fs::is_directory(a)) {
      for (const auto& e : fs::directory_iterator(a))
        if (e.is_regular_file() && e.path().filename() != "README") files.push_back(e.path());
    } else if (fs::is_regular_file(a)) {
      files.push_back(a);
    } else {
      std::fprintf(stderr, "usage: %s [--seed S] [--mutations N] PATH...  ('%s'?)\n", argv[0],
                   a.c_str());
      return 2;
    }
  }
  std::sort(files.begin(), files.end());  // directory order is not stable across filesystems
  std::signal(SIGABRT, on_fatal);
  std::signal(SIGSEGV, on_fatal);
  std::signal(SIGFPE, on_fatal);
  std::signal(SIGBUS, on_fatal);
  std::vector<std::string> corpus;
  for (const fs::path& f : files) {
    corpus.push_back(read_all(f));
    run(corpus.back());
    const std::string& why = mt::fuzz::last_rejection();
    std::fprintf(stderr, "replay %s (%zu bytes): %s\n", f.c_str(), corpus.back().size(),
                 why.empty() ? "parsed" : ("rejected: " + why).c_str());
  }
  if (corpus.empty()) {
    std::fprintf(stderr, "no inputs\n");
    return 2;
  }
  mt::Rng rng(seed);
  int64_t rejected = 0;
  for (int64_t m = 0; m < mutations; ++m) {
    const std::string& base =
        corpus[static_cast<size_t>(rng.below(static_cast<int64_t>(corpus.size())))];
    run(mutate(rng, base, corpus));
    rejected += !mt::fuzz::last_rejection().empty();
  }
  std::printf("%zu files replayed, %lld mutations (seed %llu, %lld rejected): no findings\n",
              corpus.size(), static_cast<long long>(mutations),
              static_cast<unsigned long long>(seed), static_cast<long long>(rejected));
  return 0;
}
