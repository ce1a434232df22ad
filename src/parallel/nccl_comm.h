// The engine's communicator over NCCL (CUDA builds only; src/parallel/cuda/nccl_comm.cpp): one
// process per GPU, its device chosen by the caller from local_rank (comm.h), the unique id made
// by rank 0 and broadcast over the bootstrap communicator (MPI, or the local comm at world 1).
//
// Streams: every collective runs on the communicator's own stream. It first waits for an event
// recorded on the context's compute stream (so it sees everything computed before the call) and
// records a completion event after it; Request::wait() makes the compute stream wait for that
// event (cudaStreamWaitEvent: the host does not block). Work on the compute stream issued after
// the call and before the wait overlaps with the collective.
//
// Memory: device pointers, and device tensors in the Tensor forms. Host pointers (the scalar
// helpers, the expert exchange's counts) are staged through a device buffer that grows only when
// a larger message comes; such a call blocks the host until its result is back (a bounded wait).
//
// Bounds: a watchdog thread polls every collective's completion event; one still pending after
// CommOptions::timeout aborts the communicator (ncclCommAbort, which also ends the kernels waiting
// on a silent peer), prints the rank, the collective and its sizes, and every later call on the
// communicator throws CommError with that message. Host waits (staged calls, barrier,
// initialisation, split, finalisation) poll with the same bound.
#pragma once

#include <memory>

#include "parallel/comm.h"

namespace mt {
class Context;
}

namespace mt::par {

// Collective over `bootstrap`: every rank of it becomes a rank of the NCCL communicator, in the
// same order. `ctx` is a CUDA context (its device and compute stream). Elements f32, bf16, f64,
// i32, i64; sums of bf16 are NCCL's.
std::unique_ptr<Comm> make_nccl_comm(Comm& bootstrap, Context& ctx, const CommOptions& opt = {});

}  // namespace mt::par
