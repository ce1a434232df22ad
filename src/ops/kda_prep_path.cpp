#include "ops/kda_prep_path.h"

namespace mt::ops {

KdaPrepPath kda_bf16_prep_path(const KdaParams& p) {
  const auto dim_ok = [](int64_t d) { return d == 64 || d == 128; };
  return p.kernels.tensor_core_prep && p.chunked && p.chunk == 64 && dim_ok(p.head_k) &&
                 dim_ok(p.head_v)
             ? KdaPrepPath::TensorCoreBf16
             : KdaPrepPath::CudaCores;
}

KdaChunkLayout kda_chunk_layout(const KdaParams& p, DType dtype) {
  const bool half = p.kernels.bf16_prepared && dtype == DType::BF16 &&
                    kda_bf16_prep_path(p) == KdaPrepPath::TensorCoreBf16;
  // half keeps Delta dS^T in the outgoing-dS slot (K V floats), which needs V >= C.
  return {p.chunk, p.head_k, p.head_v, half && p.head_v >= p.chunk};
}

bool kda_bf16_states_fit(const KdaParams& p, DType dtype) {
  return kda_chunk_kernel_fits(p) && kda_chunk_layout(p, dtype).half;
}

DType kda_saved_dtype(Device device, const KdaParams& p, DType dtype) {
  return device == Device::CUDA && p.kernels.bf16_states && kda_bf16_states_fit(p, dtype)
             ? DType::BF16
             : DType::F32;
}

const char* kda_prep_path_name(KdaPrepPath path) {
  return path == KdaPrepPath::TensorCoreBf16 ? "tensor_core_bf16" : "cuda_cores";
}

}  // namespace mt::ops
