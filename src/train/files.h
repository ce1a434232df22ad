// Small file helpers shared by checkpoints (one process and sharded): whole-file reads, atomic
// writes (a temporary name, then rename, so a reader never sees half a file) and checksums.
#pragma once

#include <filesystem>
#include <string>

namespace mt {

// The file's bytes; IoError naming the path when it cannot be read.
std::string read_file(const std::filesystem::path& p);
// Writes `text` to p.tmp, then renames it over p; IoError naming the path on failure.
void write_file_atomic(const std::filesystem::path& p, const std::string& text);
// FNV-1a 64 of the file's bytes, in hex (the manifests' "fnv1a64").
std::string file_checksum(const std::filesystem::path& p);

}  // namespace mt
