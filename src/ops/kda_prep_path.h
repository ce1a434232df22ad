// Which intra-chunk pass (prep) the CUDA chunked KDA kernels run: the bf16 tensor-core prep
// (ops/cuda/kda_fwd_tc.cu) or the CUDA-core prep of ops/cuda/kda_chunk_prep.cu. The backward's
// products follow the same choice: tensor cores (ops/cuda/kda_bwd_tc.cu) or
// kda_chunk_products.cu's products_kernel. Plain C++, so that the tests (which compare the two)
// and `moetrain bench kda` (which reports the one it timed) read it without CUDA headers.
#pragma once

#include "core/dtype.h"
#include "ops/kda.h"
#include "ops/kda_chunk_layout.h"

namespace mt::ops {

enum class KdaPrepPath { TensorCoreBf16, CudaCores };

// The prep for bf16 tensors with these params: the tensor-core one at chunk 64 with head_k and
// head_v 64 or 128 (where its tensors are 16-byte aligned, which the kernels check too; fp32
// tensors always take the CUDA-core prep), unless p.kernels.tensor_core_prep is off.
KdaPrepPath kda_bf16_prep_path(const KdaParams& p);
const char* kda_prep_path_name(KdaPrepPath path);

// The prepared block's layout (ops/kda_chunk_layout.h) for tensors of `dtype`, the one place that
// chooses it: bf16 storage of W, Qh, Kl, U, Kb (half) exactly where the bf16 tensor-core prep,
// state passes and products run (kda_bf16_prep_path above) unless p.kernels.bf16_prepared is off,
// fp32 everywhere else. Read by the kernels, kda_prepared_floats and the workspace count, so that
// they cannot disagree.
KdaChunkLayout kda_chunk_layout(const KdaParams& p, DType dtype);

// Whether the chunk states `saved` (ops/kda.h) may be bf16 for these params and tensors of
// `dtype`: exactly where the bf16 prepared layout runs (kda_chunk_layout above: the tensor-core
// prep, state passes and products), whose forward state pass rounds each chunk-start state to
// bf16 as it stores it and whose backward kernels (bwd_pre, the products) widen it exactly into
// their fp32 math, as fla keeps its chunk states h in bf16. f32 `saved` stays allowed everywhere;
// the CPU, fp32 tensors and the other layouts take f32 only. The one rule: the op entries check
// `saved` with it, the callers choose with kda_saved_dtype.
bool kda_bf16_states_fit(const KdaParams& p, DType dtype);
// The dtype of `saved` that callers allocate (the KDA layer, `moetrain bench kda`, the tests) on
// `device`: bf16 on the GPU where kda_bf16_states_fit holds and p.kernels.bf16_states is on (the
// default: half the bytes kept for backward), f32 otherwise.
DType kda_saved_dtype(Device device, const KdaParams& p, DType dtype);

// What each KdaKernels field (ops/kda.h) selects on the GPU. A `saved` or `prepared` tensor is
// allocated under the params its forward and backward run with (bf16_states, bf16_prepared and
// keep_prepared change its dtype or size).
//
// tensor_core_prep, off: every call takes the CUDA-core prep and products, so that a test can
// compare the two paths on the same inputs.
//
// bf16_prepared, off: the tensor-core path keeps the fp32 layout (the tensor-core kernels then
// read fp32 operands), so that a test or a benchmark can tell the bf16 storage's error and bytes
// apart from the rest.
//
// bf16_states, off: kda_saved_dtype gives f32 everywhere (the form before session 16), so that a
// test or a benchmark can tell the bf16 states' error and time apart.
//
// keep_prepared: whether the KDA layer keeps the prepared blocks from forward to backward in its
// `prepared` tensor (KdaLayer::keeps_prepared; the planner reads the same rule): off (the
// default), the training forward runs the evaluation prep (the prepared block without T, KK and
// Kb, which only backward reads) and the backward runs prep again, so that what forward keeps for
// backward is the chunk states alone (0.25 GiB at B2 T8192 H32 D128 in bf16, where the prepared
// blocks are 1.0 GiB); on, the form before session 16 (backward skips its prep). `moetrain bench
// kda` times both.
//
// fused_delta: where backward runs prep v2 (no `prepared` kept) on bf16 chunk states: on (the
// default), the prep's blocks end by forming Delta = U - W S0 of their chunk (the W and U they
// just wrote, from L2, and the chunk's bf16 states; bf16 MMAs, exact products) and bwd_pre runs
// its second job only (session 16 call 2: B2 T8192 fwd+bwd 6.71 -> 6.63 ms); off, bwd_pre's first
// job forms Delta (tf32 MMAs of the same exact products). They differ by fp32 summation order
// only.
//
// fused_pre: with fused_delta (and dout 16-byte aligned): on (the default), the prep's blocks
// also do bwd_pre's second job, E = Aqk^T dO and F = Qh^T dO (Aqk and Qh from L2; bwd_pre's tf32
// MMAs in its k order: the same bits), and bwd_pre does not run; off, bwd_pre runs that job.
//
// prep_v2: the tensor-core prep (ops/cuda/kda_fwd_tc.cu): on (the default), v2: each block
// prefetches into L2 the inputs of the block that starts about when it ends, stores W and U in
// whole sectors through shared memory, and skips the small-result guard of exponentials it proves
// are >= -80 (docs/gpu.md); off, v1. Bit-identical results.
//
// forward_state_v2: which forward state pass the bf16 prepared layout runs
// (ops/cuda/kda_state_tc_fwd.cu): on (the default), fwd_state_v2_kernel; off, fwd_state_tc_kernel,
// its predecessor. They differ by fp32 summation order only.
//
// forward_overlap: where the forward's state blocks (32 columns each) all fit beside one prep
// block per SM (one document of up to 32 heads at K = V = 128 on an H200's 132 SMs,
// fwd_state_v2_kernel): on (the default), the prep is launched first as a persistent grid that
// walks the (chunk, head) items (chunks longest document first, heads fastest), flagging each
// done, and the state pass right after it as its programmatic dependent launch; the state blocks
// wait for those flags instead of for the whole prep, so the prep of later chunks runs beside the
// sequential pass over earlier ones. Off: prep, then the state pass. The same results bit for bit
// at 32 columns per block.
//
// forward_overlap_waves: the same overlap where the state blocks do not fit beside the prep at
// once (several documents, packed batches): off (the default), prep, then the state pass there;
// on, the prep takes one block per SM and the state pass the other slot, in waves, the prep
// walking the documents longest first (the state pass's order), each document's chunks in turn.
// Needs forward_overlap. Bit for bit the same results.
//
// forward_longest_first: the forward state pass's block order (fwd_state_v2_kernel): on (the
// default), documents longest first, each document's heads and column blocks together; off, the
// grid's order (documents fastest). The same results bit for bit.
//
// backward_state_v2: the backward's sequential state pass: on (the default), bwd_state_v2_kernel;
// off, bwd_state_tc_kernel. They differ by fp32 summation order only.
//
// grads_v2: the backward's gradient kernel for bf16 at chunk 64 and head_k 128
// (ops/cuda/kda_chunk_grads*.cu): on (the default), grads_v2_kernel (every pair sum on tensor
// cores, the diagonal 16-row blocks too where the decay allows); off, grads_kernel's tensor-core
// form. They differ by fp32 summation order and tf32 operand rounding only.
//
// products_v2: the backward's tensor-core products (ops/cuda/kda_bwd_tc.cu): on (the default), the
// persistent products_v2_kernel that runs the three jobs of a (chunk, head) in one block; off,
// products_tc_kernel, one block per job. They differ by fp32 summation order only (gL).
//
// products_prefetch: products v2's L2 prefetch of the tiles two beyond its cp.async ring, on (the
// default) or off. Bit-identical.

}  // namespace mt::ops
