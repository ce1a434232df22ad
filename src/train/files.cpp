#include "train/files.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "core/error.h"
#include "train/dataset.h"

namespace mt {

namespace fs = std::filesystem;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  MT_CHECK(in.good(), IoError, "cannot read '", p.string(), "'");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file_atomic(const fs::path& p, const std::string& text) {
  const fs::path tmp = p.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MT_CHECK(fd >= 0, IoError, "cannot create '", tmp.string(), "': ", std::strerror(errno));
  const char* d = text.data();
  size_t left = text.size();
  int err = 0;
  while (left > 0 && err == 0) {
    const ssize_t w = ::write(fd, d, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      err = w < 0 ? errno : ENOSPC;
      break;
    }
    d += w;
    left -= static_cast<size_t>(w);
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    MT_THROW(IoError, "cannot write '", tmp.string(), "': ", std::strerror(err));
  }
  if (::rename(tmp.c_str(), p.c_str()) != 0) {
    err = errno;
    ::unlink(tmp.c_str());
    MT_THROW(IoError, "cannot rename '", tmp.string(), "' to '", p.string(),
             "': ", std::strerror(err));
  }
  fsync_path(p.has_parent_path() ? p.parent_path() : fs::path("."));
}

void fsync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  MT_CHECK(fd >= 0, IoError, "cannot open '", p.string(), "' to sync it: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems refuse fsync on directories (EINVAL); their entries are then as durable as
  // the file system makes them, and nothing better is possible.
  MT_CHECK(rc == 0 || err == EINVAL, IoError, "cannot sync '", p.string(),
           "': ", std::strerror(err));
}

bool install_dir(const fs::path& from, const fs::path& to) {
  bool displaced = false;
  if (::rename(from.c_str(), to.c_str()) != 0) {
    int err = errno;
    // rename(2) over a non-empty directory fails; exchange then swaps the two atomically.
    if (err == ENOTEMPTY || err == EEXIST) {
      if (::syscall(SYS_renameat2, AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) ==
          0) {
        displaced = true;
        err = 0;
      } else {
        err = errno;
      }
    }
    MT_CHECK(err == 0, IoError, "cannot put '", from.string(), "' in place of '", to.string(),
             "': ", std::strerror(err));
  }
  fsync_path(to.has_parent_path() ? to.parent_path() : fs::path("."));
  return displaced;
}

std::string file_checksum(const fs::path& p) {
  // In 1 MiB blocks: checkpoints are model-sized, and verifying one must not hold it.
  std::ifstream in(p, std::ios::binary);
  MT_CHECK(in.good(), IoError, "cannot read '", p.string(), "'");
  std::vector<char> block(size_t{1} << 20);
  uint64_t h = fnv1a64(nullptr, 0);
  while (in) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    h = fnv1a64(block.data(), static_cast<size_t>(in.gcount()), h);
  }
  MT_CHECK(in.eof(), IoError, "cannot read '", p.string(), "'");
  return cat(std::hex, h);
}

}  // namespace mt
