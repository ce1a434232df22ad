#include "core/context.h"

#include <omp.h>

namespace mt {

Context::Context(const ContextOptions& opt)
    : device_(opt.device),
      threads_(opt.threads > 0 ? opt.threads : omp_get_max_threads()),
      rng_(opt.seed),
      workspace_(opt.workspace_bytes, opt.device, "workspace") {
  MT_CHECK(opt.threads >= 0, ValueError, "threads must be >= 0, got ", opt.threads);
}

}  // namespace mt
