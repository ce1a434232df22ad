#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
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

// The safetensors spelling of each dtype.
constexpr EnumName<DType> kFormatNames[] = {{DType::F32, "F32"},
                                            {DType::BF16, "BF16"},
                                            {DType::I32, "I32"},
                                            {DType::I64, "I64"},
                                            {DType::F64, "F64"}};
static_assert(std::size(kFormatNames) == std::size(kDTypeNames));

const char* format_name(DType t) {
  return name_of(kFormatNames, t);
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

// The dtype an entry has once read: F32 for floating formats, I32/I64 kept.
DType loaded_dtype_of(const std::string& d) {
  return d == "I32" ? DType::I32 : d == "I64" ? DType::I64 : DType::F32;
}

// Decodes `n` elements of entry `e` starting at `src` into `out` (its loaded dtype).
void decode_n(const SafetensorsEntry& e, const char* src, int64_t n, const std::string& path,
              void* out) {
  if (e.dtype == "F32" || e.dtype == "I32" || e.dtype == "I64") {
    if (n) std::memcpy(out, src, static_cast<size_t>(n) * format_dtype_size(e.dtype));
    return;
  }
  float* d = static_cast<float*>(out);
  if (e.dtype == "BF16" || e.dtype == "F16") {
    bool bf = e.dtype == "BF16";
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      d[i] = bf ? bf16_to_f32(h) : f16_to_f32(h);
    }
    return;
  }
  if (e.dtype == "F64") {
    for (int64_t i = 0; i < n; ++i) {
      double v;
      std::memcpy(&v, src + 8 * i, 8);
      d[i] = static_cast<float>(v);
    }
    return;
  }
  MT_THROW(IoError, path, ": tensor '", e.name, "': dtype ", e.dtype,
           " is not supported (F32, F16, BF16, F64, I32, I64 are; F8_E4M3 with its "
           "'_scale_inv' block scales in a model directory)");
}

// Decodes all of entry `e` (bytes at `src`) into `out`, which holds numel elements.
void decode(const SafetensorsEntry& e, const char* src, const std::string& path, void* out) {
  decode_n(e, src, Shape(e.shape).numel(), path, out);
}

void check_decodable(const SafetensorsEntry& e, const std::string& path) {
  static constexpr const char* kOk[] = {"F32", "BF16", "F16", "F64", "I32", "I64"};
  for (const char* d : kOk)
    if (e.dtype == d) return;
  decode(e, nullptr, path, nullptr);  // throws the message naming the tensor
}

Tensor convert(const SafetensorsEntry& e, const char* src, const std::string& path) {
  check_decodable(e, path);
  Tensor t = Tensor::empty(Shape(e.shape), loaded_dtype_of(e.dtype));
  decode(e, src, path, t.raw());
  return t;
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
// A file written under a temporary name in its directory, then fsynced and renamed over the
// target (and the directory fsynced): readers see the old file or the whole new one.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path) : path_(path), tmp_(path) {
    tmp_ += ".tmp." + std::to_string(::getpid());
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    MT_CHECK(fd_ >= 0, IoError, path, ": cannot create ", tmp_.string(), ": ",
             std::strerror(errno));
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() {
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(tmp_.c_str());
    }
  }
  void write(const void* p, size_t n) { write_all(fd_, p, n, tmp_.string()); }
  void commit() {
    MT_CHECK(::fsync(fd_) == 0, IoError, path_, ": fsync failed: ", std::strerror(errno));
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) {
      ::unlink(tmp_.c_str());
      MT_THROW(IoError, path_, ": close failed: ", std::strerror(errno));
    }
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
      int err = errno;
      ::unlink(tmp_.c_str());
      MT_THROW(IoError, path_, ": rename failed: ", std::strerror(err));
    }
    fsync_dir(fs::path(path_).parent_path());
  }

 private:
  std::string path_;
  fs::path tmp_;
  int fd_ = -1;
};

void atomic_write(const std::string& path,
                  const std::vector<std::pair<const void*, size_t>>& chunks) {
  AtomicFile f(path);
  for (const auto& [p, n] : chunks) f.write(p, n);
  f.commit();
}

// The 8-byte length and the JSON header, padded with spaces so the data section starts 8-byte
// aligned, as the reference writer does.
std::string header_bytes(const json& header) {
  std::string text = header.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  return out + text;
}

json metadata_json(const MetadataMap& metadata) {
  json m = json::object();
  for (const auto& [k, v] : metadata) m[k] = v;
  return m;
}

std::string shard_file_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

void write_index(const fs::path& d, const json& weight_map, uint64_t total) {
  json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = weight_map;
  std::string text = index.dump(2) + "\n";
  atomic_write((d / "model.safetensors.index.json").string(), {{text.data(), text.size()}});
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

float fp8_e4m3_to_f32(uint8_t b) {
  const float sign = (b & 0x80) ? -1.f : 1.f;
  const int exp = (b >> 3) & 0xf, man = b & 0x7;
  if (exp == 0xf && man == 0x7) return std::numeric_limits<float>::quiet_NaN();
  // Subnormals (exp 0) have no implicit 1 and the exponent of exp 1.
  if (exp == 0) return sign * std::ldexp(static_cast<float>(man) / 8.f, -6);
  return sign * std::ldexp(1.f + static_cast<float>(man) / 8.f, exp - 7);
}

struct SafetensorsModel::File {
  std::string path;
  Header header;
  int fd = -1;
  char* base = nullptr;
  size_t size = 0;
  ~File() {
    if (base) ::munmap(base, size);
    if (fd >= 0) ::close(fd);
  }
  const char* data(const SafetensorsEntry& e) const { return base + header.data_start + e.begin; }
  // The pages of a decoded tensor are not needed again: drop them from this process, so the
  // resident set holds at most the tensor being decoded (the page cache keeps what it wants).
  void release(const SafetensorsEntry& e) const { release(data(e), e.end - e.begin); }
  // The same for bytes [p, p + n) of the mapping (a slice; neighbours fault back in if read).
  void release(const char* p, uint64_t n) const {
    if (!base || n == 0) return;
    const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    uintptr_t lo = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
    uintptr_t hi = reinterpret_cast<uintptr_t>(p) + n;
    (void)::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
  }
};

SafetensorsModel::~SafetensorsModel() = default;

void SafetensorsModel::add_file(const std::string& path, const std::vector<std::string>* listed,
                                const std::string& index) {
  auto f = std::make_unique<File>();
  f->path = path;
  if (listed && !fs::exists(path)) {
    MT_THROW(IoError, index, ": shard '", fs::path(path).filename().string(), "' (holding '",
             listed->front(), "'",
             listed->size() > 1 ? cat(" and ", listed->size() - 1, " more") : std::string(),
             ") does not exist");
  }
  const uint64_t fsize = file_size_of(path);
  {
    std::ifstream in(path, std::ios::binary);
    MT_CHECK(in, IoError, path, ": cannot open");
    f->header = parse_header(path, in, fsize);
  }
  if (listed) {
    std::set<std::string> have;
    for (const auto& e : f->header.entries) have.insert(e.name);
    for (const auto& name : *listed)
      MT_CHECK(have.count(name), IoError, path, ": tensor '", name,
               "' listed in the index is not in this shard");
  }
  f->size = static_cast<size_t>(fsize);
  if (fsize > f->header.data_start) {
    f->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    MT_CHECK(f->fd >= 0, IoError, path, ": cannot open: ", std::strerror(errno));
    void* m = ::mmap(nullptr, f->size, PROT_READ, MAP_PRIVATE, f->fd, 0);
    MT_CHECK(m != MAP_FAILED, IoError, path, ": cannot map: ", std::strerror(errno));
    f->base = static_cast<char*>(m);
  }
  total_bytes_ += fsize - f->header.data_start;
  const size_t fi = files_.size();
  for (size_t i = 0; i < f->header.entries.size(); ++i) {
    const std::string& name = f->header.entries[i].name;
    MT_CHECK(!where_.count(name), IoError, path, ": tensor '", name, "' also appears in another ",
             listed ? "shard" : "file");
    where_[name] = {fi, i, {}};
  }
  for (auto& [k, v] : f->header.metadata) metadata_.emplace(k, v);
  files_.push_back(std::move(f));
}

SafetensorsModel::SafetensorsModel(const std::string& path, Fp8Blocks fp8) : fp8_(fp8) {
  MT_CHECK(fp8.rows > 0 && fp8.cols > 0, ValueError, path, ": FP8 block size ", fp8.rows, "x",
           fp8.cols, " must be positive");
  fs::path p(path);
  std::error_code ec;
  if (!fs::is_directory(p, ec)) {
    add_file(path, nullptr, "");
  } else if (fs::path index = p / "model.safetensors.index.json"; fs::exists(index, ec)) {
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
    for (const auto& [file, names] : by_file) add_file((p / file).string(), &names, index.string());
    if (j.contains("metadata") && j["metadata"].is_object())
      for (const auto& [k, v] : j["metadata"].items())
        if (v.is_string()) metadata_[k] = v.get<std::string>();
  } else if (fs::exists(p / "model.safetensors", ec)) {
    add_file((p / "model.safetensors").string(), nullptr, "");
  } else {
    std::vector<std::string> files;
    for (const auto& de : fs::directory_iterator(p, ec))
      if (de.path().extension() == ".safetensors") files.push_back(de.path().string());
    MT_CHECK(!files.empty(), IoError, path, ": no model.safetensors, index or *.safetensors file");
    std::sort(files.begin(), files.end());
    for (const auto& f : files) add_file(f, nullptr, "");
  }
  // Pair every FP8 weight with its scale; the scale may sit in another shard.
  for (auto& [name, w] : where_) {
    const SafetensorsEntry& e = files_[w.file]->header.entries[w.entry];
    if (e.dtype != "F8_E4M3") continue;
    const std::string& fp = files_[w.file]->path;
    const std::string sname = name + "_scale_inv";
    auto it = where_.find(sname);
    MT_CHECK(it != where_.end(), IoError, fp, ": FP8 tensor '", name, "' has no scale '", sname,
             "' (block-scaled e4m3 needs one)");
    MT_CHECK(e.shape.size() == 2, ShapeError, fp, ": FP8 tensor '", name, "' has shape ",
             Shape(e.shape), "; block scales need a 2-D weight");
    const SafetensorsEntry& se = files_[it->second.file]->header.entries[it->second.entry];
    const std::vector<int64_t> want = {(e.shape[0] + fp8_.rows - 1) / fp8_.rows,
                                       (e.shape[1] + fp8_.cols - 1) / fp8_.cols};
    MT_CHECK(se.shape == want, ShapeError, files_[it->second.file]->path, ": scale '", sname,
             "' has shape ", Shape(se.shape), "; ", Shape(e.shape), " in ", fp8_.rows, "x",
             fp8_.cols, " blocks needs ", Shape(want));
    MT_CHECK(se.dtype == "F32" || se.dtype == "BF16", IoError, files_[it->second.file]->path,
             ": scale '", sname, "' is ", se.dtype, " (F32 or BF16 expected)");
    w.scale = sname;
  }
  for (auto& [name, w] : where_)
    if (!w.scale.empty()) scales_[w.scale] = where_.at(w.scale);
  for (const auto& [sname, w] : scales_) where_.erase(sname);
}

std::vector<std::string> SafetensorsModel::names() const {
  std::vector<std::string> out;
  for (const auto& [n, w] : where_) out.push_back(n);
  return out;
}

const SafetensorsEntry& SafetensorsModel::entry(const std::string& name) const {
  auto it = where_.find(name);
  MT_CHECK(it != where_.end(), IoError, "no tensor '", name, "' in the model files");
  return files_[it->second.file]->header.entries[it->second.entry];
}

const std::string& SafetensorsModel::file_of(const std::string& name) const {
  auto it = where_.find(name);
  MT_CHECK(it != where_.end(), IoError, "no tensor '", name, "' in the model files");
  return files_[it->second.file]->path;
}

DType SafetensorsModel::loaded_dtype(const std::string& name) const {
  return loaded_dtype_of(entry(name).dtype);
}

Tensor SafetensorsModel::read(const std::string& name) const {
  Tensor t = Tensor::empty(Shape(entry(name).shape), loaded_dtype(name));
  read_into(name, t);
  return t;
}

void SafetensorsModel::read_into(const std::string& name, Tensor& dst) const {
  auto it = where_.find(name);
  MT_CHECK(it != where_.end(), IoError, "no tensor '", name, "' in the model files");
  const File& f = *files_[it->second.file];
  const SafetensorsEntry& e = f.header.entries[it->second.entry];
  MT_CHECK(dst.dtype() == loaded_dtype(name) && dst.numel() == Shape(e.shape).numel() &&
               dst.is_contiguous() && dst.device() == Device::CPU,
           ShapeError, f.path, ": tensor '", name, "' (", Shape(e.shape), " ", e.dtype,
           ") cannot be read into a ", dst.shape(), " ", dtype_name(dst.dtype()), " tensor");
  if (it->second.scale.empty()) {
    check_decodable(e, f.path);
    decode(e, f.data(e), f.path, dst.raw());
    f.release(e);
    return;
  }
  const Where& sw = scales_.at(it->second.scale);
  const File& sf = *files_[sw.file];
  const SafetensorsEntry& se = sf.header.entries[sw.entry];
  const Tensor scale = convert(se, sf.data(se), sf.path);
  const int64_t R = e.shape[0], C = e.shape[1], SC = se.shape[1];
  const auto* src = reinterpret_cast<const uint8_t*>(f.data(e));
  float lut[256];
  for (int b = 0; b < 256; ++b) lut[b] = fp8_e4m3_to_f32(static_cast<uint8_t>(b));
  float* d = dst.f32();
  const float* s = scale.f32();
  for (int64_t i = 0; i < R; ++i) {
    const float* srow = s + (i / fp8_.rows) * SC;
    for (int64_t j = 0; j < C; ++j) d[i * C + j] = lut[src[i * C + j]] * srow[j / fp8_.cols];
  }
  f.release(e);
}

void SafetensorsModel::read_range(const std::string& name, int64_t begin, int64_t count,
                                  float* out) const {
  auto it = where_.find(name);
  MT_CHECK(it != where_.end(), IoError, "no tensor '", name, "' in the model files");
  const File& f = *files_[it->second.file];
  const SafetensorsEntry& e = f.header.entries[it->second.entry];
  const int64_t n = Shape(e.shape).numel();
  MT_CHECK(loaded_dtype(name) == DType::F32, IoError, f.path, ": tensor '", name, "' is ", e.dtype,
           "; only floating tensors are read in slices");
  MT_CHECK(begin >= 0 && count >= 0 && begin + count <= n, ShapeError, f.path, ": tensor '", name,
           "' (", Shape(e.shape), "): elements [", begin, ", ", begin + count, ") out of range");
  if (count == 0) return;
  if (it->second.scale.empty()) {
    check_decodable(e, f.path);
    const size_t es = format_dtype_size(e.dtype);
    const char* src = f.data(e) + static_cast<size_t>(begin) * es;
    decode_n(e, src, count, f.path, out);
    f.release(src, static_cast<uint64_t>(count) * es);
    return;
  }
  // FP8: only the scale rows of the rows the slice touches are decoded.
  const Where& sw = scales_.at(it->second.scale);
  const File& sf = *files_[sw.file];
  const SafetensorsEntry& se = sf.header.entries[sw.entry];
  const int64_t C = e.shape[1], SC = se.shape[1];
  const int64_t br0 = begin / C / fp8_.rows, br1 = (begin + count - 1) / C / fp8_.rows + 1;
  std::vector<float> scale(static_cast<size_t>((br1 - br0) * SC));
  const size_t ses = format_dtype_size(se.dtype);
  decode_n(se, sf.data(se) + static_cast<size_t>(br0 * SC) * ses, (br1 - br0) * SC, sf.path,
           scale.data());
  float lut[256];
  for (int b = 0; b < 256; ++b) lut[b] = fp8_e4m3_to_f32(static_cast<uint8_t>(b));
  const auto* src = reinterpret_cast<const uint8_t*>(f.data(e)) + begin;
  for (int64_t k = 0; k < count; ++k) {
    const int64_t i = (begin + k) / C, j = (begin + k) % C;
    out[k] = lut[src[k]] * scale[static_cast<size_t>((i / fp8_.rows - br0) * SC + j / fp8_.cols)];
  }
  f.release(f.data(e) + begin, static_cast<uint64_t>(count));
}

SafetensorsData read_safetensors_model(const std::string& path) {
  SafetensorsModel m(path);
  SafetensorsData out;
  for (const std::string& name : m.names()) out.tensors.emplace(name, m.read(name));
  out.metadata = m.metadata();
  return out;
}

void write_safetensors(const std::string& path, const TensorMap& tensors,
                       const MetadataMap& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata_json(metadata);
  uint64_t offset = 0;
  std::vector<std::pair<const void*, size_t>> chunks;
  std::vector<Tensor> host;  // host copies of device tensors (a GPU model's checkpoint)
  for (const auto& [name, dev_t] : tensors) {
    const Tensor& t =
        dev_t.device() == Device::CPU ? dev_t : host.emplace_back(dev_t.to(Device::CPU));
    check_writable(name, t, path);
    json e;
    e["dtype"] = format_name(t.dtype());
    e["shape"] = t.shape().dims();
    e["data_offsets"] = {offset, offset + t.bytes()};
    header[name] = e;
    offset += t.bytes();
    if (t.bytes()) chunks.emplace_back(t.raw(), t.bytes());
  }
  const std::string head = header_bytes(header);
  chunks.insert(chunks.begin(), {head.data(), head.size()});
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
  json weight_map = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = shard_file_name(i, shards.size());
    write_safetensors((d / name).string(), shards[i], metadata);
    for (const auto& [t, _] : shards[i]) weight_map[t] = name;
  }
  write_index(d, weight_map, total);
}

void write_safetensors_streamed(const std::string& dir, size_t units, const TensorProducer& produce,
                                const MetadataMap& metadata, uint64_t max_shard_bytes,
                                const std::function<void(uint64_t, uint64_t)>& progress) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  MT_CHECK(!ec, IoError, dir, ": cannot create directory: ", ec.message());
  // Pass 1: names, dtypes, shapes and the shard of every tensor, one unit in memory at a time.
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t bytes;
    size_t unit, shard;
  };
  std::vector<Entry> entries;
  std::set<std::string> seen;
  uint64_t cur = 0, total = 0;
  size_t shard = 0;
  for (size_t u = 0; u < units; ++u) {
    for (const auto& [name, t] : produce(u)) {
      check_writable(name, t, dir);
      MT_CHECK(seen.insert(name).second, IoError, dir, ": tensor '", name, "' produced twice");
      if (cur > 0 && cur + t.bytes() > max_shard_bytes) {
        ++shard;
        cur = 0;
      }
      entries.push_back({name, t.dtype(), t.shape(), t.bytes(), u, shard});
      cur += t.bytes();
      total += t.bytes();
    }
  }
  const size_t n_shards = shard + 1;
  const fs::path d(dir);
  auto file_of = [&](size_t s) {
    return n_shards == 1 ? std::string("model.safetensors") : shard_file_name(s, n_shards);
  };
  // Pass 2: each shard's header (data in production order: offsets, not names, order the
  // data section), then its tensors produced again and written one unit at a time.
  size_t next = 0, held_unit = units;
  std::vector<std::pair<std::string, Tensor>> held;
  uint64_t done = 0;
  json weight_map = json::object();
  for (size_t s = 0; s < n_shards; ++s) {
    json header = json::object();
    if (!metadata.empty()) header["__metadata__"] = metadata_json(metadata);
    uint64_t offset = 0;
    size_t end = next;
    for (; end < entries.size() && entries[end].shard == s; ++end) {
      const Entry& e = entries[end];
      header[e.name] = {{"dtype", format_name(e.dtype)},
                        {"shape", e.shape.dims()},
                        {"data_offsets", {offset, offset + e.bytes}}};
      offset += e.bytes;
      weight_map[e.name] = file_of(s);
    }
    AtomicFile f((d / file_of(s)).string());
    const std::string head = header_bytes(header);
    f.write(head.data(), head.size());
    for (; next < end; ++next) {
      const Entry& e = entries[next];
      if (held_unit != e.unit) {
        held.clear();  // the previous unit's tensors go before the next is made
        held = produce(e.unit);
        held_unit = e.unit;
      }
      auto it = std::find_if(held.begin(), held.end(),
                             [&](const auto& kv) { return kv.first == e.name; });
      MT_CHECK(it != held.end() && it->second.shape() == e.shape && it->second.dtype() == e.dtype,
               InternalError, dir, ": tensor '", e.name, "' changed between the two passes");
      f.write(it->second.raw(), e.bytes);
      it->second = Tensor();
      done += e.bytes;
      if (progress) progress(done, total);
    }
    f.commit();
  }
  if (n_shards == 1) {
    fs::remove(d / "model.safetensors.index.json", ec);
  } else {
    write_index(d, weight_map, total);
  }
}

}  // namespace mt
