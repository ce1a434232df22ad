// Small file helpers shared by checkpoints (one process and sharded): whole-file reads, durable
// atomic writes (a temporary name, fsync, rename, fsync of the directory, so a reader never sees
// half a file and a crash never loses a file that was reported written), directory installs that
// never leave a name missing, and checksums. Failures are IoErrors naming the path and the
// system's reason ("No space left on device", "File too large").
#pragma once

#include <filesystem>
#include <string>

namespace mt {

// The file's bytes; IoError naming the path when it cannot be read.
std::string read_file(const std::filesystem::path& p);
// Writes `text` to p.tmp, fsyncs it, renames it over p and fsyncs p's directory.
void write_file_atomic(const std::filesystem::path& p, const std::string& text);
// fsync of a file or a directory (the entries of a directory reach the disk only through it).
void fsync_path(const std::filesystem::path& p);
// Puts the complete directory `from` at `to`, which never goes missing on the way: a plain
// rename when `to` does not exist, else an atomic exchange of the two (renameat2
// RENAME_EXCHANGE), after which the displaced directory sits at `from`. Syncs the parent.
// Returns whether a directory was displaced (the caller deletes it once nothing names it).
bool install_dir(const std::filesystem::path& from, const std::filesystem::path& to);
// FNV-1a 64 of the file's bytes, in hex (the manifests' "fnv1a64").
std::string file_checksum(const std::filesystem::path& p);

}  // namespace mt
