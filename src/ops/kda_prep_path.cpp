#include "ops/kda_prep_path.h"

namespace mt::ops {

namespace {
bool tensor_core_prep = true;
bool bf16_prepared = true;
bool forward_state_v2 = true;
bool backward_state_v2 = true;
bool grads_v2 = true;
bool products_v2 = true;
bool products_prefetch = true;
bool prep_v2 = true;
bool forward_overlap = true;
bool forward_overlap_waves = false;
bool forward_longest_first = true;
bool bf16_states = true;
bool keep_prepared = false;
bool fused_delta = true;
bool fused_pre = true;
}  // namespace

KdaPrepPath kda_bf16_prep_path(const KdaParams& p) {
  const auto dim_ok = [](int64_t d) { return d == 64 || d == 128; };
  return tensor_core_prep && p.chunked && p.chunk == 64 && dim_ok(p.head_k) && dim_ok(p.head_v)
             ? KdaPrepPath::TensorCoreBf16
             : KdaPrepPath::CudaCores;
}

KdaChunkLayout kda_chunk_layout(const KdaParams& p, DType dtype) {
  const bool half =
      bf16_prepared && dtype == DType::BF16 && kda_bf16_prep_path(p) == KdaPrepPath::TensorCoreBf16;
  // half keeps Delta dS^T in the outgoing-dS slot (K V floats), which needs V >= C.
  return {p.chunk, p.head_k, p.head_v, half && p.head_v >= p.chunk};
}

bool kda_bf16_states_fit(const KdaParams& p, DType dtype) {
  return kda_chunk_kernel_fits(p) && kda_chunk_layout(p, dtype).half;
}

DType kda_saved_dtype(Device device, const KdaParams& p, DType dtype) {
  return device == Device::CUDA && bf16_states && kda_bf16_states_fit(p, dtype) ? DType::BF16
                                                                                : DType::F32;
}

void kda_set_bf16_states(bool on) {
  bf16_states = on;
}

bool kda_bf16_states() {
  return bf16_states;
}

void kda_set_keep_prepared(bool on) {
  keep_prepared = on;
}

bool kda_keep_prepared() {
  return keep_prepared;
}

void kda_set_fused_delta(bool on) {
  fused_delta = on;
}

bool kda_fused_delta() {
  return fused_delta;
}

void kda_set_fused_pre(bool on) {
  fused_pre = on;
}

bool kda_fused_pre() {
  return fused_pre;
}

const char* kda_prep_path_name(KdaPrepPath path) {
  return path == KdaPrepPath::TensorCoreBf16 ? "tensor_core_bf16" : "cuda_cores";
}

void kda_set_tensor_core_prep(bool on) {
  tensor_core_prep = on;
}

bool kda_tensor_core_prep() {
  return tensor_core_prep;
}

void kda_set_bf16_prepared(bool on) {
  bf16_prepared = on;
}

bool kda_bf16_prepared() {
  return bf16_prepared;
}

void kda_set_forward_state_v2(bool on) {
  forward_state_v2 = on;
}

bool kda_forward_state_v2() {
  return forward_state_v2;
}

void kda_set_forward_overlap(bool on) {
  forward_overlap = on;
}

bool kda_forward_overlap() {
  return forward_overlap;
}

void kda_set_forward_overlap_waves(bool on) {
  forward_overlap_waves = on;
}

bool kda_forward_overlap_waves() {
  return forward_overlap_waves;
}

void kda_set_forward_longest_first(bool on) {
  forward_longest_first = on;
}

bool kda_forward_longest_first() {
  return forward_longest_first;
}

void kda_set_backward_state_v2(bool on) {
  backward_state_v2 = on;
}

bool kda_backward_state_v2() {
  return backward_state_v2;
}

void kda_set_grads_v2(bool on) {
  grads_v2 = on;
}

bool kda_grads_v2() {
  return grads_v2;
}

void kda_set_products_v2(bool on) {
  products_v2 = on;
}

bool kda_products_v2() {
  return products_v2;
}

void kda_set_products_prefetch(bool on) {
  products_prefetch = on;
}

bool kda_products_prefetch() {
  return products_prefetch;
}

void kda_set_prep_v2(bool on) {
  prep_v2 = on;
}

bool kda_prep_v2() {
  return prep_v2;
}

}  // namespace mt::ops
