// moetrain command-line entry point. Library code throws typed errors; this is the only place
// that turns them into messages and exit codes.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "core/error.h"

namespace {

constexpr const char* kUsage =
    "moetrain " MOETRAIN_VERSION
    " - fine-tune hybrid KDA/DSA Mixture-of-Experts models\n"
    "\n"
    "usage: moetrain <command> [options]\n"
    "\n"
    "commands:\n"
    "  --help, -h       show this help\n"
    "  --version        print the version\n"
    "\n"
    "Planned commands (see docs/cli.md): demo, train, plan, forward, generate, export, bench.\n";

int run(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::fputs(kUsage, stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) {
    std::printf("moetrain %s\n", MOETRAIN_VERSION);
    return 0;
  }
  std::fprintf(stderr, "moetrain: unknown command '%s' (try --help)\n", argv[1]);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const mt::Error& e) {
    std::fprintf(stderr, "moetrain: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moetrain: internal error: %s\n", e.what());
    return 3;
  }
}
