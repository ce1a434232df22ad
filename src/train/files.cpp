#include "train/files.h"

#include <fstream>
#include <iterator>

#include "core/error.h"
#include "train/dataset.h"

namespace mt {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  MT_CHECK(in.good(), IoError, "cannot read '", p.string(), "'");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file_atomic(const std::filesystem::path& p, const std::string& text) {
  const std::filesystem::path tmp = p.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    out << text;
    out.close();
    MT_CHECK(out.good(), IoError, "cannot write '", tmp.string(), "'");
  }
  std::filesystem::rename(tmp, p);
}

std::string file_checksum(const std::filesystem::path& p) {
  const std::string bytes = read_file(p);
  return cat(std::hex, fnv1a64(bytes.data(), bytes.size()));
}

}  // namespace mt
