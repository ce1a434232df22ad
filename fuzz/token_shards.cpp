// Fuzz target: a prepared token dataset (index.json + one shard) through load_dataset and
// make_batch. The input is the index text, a NUL byte, then the bytes of shard_00000.bin. A
// checksum written as "fnv1a64": "@" is replaced by the shard's real one, so that mutations reach
// the checks behind the checksum (sizes, segment lengths, token ranges).
#include <cstring>

#include "fuzz/fuzz_target.h"
#include "train/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return mt::fuzz::run_one([&] {
    const char* p = reinterpret_cast<const char*>(data);
    const char* nul = static_cast<const char*>(std::memchr(p, 0, size));
    const size_t index_len = nul ? static_cast<size_t>(nul - p) : size;
    const char* shard = nul ? nul + 1 : p + size;
    const size_t shard_len = size - index_len - (nul ? 1 : 0);
    std::string index(p, index_len);
    const std::string marker = "\"fnv1a64\": \"@\"";
    if (const size_t at = index.find(marker); at != std::string::npos)
      index.replace(at, marker.size(),
                    mt::cat("\"fnv1a64\": \"", std::hex, mt::fnv1a64(shard, shard_len), "\""));
    const std::filesystem::path dir = mt::fuzz::scratch() / "dataset";
    std::filesystem::create_directories(dir);
    mt::fuzz::write_scratch("dataset/index.json", index.data(), index.size());
    mt::fuzz::write_scratch("dataset/shard_00000.bin", shard, shard_len);
    const mt::PackedData d = mt::load_dataset(dir.string());
    for (int64_t s = 0; s < d.sequences(); ++s) {
      const mt::Batch b = mt::make_batch(d, {s});
      if (b.seq.tokens != d.seq_len) std::abort();
    }
  });
}
