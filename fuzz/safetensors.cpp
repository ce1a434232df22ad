// Fuzz target: the safetensors reader (header JSON, dtypes, shapes, offsets) on arbitrary bytes.
// Whatever parses must be self-consistent: every tensor's bytes lie inside the file, and the
// tensors written back read back the same.
#include "io/safetensors.h"
#include "fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mt;
  return fuzz::run_one([&] {
    const std::string path =
        mt::fuzz::write_scratch("in.safetensors", reinterpret_cast<const char*>(data), size);
    mt::SafetensorsData d = mt::read_safetensors(path);
    size_t bytes = 0;
    for (const auto& [name, t] : d.tensors) {
      MT_CHECK(t.numel() == 0 || t.raw(), ValueError, "tensor '", name, "' has no data");
      bytes += t.bytes();
    }
    MT_CHECK(bytes <= size, ValueError, "tensors hold ", bytes, " bytes, the file ", size);
    const std::string out = (mt::fuzz::scratch() / "out.safetensors").string();
    mt::write_safetensors(out, d.tensors, d.metadata);
    mt::SafetensorsData back = mt::read_safetensors(out);
    if (back.tensors.size() != d.tensors.size()) std::abort();
    for (const auto& [name, t] : d.tensors)
      if (back.tensors.at(name).shape() != t.shape()) std::abort();
  });
}
