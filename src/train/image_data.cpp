#include "train/image_data.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/json_integer.h"
#include "train/files.h"

namespace mt {

namespace fs = std::filesystem;

namespace {

// An integer of a document or of images.json: nlohmann's own cast of a float beyond T is
// undefined behaviour (model/json_integer.h), of a fraction a silent truncation, of an unsigned
// beyond int64 a wrap to a negative.
template <typename T>
T image_integer(const nlohmann::json& v, const std::string& where, const std::string& key) {
  MT_CHECK(v.is_number() && json_integer_fits<T>(v), IoError, where, ": '", key, "' = ", v.dump(),
           " is not an integer in range");
  return v.get<T>();
}

}  // namespace

std::vector<InterleavedDoc> read_interleaved(const std::string& file) {
  std::ifstream in(file);
  MT_CHECK(in.good(), IoError, "cannot open '", file, "'");
  const fs::path base = fs::path(file).parent_path();
  std::vector<InterleavedDoc> docs;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = cat(file, ":", n);
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    MT_CHECK(!j.is_discarded() && j.is_object(), IoError, where, ": not a JSON object");
    MT_CHECK(
        j.size() == 1 && j.contains("content") && j["content"].is_array() && !j["content"].empty(),
        IoError, where, ": expected {\"content\": [parts...]}");
    InterleavedDoc d{.parts = {}, .source = where};
    for (const auto& p : j["content"]) {
      MT_CHECK(p.is_object(), IoError, where, ": a content part is not an object");
      InterleavedPart part;
      if (p.contains("image") && p["image"].is_string()) {
        part.kind = InterleavedPart::Image;
        fs::path path = p["image"].get<std::string>();
        part.value = (path.is_absolute() ? path : base / path).string();
        if (p.contains("placeholders")) {
          MT_CHECK(p["placeholders"].is_number_integer(), IoError, where,
                   ": 'placeholders' must be an integer");
          part.placeholders = image_integer<int64_t>(p["placeholders"], where, "placeholders");
        }
        MT_CHECK(p.size() == (p.contains("placeholders") ? 2u : 1u), IoError, where,
                 ": an image part holds 'image' and optionally 'placeholders' only");
      } else if (p.size() == 1 && p.contains("text") && p["text"].is_string()) {
        part.value = p["text"].get<std::string>();
      } else if (p.size() == 1 && p.contains("prompt") && p["prompt"].is_string()) {
        part.kind = InterleavedPart::Prompt;
        part.value = p["prompt"].get<std::string>();
      } else {
        MT_THROW(IoError, where,
                 ": a content part must be {\"text\"}, {\"prompt\"} or {\"image\"}");
      }
      d.parts.push_back(std::move(part));
    }
    docs.push_back(std::move(d));
  }
  MT_CHECK(!docs.empty(), IoError, "'", file, "' holds no documents");
  return docs;
}

PackedData pack_interleaved(const std::vector<InterleavedDoc>& docs, const Tokenizer& tok,
                            int64_t seq_len, const ImageDataOptions& opt) {
  MT_CHECK(seq_len > 1, ValueError, "sequence length ", seq_len, " must be > 1");
  MT_CHECK(opt.image_token_id >= 0, ValueError, "image data needs an image token id");
  const int64_t merge = opt.processor.merge_size * opt.processor.merge_size;
  PackedData out{.seq_len = seq_len, .vocab = std::max(tok.vocab(), opt.image_token_id + 1)};
  auto images = std::make_shared<PackedImages>();
  images->patch_dim = 3 * opt.processor.patch_size * opt.processor.patch_size;
  for (const InterleavedDoc& d : docs) {
    std::vector<int32_t> ids;
    std::vector<bool> trained;  // per token: a target when it is the next token
    const int64_t seq = out.sequences();
    for (const InterleavedPart& p : d.parts) {
      if (p.kind != InterleavedPart::Image) {
        for (int32_t t : tok.encode(p.value)) {
          ids.push_back(t);
          trained.push_back(p.kind == InterleavedPart::Text);
        }
        continue;
      }
      const ImageU8 img = read_image(p.value, opt.limits);
      std::vector<float> pix;
      const ResizePlan plan = navit_resize(img.height, img.width, opt.processor);
      const ImageU8 resized = resize_bicubic(img, plan.height, plan.width);
      const ops::ImageGrid g = normalize_patchify(resized, plan, opt.processor, pix);
      const int64_t n = g.patches() / merge;
      MT_CHECK(p.placeholders < 0 || p.placeholders == n, ValueError, d.source, ": image '",
               p.value, "' states ", p.placeholders, " placeholders, its ", g.rows, "x", g.cols,
               " patch grid gives ", n);
      images->images.push_back(
          {.sequence = seq,
           .rows = g.rows,
           .cols = g.cols,
           .first_patch = static_cast<int64_t>(images->pixels.size()) / images->patch_dim});
      images->pixels.insert(images->pixels.end(), pix.begin(), pix.end());
      ids.insert(ids.end(), static_cast<size_t>(n), static_cast<int32_t>(opt.image_token_id));
      trained.insert(trained.end(), static_cast<size_t>(n), false);
    }
    const auto T = static_cast<int64_t>(ids.size());
    MT_CHECK(T <= seq_len, ValueError, d.source, ": ", T,
             " tokens (text + image placeholders) exceed the sequence length ", seq_len);
    for (int64_t t = 0; t < seq_len; ++t) {
      out.ids.push_back(t < T ? ids[static_cast<size_t>(t)] : 0);
      const bool target = t + 1 < T && trained[static_cast<size_t>(t + 1)];
      out.targets.push_back(target ? ids[static_cast<size_t>(t + 1)] : kIgnoreIndex);
    }
    // The document, then the padding as its own segment (attention never crosses them).
    out.segments.push_back(T < seq_len ? std::vector<int64_t>{T, seq_len - T}
                                       : std::vector<int64_t>{seq_len});
    ++out.documents;
  }
  out.images = images;
  return out;
}

void write_images(const PackedImages& images, const std::string& dir) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& e : images.images) list.push_back({e.sequence, e.rows, e.cols, e.first_patch});
  const size_t bytes = images.pixels.size() * sizeof(float);
  write_file_atomic(fs::path(dir) / "images.bin",
                    std::string(reinterpret_cast<const char*>(images.pixels.data()), bytes));
  const nlohmann::json j = {{"patch_dim", images.patch_dim},
                            {"bytes", bytes},
                            {"fnv1a64", cat(std::hex, fnv1a64(images.pixels.data(), bytes))},
                            {"images", list}};
  write_file_atomic(fs::path(dir) / "images.json", j.dump());
}

std::shared_ptr<const PackedImages> load_images(const std::string& dir) {
  const fs::path jp = fs::path(dir) / "images.json";
  if (!fs::exists(jp)) return nullptr;
  auto out = std::make_shared<PackedImages>();
  nlohmann::json j = nlohmann::json::parse(read_file(jp), nullptr, false);
  MT_CHECK(!j.is_discarded() && j.contains("images"), IoError, jp.string(), ": invalid");
  const std::string jn = jp.string();
  MT_CHECK(j.is_object() && j.contains("patch_dim") && j.contains("bytes") &&
               j.contains("fnv1a64") && j.at("images").is_array(),
           IoError, jn, ": needs patch_dim, bytes, fnv1a64 and a list of images");
  out->patch_dim = image_integer<int64_t>(j.at("patch_dim"), jn, "patch_dim");
  const nlohmann::json& list = j.at("images");
  for (size_t i = 0; i < list.size(); ++i) {
    const nlohmann::json& e = list[i];
    MT_CHECK(e.is_array() && e.size() == 4, IoError, jn, ": images[", i,
             "] is not [sequence, rows, cols, first_patch]");
    int64_t x[4];
    for (size_t k = 0; k < 4; ++k) x[k] = image_integer<int64_t>(e[k], jn, cat("images[", i, "]"));
    out->images.push_back({x[0], x[1], x[2], x[3]});
  }
  const std::string bytes = read_file(fs::path(dir) / "images.bin");
  MT_CHECK(bytes.size() == image_integer<size_t>(j.at("bytes"), jn, "bytes") &&
               cat(std::hex, fnv1a64(bytes.data(), bytes.size())) == j.at("fnv1a64"),
           IoError, dir, "/images.bin does not match its size or checksum");
  out->pixels.resize(bytes.size() / sizeof(float));
  std::memcpy(out->pixels.data(), bytes.data(), bytes.size());
  return out;
}

ImageBatch image_batch(const PackedImages& images, const std::vector<int64_t>& sequences) {
  ImageBatch b;
  std::vector<const PackedImages::Entry*> picked;
  int64_t patches = 0;
  for (int64_t s : sequences)
    for (const auto& e : images.images)
      if (e.sequence == s) {
        picked.push_back(&e);
        patches += e.rows * e.cols;
      }
  if (picked.empty()) return b;
  b.pixels = Tensor::empty({patches, images.patch_dim});
  float* at = b.pixels.f32();
  for (const auto* e : picked) {
    const int64_t n = e->rows * e->cols * images.patch_dim;
    std::copy_n(images.pixels.data() + e->first_patch * images.patch_dim, n, at);
    at += n;
    b.grids.push_back({e->rows, e->cols});
  }
  return b;
}

}  // namespace mt
