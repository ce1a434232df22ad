#include "io/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

namespace mt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The format caps the header at 100 MB; a larger length means a corrupt or hostile file.
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

// Element size of every dtype the format defines; 0 for names it does not define.
size_t format_dtype_size(const std::string& d) {
  static constexpr std::pair<const char*, size_t> kSizes[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  for (const auto& [name, size] : kSizes)
    if (d == name) return size;
  return 0;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: renormalise into an f32 normal
      int e = -1;
      do {
        man <<= 1;
        ++e;
      } while ((man & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | man << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

const char* format_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::BF16:
      return "BF16";
    case DType::I32:
      return "I32";
    case DType::I64:
      return "I64";
  }
  return "?";
}

uint64_t file_size_of(const std::string& path) {
  std::error_code ec;
  auto st = fs::status(path, ec);
  MT_CHECK(!ec && fs::exists(st), IoError, path, ": no such file");
  MT_CHECK(fs::is_regular_file(st), IoError, path, ": not a regular file");
  uint64_t n = fs::file_size(path, ec);
  MT_CHECK(!ec, IoError, path, ": cannot stat: ", ec.message());
  return n;
}

struct Header {
  std::vector<SafetensorsEntry> entries;
  MetadataMap metadata;
  uint64_t data_start = 0;  // absolute offset of the data section
};

uint64_t as_u64(const json& v, const std::string& path, const std::string& name, const char* what) {
  MT_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0), IoError,
           path, ": tensor '", name, "': ", what, " must be a non-negative integer, got ",
           v.dump());
  return v.get<uint64_t>();
}

Header parse_header(const std::string& path, std::ifstream& in, uint64_t fsize) {
  MT_CHECK(fsize >= 8, IoError, path, ": truncated header (file is ", fsize,
           " bytes, the length prefix alone needs 8)");
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  MT_CHECK(in.good(), IoError, path, ": cannot read the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | len_bytes[i];
  MT_CHECK(n <= fsize - 8, IoError, path, ": header length ", n, " beyond file size ", fsize);
  MT_CHECK(n <= kMaxHeaderBytes, IoError, path, ": header length ", n, " exceeds the 100 MB limit");
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  MT_CHECK(in.good() || n == 0, IoError, path, ": truncated header");
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  MT_CHECK(!j.is_discarded(), IoError, path, ": malformed JSON header");
  MT_CHECK(j.is_object(), IoError, path, ": header is not a JSON object");

  Header h;
  h.data_start = 8 + n;
  uint64_t data_size = fsize - h.data_start;
  for (const auto& [key, val] : j.items()) {
    if (key == "__metadata__") {
      MT_CHECK(val.is_object(), IoError, path, ": __metadata__ is not an object");
      for (const auto& [mk, mv] : val.items()) {
        MT_CHECK(mv.is_string(), IoError, path, ": __metadata__ value '", mk, "' is not a string");
        h.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    MT_CHECK(val.is_object(), IoError, path, ": tensor '", key, "': entry is not an object");
    for (const char* field : {"dtype", "shape", "data_offsets"})
      MT_CHECK(val.contains(field), IoError, path, ": tensor '", key, "': missing '", field, "'");
    SafetensorsEntry e;
    e.name = key;
    MT_CHECK(val["dtype"].is_string(), IoError, path, ": tensor '", key, "': dtype not a string");
    e.dtype = val["dtype"].get<std::string>();
    size_t esize = format_dtype_size(e.dtype);
    MT_CHECK(esize != 0, IoError, path, ": tensor '", key, "': unknown dtype '", e.dtype, "'");
    const json& shape = val["shape"];
    MT_CHECK(shape.is_array(), IoError, path, ": tensor '", key, "': shape is not an array");
    // Overflow-safe element count: any count beyond the data section is a mismatch anyway.
    uint64_t numel = 1;
    bool overflow = false;
    for (const json& d : shape) {
      uint64_t dim = as_u64(d, path, key, "shape dimension");
      MT_CHECK(dim <= uint64_t(std::numeric_limits<int64_t>::max()), IoError, path, ": tensor '",
               key, "': dimension ", dim, " too large");
      e.shape.push_back(static_cast<int64_t>(dim));
      if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / esize / dim) overflow = true;
      numel *= dim;
    }
    const json& off = val["data_offsets"];
    MT_CHECK(off.is_array() && off.size() == 2, IoError, path, ": tensor '", key,
             "': data_offsets must be [begin, end]");
    e.begin = as_u64(off[0], path, key, "data offset");
    e.end = as_u64(off[1], path, key, "data offset");
    MT_CHECK(e.begin <= e.end && e.end <= data_size, IoError, path, ": tensor '", key,
             "': data offsets [", e.begin, ",", e.end, ") outside the data section of ", data_size,
             " bytes");
    MT_CHECK(!overflow && numel * esize == e.end - e.begin, ShapeError, path, ": tensor '", key,
             "': shape ", Shape(e.shape), " of ", e.dtype, " needs ",
             overflow ? std::string("more") : std::to_string(numel * esize),
             " bytes, data offsets span ", e.end - e.begin);
    h.entries.push_back(std::move(e));
  }
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : h.entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const auto* a = by_offset[i - 1];
    const auto* b = by_offset[i];
    // Empty tensors occupy no bytes and overlap nothing.
    if (b->begin == b->end || a->begin == a->end) continue;
    MT_CHECK(b->begin >= a->end, IoError, path, ": tensors '", a->name, "' [", a->begin, ",",
             a->end, ") and '", b->name, "' [", b->begin, ",", b->end, ") overlap");
  }
  return h;
}

Tensor convert(const SafetensorsEntry& e, const char* src, const std::string& path) {
  Shape shape(e.shape);
  int64_t n = shape.numel();
  if (e.dtype == "F32") {
    Tensor t = Tensor::empty(shape, DType::F32);
    if (n) std::memcpy(t.raw(), src, t.bytes());
    return t;
  }
  if (e.dtype == "I32" || e.dtype == "I64") {
    Tensor t = Tensor::empty(shape, e.dtype == "I32" ? DType::I32 : DType::I64);
    if (n) std::memcpy(t.raw(), src, t.bytes());
    return t;
  }
  Tensor t = Tensor::empty(shape, DType::F32);
  float* d = t.f32();
  if (e.dtype == "BF16" || e.dtype == "F16") {
    bool bf = e.dtype == "BF16";
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      d[i] = bf ? bf16_to_f32(h) : f16_to_f32(h);
    }
    return t;
  }
  if (e.dtype == "F64") {
    for (int64_t i = 0; i < n; ++i) {
      double v;
      std::memcpy(&v, src + 8 * i, 8);
      d[i] = static_cast<float>(v);
    }
    return t;
  }
  MT_THROW(IoError, path, ": tensor '", e.name, "': dtype ", e.dtype,
           " is not supported (F32, F16, BF16, F64, I32, I64 are)");
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    MT_CHECK(w > 0, IoError, path, ": write failed: ", std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    // Best effort: some filesystems refuse fsync on directories; the data itself is synced.
    (void)::fsync(fd);
    ::close(fd);
  }
}

// Writes `chunks` to a temporary sibling of `path`, syncs it and renames it into place, so a
// reader sees either the old file or the complete new one.
void atomic_write(const std::string& path,
                  const std::vector<std::pair<const void*, size_t>>& chunks) {
  fs::path target(path);
  fs::path tmp = target;
  tmp += ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MT_CHECK(fd >= 0, IoError, path, ": cannot create ", tmp.string(), ": ", std::strerror(errno));
  try {
    for (const auto& [p, n] : chunks) write_all(fd, p, n, tmp.string());
    MT_CHECK(::fsync(fd) == 0, IoError, path, ": fsync failed: ", std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  MT_CHECK(::close(fd) == 0, IoError, path, ": close failed: ", std::strerror(errno));
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    MT_THROW(IoError, path, ": rename failed: ", std::strerror(err));
  }
  fsync_dir(target.parent_path());
}

void check_writable(const std::string& name, const Tensor& t, const std::string& path) {
  MT_CHECK(!name.empty() && name != "__metadata__", IoError, path, ": invalid tensor name '", name,
           "'");
  MT_CHECK(t.device() == Device::CPU, IoError, path, ": tensor '", name, "' is on ",
           device_name(t.device()), "; copy it to the host first");
  MT_CHECK(t.numel() == 0 || t.raw() != nullptr, IoError, path, ": tensor '", name,
           "' has no data");
}

}  // namespace

std::vector<SafetensorsEntry> read_safetensors_header(const std::string& path,
                                                      MetadataMap* metadata) {
  uint64_t fsize = file_size_of(path);
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in, IoError, path, ": cannot open");
  Header h = parse_header(path, in, fsize);
  if (metadata) *metadata = std::move(h.metadata);
  return std::move(h.entries);
}

SafetensorsData read_safetensors(const std::string& path) {
  uint64_t fsize = file_size_of(path);
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in, IoError, path, ": cannot open");
  Header h = parse_header(path, in, fsize);
  SafetensorsData out;
  out.metadata = std::move(h.metadata);
  std::vector<char> buf;
  for (const auto& e : h.entries) {
    size_t n = static_cast<size_t>(e.end - e.begin);
    buf.resize(n);
    in.seekg(static_cast<std::streamoff>(h.data_start + e.begin));
    if (n) in.read(buf.data(), static_cast<std::streamsize>(n));
    MT_CHECK(in.good(), IoError, path, ": tensor '", e.name, "': short read");
    out.tensors.emplace(e.name, convert(e, buf.data(), path));
  }
  return out;
}

SafetensorsData read_safetensors_model(const std::string& path) {
  fs::path p(path);
  std::error_code ec;
  if (!fs::is_directory(p, ec)) return read_safetensors(path);

  fs::path index = p / "model.safetensors.index.json";
  if (fs::exists(index, ec)) {
    std::ifstream in(index);
    MT_CHECK(in, IoError, index.string(), ": cannot open");
    json j = json::parse(in, nullptr, false);
    MT_CHECK(!j.is_discarded() && j.is_object(), IoError, index.string(), ": malformed JSON");
    MT_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), IoError, index.string(),
             ": missing object 'weight_map'");
    std::map<std::string, std::vector<std::string>> by_file;
    for (const auto& [name, file] : j["weight_map"].items()) {
      MT_CHECK(file.is_string(), IoError, index.string(), ": weight_map['", name,
               "'] is not a string");
      std::string f = file.get<std::string>();
      // Shards live next to the index; a path that leaves the directory is refused.
      MT_CHECK(!f.empty() && f.find('/') == std::string::npos && f != "." && f != "..", IoError,
               index.string(), ": weight_map['", name, "'] names an invalid file '", f, "'");
      by_file[f].push_back(name);
    }
    SafetensorsData out;
    for (const auto& [file, names] : by_file) {
      std::string fp = (p / file).string();
      SafetensorsData shard = read_safetensors(fp);
      for (const auto& name : names)
        MT_CHECK(shard.tensors.count(name), IoError, fp, ": tensor '", name,
                 "' listed in the index is not in this shard");
      for (auto& [name, t] : shard.tensors) {
        MT_CHECK(!out.tensors.count(name), IoError, fp, ": tensor '", name,
                 "' also appears in another shard");
        out.tensors.emplace(name, std::move(t));
      }
      for (auto& [k, v] : shard.metadata) out.metadata.emplace(k, std::move(v));
    }
    if (j.contains("metadata") && j["metadata"].is_object())
      for (const auto& [k, v] : j["metadata"].items())
        if (v.is_string()) out.metadata[k] = v.get<std::string>();
    return out;
  }
  fs::path single = p / "model.safetensors";
  if (fs::exists(single, ec)) return read_safetensors(single.string());

  std::vector<std::string> files;
  for (const auto& de : fs::directory_iterator(p, ec))
    if (de.path().extension() == ".safetensors") files.push_back(de.path().string());
  MT_CHECK(!files.empty(), IoError, path, ": no model.safetensors, index or *.safetensors file");
  std::sort(files.begin(), files.end());
  SafetensorsData out;
  for (const auto& f : files) {
    SafetensorsData part = read_safetensors(f);
    for (auto& [name, t] : part.tensors) {
      MT_CHECK(!out.tensors.count(name), IoError, f, ": tensor '", name,
               "' also appears in another file");
      out.tensors.emplace(name, std::move(t));
    }
    for (auto& [k, v] : part.metadata) out.metadata.emplace(k, std::move(v));
  }
  return out;
}

void write_safetensors(const std::string& path, const TensorMap& tensors,
                       const MetadataMap& metadata) {
  json header = json::object();
  if (!metadata.empty()) {
    json m = json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  uint64_t offset = 0;
  std::vector<std::pair<const void*, size_t>> chunks;
  for (const auto& [name, t] : tensors) {
    check_writable(name, t, path);
    json e;
    e["dtype"] = format_name(t.dtype());
    e["shape"] = t.shape().dims();
    e["data_offsets"] = {offset, offset + t.bytes()};
    header[name] = e;
    offset += t.bytes();
    if (t.bytes()) chunks.emplace_back(t.raw(), t.bytes());
  }
  std::string text = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  unsigned char len[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  chunks.insert(chunks.begin(), {{len, 8}, {text.data(), text.size()}});
  atomic_write(path, chunks);
}

void write_safetensors_sharded(const std::string& dir, const TensorMap& tensors,
                               const MetadataMap& metadata, uint64_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  MT_CHECK(!ec, IoError, dir, ": cannot create directory: ", ec.message());
  std::vector<TensorMap> shards(1);
  uint64_t cur = 0, total = 0;
  for (const auto& [name, t] : tensors) {
    if (cur > 0 && cur + t.bytes() > max_shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().emplace(name, t);
    cur += t.bytes();
    total += t.bytes();
  }
  fs::path d(dir);
  if (shards.size() == 1) {
    write_safetensors((d / "model.safetensors").string(), tensors, metadata);
    // A stale index from an earlier sharded save would take precedence on load.
    fs::remove(d / "model.safetensors.index.json", ec);
    return;
  }
  auto shard_name = [&](size_t i) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    return std::string(buf);
  };
  json weight_map = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    write_safetensors((d / shard_name(i)).string(), shards[i], metadata);
    for (const auto& [name, t] : shards[i]) weight_map[name] = shard_name(i);
  }
  json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = weight_map;
  std::string text = index.dump(2) + "\n";
  atomic_write((d / "model.safetensors.index.json").string(), {{text.data(), text.size()}});
}

}  // namespace mt
