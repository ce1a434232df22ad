// Attention over index lists in the absorbed MQA form of MLA (DeepSeek-V3.2's sparse prefill):
// every query head reads ONE shared entry per key, the latent c_s (kv_lora_rank wide) followed by
// the rotary key k_pe, and the values are the latent itself. With W_UK absorbed into the queries
// (q_h = [q_nope,h W_UK,h ; q_pe,h]) the scores equal the per-head MLA form's, and o_h here is the
// latent-space output that W_UV,h maps back to v_head_dim. One gather per (query, key) serves all
// heads, which are the rows of the tensor-core products.
//
// Layout: q [T, H, Dqk], kv [T, Dqk] (values: its first Dv columns), indices i32 [T, kmax] with
// absolute positions in the packed batch, a slot outside [0, T) (e.g. -1, the top-k's padding)
// unused, duplicates counted twice: the contract of ops/attention.h with one key head whose
// values are a prefix of its keys. Varlen and causality live in the lists.
#pragma once

#include "core/context.h"
#include "core/tensor.h"
#include "ops/backends.h"

namespace mt::ops {

// Which generation of the tensor-core kernels the CUDA bodies run (SparseMqaParams::kernels, per
// call). Chained: the first kernels. Split (session 13): independent MMA accumulator chains, one
// barrier less per key tile in forward, and a backward with one key buffer whose next gather
// overlaps the key-gradient products, which lets two 32-head blocks share an SM; it agrees with
// Chained up to fp32 summation order. Wgmma (session 14): the forward on Hopper's wgmma
// (ops/cuda/cutlass/sparse_mqa_wgmma.cu, the keys as the MMA's rows) for up to 32 heads (more:
// Split's forward) with two key tiles a block, one block per SM; Wgmma2 the same kernel with one
// key tile, two blocks per SM (the default since session 15: every CudaSparseMqa case passed on
// it, racecheck clean, and it runs the forward at 8K in 2.97 ms against Split's 6.77). Their
// backward and prob sum are Split's. Wgmma3 (session 15): Wgmma2's forward, and the backward and
// prob sum on wgmma too (up to 32 heads; more: Split's). The others are kept so that `moetrain
// bench dsa` times them in one run and the device tests check each.
enum class SparseMqaKernels { Chained, Split, Wgmma, Wgmma2, Wgmma3 };
const char* sparse_mqa_kernels_name(SparseMqaKernels k);

struct SparseMqaParams {
  int64_t tokens = 0, heads = 0;
  int64_t qk_dim = 0;  // latent + rope: 576 in DeepSeek-V3.2
  int64_t v_dim = 0;   // latent: 512; at most qk_dim
  int64_t kmax = 0;    // slots per row of `indices`
  float scale = 0;     // softmax scale on q.k (the per-head form's, not 1/sqrt(qk_dim))
  SparseMqaKernels kernels = SparseMqaKernels::Wgmma2;  // the CUDA bodies' generation (above)
};

// o [T, H, Dv] and lse [T, H] (natural log; -inf, with o = 0, for a row without valid slots)
// are written.
using SparseMqaForward = void(Context& ctx, const SparseMqaParams& p, const Tensor& q,
                              const Tensor& kv, const Tensor& indices, Tensor& o, Tensor& lse);
SparseMqaForward sparse_mqa_forward;

// dq [T, H, Dqk] and dkv [T, Dqk] are written: dkv sums, over every (query, head, slot) that
// lists a key, dS q (all columns) plus P dout (the first Dv); keys nobody lists get 0. Needs the
// forward's o and lse. When `prob_sum` is defined (f32 [T, kmax]) it is written with what
// sparse_mqa_prob_sum writes: the backward recomputes every P from the lse anyway, so the DSA
// layer's KL target costs a head sum there instead of a pass of its own (on the GPU the tensor-
// core kernel sums its block's rows per tile; the composite runs sparse_mqa_prob_sum after).
using SparseMqaBackward = void(Context& ctx, const SparseMqaParams& p, const Tensor& q,
                               const Tensor& kv, const Tensor& indices, const Tensor& o,
                               const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dkv,
                               Tensor& prob_sum);
SparseMqaBackward sparse_mqa_backward;

// out [T, kmax] = the attention probabilities of each slot summed over the heads (0 for unused
// slots), from the forward's lse: the DSA indexer's KL target before L1 normalisation. Written.
using SparseMqaProbSum = void(Context& ctx, const SparseMqaParams& p, const Tensor& q,
                              const Tensor& kv, const Tensor& indices, const Tensor& lse,
                              Tensor& out);
SparseMqaProbSum sparse_mqa_prob_sum;

// Whether the tensor-core kernels (ops/cuda/sparse_mqa_attention.cu) take these shapes in bf16:
// DeepSeek's 576 / 512 widths, any head count (blocks of up to 64 heads). Read by the CUDA
// bodies and the op table, so both choose alike; other shapes, f32, and the backward of a
// deterministic context run the per-head composite (attention_forward / attention_backward with
// one key head: the direct kernels, whose key gradients have one writer each).
bool sparse_mqa_fits(int64_t heads, int64_t qk_dim, int64_t v_dim);

// The composite both backends fall back on: the values copied out of kv, attention_* with one
// key head, and the value gradient added into dkv's first Dv columns. Its parts dispatch.
SparseMqaForward sparse_mqa_composite_forward;
SparseMqaBackward sparse_mqa_composite_backward;
SparseMqaProbSum sparse_mqa_composite_prob_sum;

MT_OP_BACKENDS(SparseMqaForward sparse_mqa_forward; SparseMqaBackward sparse_mqa_backward;
               SparseMqaProbSum sparse_mqa_prob_sum;)

}  // namespace mt::ops
