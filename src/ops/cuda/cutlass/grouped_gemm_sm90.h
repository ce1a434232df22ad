// The grouped expert GEMM on Hopper's tensor cores: CUTLASS's pointer-array grouped kernel
// (TMA loads, wgmma, warp-specialised schedules), one launch for every non-empty group.
// grouped_matmul.cu calls it for the bf16 forms (the weight gradient with an f32 dW) and keeps
// cuBLAS's grouped GEMM for the rest (f32, rows TMA cannot address).
//
// Several kernel configurations (tile, schedule, cluster) are compiled, one per file
// grouped_gemm_sm90_<name>.cu, and chosen per call (ops/grouped_matmul.h: GroupedGemmConfig,
// the environment's MOETRAIN_GROUPED_GEMM by default), so one device run compares them: the forward
// forms' kernels (grouped_gemm_sm90_<name>.cu, each compiling the forward and the input-gradient
// form; the two forms may take different ones) and the weight gradient's
// (grouped_gemm_sm90_wgrad_<name>.cu); the scheduler's swizzle and raster order apply to all.
//
// The .cu files include no engine header and talk to the engine through plain values (the caller
// owns the context, the scratch and the errors): their minute-long CUTLASS compiles are not redone
// when an engine header changes, and CUTLASS's include path stays on these files.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace mt::ops::cuda {

// The non-empty groups of one grouped call, passed by value to the kernels that lay out the
// per-group addresses (CUDA 12.1+ takes kernel parameters up to 32 KB; this is 12 KB), so the
// host's group offsets never travel by a copy.
constexpr int kMaxGroups = 1024;
struct GroupRows {
  int32_t group[kMaxGroups];  // group index
  int32_t row0[kMaxGroups];   // its first row
  int32_t rows[kMaxGroups];   // its row count (> 0)
};

// Per group g, with A and B row views (leading dimensions lda, ldb) and W [G, ...] contiguous:
//   Forward:    C_g [m_g, n] = alpha A_g [m_g, k] W_g^T + beta C_g,  W_g [n, k]   (X W^T)
//   InputGrad:  C_g [m_g, n] = alpha A_g [m_g, k] W_g   + beta C_g,  W_g [k, n]   (dY W)
//   WeightGrad: C_g [m, n]   = alpha A_g^T B_g          + beta C_g,  A_g [m_g, m], B_g [m_g, n],
//               C = dW [G, m, n] f32 (dW = dY^T X)
// A, B, W and the forward forms' C are bf16; f32 accumulation.
enum class Sm90Form { Forward, InputGrad, WeightGrad };
struct Sm90Grouped {
  Sm90Form form = Sm90Form::Forward;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;  // W, or the weight gradient's B rows
  int64_t ldb = 0;          // the weight gradient's B only
  void* c = nullptr;
  int64_t ldc = 0;  // the forward forms' only (dW_g is contiguous)
  // The forward forms' W: its row pitch and group stride in elements; 0 = contiguous [G, n, k]
  // (Forward) or [G, k, n] (InputGrad). A block of a padded buffer sets both.
  int64_t ldw = 0, w_group = 0;
  int64_t m = 0, n = 0, k = 0;  // m: the weight gradient's only; k: the forward forms' only
  float alpha = 1.f, beta = 0.f;
};

// The kernel configurations, in the order of ops/grouped_matmul.h's kGroupedGemmKernels and
// kGroupedWgradKernels.
constexpr int kSm90Kernels = 5;
constexpr int kSm90WgradKernels = 6;
// Which kernels (the forward form's, the input gradient's, -1: the forward's, and the weight
// gradient's), and the tile scheduler's swizzle (1, 2, 4 or 8) and raster order.
struct Sm90Config {
  int kernel = 0;
  int dx_kernel = -1;
  int wgrad = 0;
  int swizzle = 1;
  bool along_n = false;
};

// Where and on what it runs: the stream, the device and its multiprocessor count.
struct Sm90Launch {
  cudaStream_t stream = nullptr;
  int device = 0, multiprocessors = 0;
  Sm90Config config;
};

// Whether sm90_grouped_gemm takes the call: TMA needs 16-byte aligned bases, row pitches and
// contiguous extents.
bool sm90_grouped_fits(const Sm90Grouped& g, int count);

// Device scratch bytes one call needs (the per-group arrays and CUTLASS's own workspace).
size_t sm90_grouped_scratch(const Sm90Grouped& g, const GroupRows& rows, int count,
                            const Sm90Launch& at);

// Runs the call with `scratch` (sm90_grouped_scratch bytes, 256-byte aligned). Returns nullptr, or
// what failed (CUTLASS's status or the launch's error) for the caller to raise.
const char* sm90_grouped_gemm(const Sm90Grouped& g, const GroupRows& rows, int count,
                              const Sm90Launch& at, void* scratch);

// The K-concatenation forward's gate/up GEMM (ops/grouped_ffn.h) with xa = X A^T formed in its
// mainloop instead of read from X's padding (lora_xa_mainloop.cuh): the Forward form with A = X's
// padded rows [m_g, in + r], k = in + r, W_g = the gate/up block [2F, in + r] of the padded buffer
// (its columns in .. in + r - 1 hold s B); xa is written into A's columns in .. in + r - 1. Rank 16
// and `in` a multiple of 64 only (sm90_lora_xa_fits). `side` holds A_gu laid out by
// sm90_lora_xa_side_pack (sm90_lora_xa_side_elems elements; expert e's at e side_group).
bool sm90_lora_xa_fits(const Sm90Grouped& g, int64_t in, int64_t rank, int count);
int64_t sm90_lora_xa_side_elems(int64_t experts, int64_t k);
// A_gu's rows (expert e's row j at a + e a_group + j lda, `in` columns) into `side`; transposed:
// the rows of a column block (expert e's row j at a + e a_group + j, column c at + c lda), as
// sm90_lora_dr_gemm's s B^T.
const char* sm90_lora_xa_side_pack(const void* a, int64_t lda, int64_t a_group, int64_t experts,
                                   int64_t in, int64_t k, bool transposed, void* side,
                                   cudaStream_t stream);
// With `h` (with_h for the scratch) the interleaved gate/up layout's form: the epilogue also writes
// h = silu(g) u [m_g, n / 2] at row pitch ldh (grouped_gemm_sm90_swiglu.h, UpInterleaved; n a
// multiple of 32).
size_t sm90_lora_xa_scratch(const Sm90Grouped& g, const GroupRows& rows, int count,
                            const Sm90Launch& at, bool with_h = false);
const char* sm90_lora_xa_gemm(const Sm90Grouped& g, const void* side, int64_t side_group,
                              const GroupRows& rows, int count, const Sm90Launch& at, void* scratch,
                              void* h = nullptr, int64_t ldh = 0);

// The K-concatenation backward's down dX GEMM with dr = dY (s B_down) formed in its mainloop and
// dB_down += s dY^T ha from the dY tiles it holds (lora_xa_mainloop.cuh, kDb): the InputGrad form
// with A = dY's padded rows [m_g, out + r], k = out + r, W_g = the down buffer's [out + r, F] block
// read N-major (its rows out .. out + r - 1 hold A_down); dr is written into A's columns out ..
// out + r - 1. `side` holds (s B_down)^T laid out by sm90_lora_xa_side_pack (transposed, from the
// buffer's columns F ..). Rank 16 and `out` a multiple of 128 (sm90_lora_dr_fits).
struct Sm90LoraDb {
  const void* r = nullptr;  // ha's rows [rows, r] bf16, row pitch ldr
  int64_t ldr = 0;
  float* db = nullptr;  // dB [E, out, r] f32, expert e's at db + e db_group (added into)
  int64_t db_group = 0;
  float scale = 1.f;
};
bool sm90_lora_dr_fits(const Sm90Grouped& g, int64_t out, int64_t rank, int count);
// Whether the fused GEMM is the faster path for these groups: at least half as many row tiles per
// group as n-blocks (the measurements in grouped_gemm_sm90_lora_xa.cu).
bool sm90_lora_dr_pays(const Sm90Grouped& g, const GroupRows& rows, int count);
size_t sm90_lora_dr_scratch(const Sm90Grouped& g, const GroupRows& rows, int count,
                            const Sm90Launch& at);
const char* sm90_lora_dr_gemm(const Sm90Grouped& g, const void* side, int64_t side_group,
                              const Sm90LoraDb& db, const GroupRows& rows, int count,
                              const Sm90Launch& at, void* scratch);

// One compiled configuration's entry points (grouped_gemm_sm90_<name>.cu), for the dispatcher.
struct Sm90Kernel {
  size_t (*scratch)(const Sm90Grouped&, const GroupRows&, int, const Sm90Launch&);
  const char* (*run)(const Sm90Grouped&, const GroupRows&, int, const Sm90Launch&, void*);
};
Sm90Kernel sm90_coop128x256c2x1();  // the forward forms; the default
Sm90Kernel sm90_coop128x256c1x2();
Sm90Kernel sm90_coop256x128c2x1();
Sm90Kernel sm90_pingpong128x128c2x1();
Sm90Kernel sm90_pingpong64x256c2x1();
// The weight gradient's.
Sm90Kernel sm90_wgrad();  // cooperative 128 x 256 x 64, cluster 2 x 1; the default
Sm90Kernel sm90_wgrad_pingpong128x128c2x1();
Sm90Kernel sm90_wgrad_pingpong128x128c1x1();
Sm90Kernel sm90_wgrad_coop256x128c2x1();
Sm90Kernel sm90_wgrad_coop128x256c1x2();
Sm90Kernel sm90_wgrad_coop128x256c2x1e16();  // the default's with a 128 x 16 epilogue sub-tile

}  // namespace mt::ops::cuda
