#include "train/device_batch.h"

#include <algorithm>

namespace mt {

namespace {

// The first numel elements of `buffer` (grown on `device` when too small), filled from `host`.
Tensor stage_into(Tensor& buffer, const Tensor& host, Device device) {
  const int64_t n = host.numel();
  if (!buffer.defined() || buffer.device() != device || buffer.dtype() != host.dtype() ||
      buffer.numel() < n)
    buffer = Tensor::empty({std::max<int64_t>(n, 1)}, host.dtype(), device);
  Tensor view = buffer.rows(0, n).view(host.shape());
  view.copy_from(host);
  return view;
}

}  // namespace

const Batch& DeviceBatch::stage(const Batch& host, Device device) {
  if (device == Device::CPU) return host;
  staged_.ids = stage_into(ids_, host.ids, device);
  staged_.targets = stage_into(targets_, host.targets, device);
  staged_.target_tokens = host.target_tokens;
  SeqInfo& s = staged_.seq;
  s.tokens = host.seq.tokens;
  s.num_seqs = host.seq.num_seqs;
  s.cu_seqlens = stage_into(cu_, host.seq.cu_seqlens, device);
  s.positions = stage_into(pos_, host.seq.positions, device);
  s.cu_seqlens_host = host.seq.cu_seqlens_host;
  s.offsets.assign(host.seq.offsets.begin(), host.seq.offsets.end());
  return staged_;
}

}  // namespace mt
