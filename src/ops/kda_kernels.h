// Which CUDA kernels run the chunked KDA core (ops/kda.h): plain C++ without the op's tensors, so
// that the kernels' argument block (ops/cuda/kda_chunk_args.cuh) carries the choice too.
#pragma once

#include <string>

namespace mt::ops {

// Which CUDA kernels run the chunked form: the members of each kernel pair agree up to fp32
// summation order (bit for bit where ops/kda_prep_path.h says so, which also says what each choice
// selects); the defaults are the fastest measured, the others kept so that the device tests
// compare each pair and `moetrain bench kda` times both in one run. Part of the params, so that
// every caller (a KDA layer through KdaConfig::kernels and the job's `kernels.kda`, a test, a
// benchmark) chooses for its own calls and nothing is process-wide. The CPU reads none.
struct KdaKernels {
  // Off: no params fit the chunked kernels, so the direct kernels (ops/cuda/kda.cu) run every KDA
  // core: `moetrain bench step --kda-kernels direct` measures a step as it ran before the chunked
  // kernels (issue 12's KDA share of the step, before and after).
  bool chunk_kernels = true;
  bool tensor_core_prep = true;
  bool bf16_prepared = true;
  bool bf16_states = true;
  bool keep_prepared = false;
  bool fused_delta = true;
  bool fused_pre = true;
  bool prep_v2 = true;
  bool forward_state_v2 = true;
  bool forward_overlap = true;
  bool forward_overlap_waves = false;
  bool forward_longest_first = true;
  bool backward_state_v2 = true;
  bool grads_v2 = true;
  bool products_v2 = true;
  bool products_prefetch = true;
  bool operator==(const KdaKernels&) const = default;
};

// "default", or the choices that differ from it as `name=on|off` joined by ':' (names as the
// fields above), e.g. "grads_v2=off:forward_overlap_waves=on"; the job key `kernels.kda` and
// `moetrain tune` take this form. Parsing refuses an unknown name or value with the part it
// could not read; kda_kernels_name(parse_kda_kernels(s)) gives s back in the fields' order.
KdaKernels parse_kda_kernels(const std::string& s);
std::string kda_kernels_name(const KdaKernels& k);

}  // namespace mt::ops
