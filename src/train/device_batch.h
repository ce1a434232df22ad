// A batch moved to the device that runs the step. Token ids, targets and the packing tensors
// (cu_seqlens, positions) are copied into buffers this object keeps across steps, grown only when
// a batch is larger than any before, so that a GPU step after the first allocates nothing. The
// host copies of the offsets stay in SeqInfo for the host-side arithmetic (core/seq_info.h).
#pragma once

#include "core/tensor.h"
#include "train/dataset.h"

namespace mt {

class DeviceBatch {
 public:
  // `host` itself on the CPU; otherwise a batch whose tensors view this object's buffers on
  // `device`, valid until the next call.
  const Batch& stage(const Batch& host, Device device);

 private:
  Batch staged_;
  Tensor ids_, targets_, cu_, pos_;  // capacity buffers on the device
};

}  // namespace mt
