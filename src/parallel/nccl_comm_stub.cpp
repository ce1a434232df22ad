// make_nccl_comm in a build without CUDA: callers (the trainer's GPU mesh) stay free of build
// conditionals, and asking for NCCL here says what is missing.
#include "parallel/nccl_comm.h"

#if !MOETRAIN_WITH_CUDA

namespace mt::par {

std::unique_ptr<Comm> make_nccl_comm(Comm& bootstrap, Context& ctx, const CommOptions& opt) {
  (void)ctx;
  (void)opt;
  MT_THROW(ConfigError, "an NCCL communicator on ", bootstrap.where(),
           ": this binary was built without CUDA (-DMOETRAIN_CUDA=ON)");
}

}  // namespace mt::par

#endif
