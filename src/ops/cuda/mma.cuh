// Warp-level tensor-core pieces for Hopper and Ampere (sm_80+): the bf16 m16n8k16 MMA with fp32
// accumulators and the shared-memory loads that feed it. Fragment layouts (PTX ISA, "Matrix
// fragments for mma.m16n8k16"), with g = lane / 4 and c = lane % 4:
//   A (16 x 16, row-major): a0 = (row g, cols 2c, 2c+1), a1 = (row g+8, same cols),
//                           a2 = (row g, cols 2c+8, 2c+9), a3 = (row g+8, cols 2c+8, 2c+9);
//   B (16 x 8, k x n):      b0 = (k 2c, 2c+1; n g),  b1 = (k 2c+8, 2c+9; n g);
//   C (16 x 8, fp32):       c0, c1 = (row g; cols 2c, 2c+1),  c2, c3 = (row g+8; same cols).
// Two adjacent C tiles (n = 0..7 and 8..15) hold exactly an A fragment's elements, which is how
// attention feeds its probabilities into the next product without leaving registers.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace mt::ops::cuda::mma {

// Two floats as a bf16 pair; `lo` takes the lower 16 bits (the lower k or n index).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// c += a * b.
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// B fragment (k0 .. k0+15) x (n0 .. n0+7) from a tile stored k-major: tile[k][n] (e.g. values
// [key][dim] for p.v). ldmatrix .trans transposes 8x8 blocks on the way: lanes 0-7 address rows
// k0..k0+7, lanes 8-15 rows k0+8..k0+15 (16-byte aligned: n0 a multiple of 8, ld of 8).
__device__ __forceinline__ void load_b_kn(uint32_t b[2], const __nv_bfloat16* tile, int ld, int k0,
                                          int n0, int lane) {
  const __nv_bfloat16* p = tile + (k0 + (lane & 15)) * ld + n0;
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(b[0]), "=r"(b[1])
               : "r"(addr));
}

// A fragment (rows r0 .. r0+15, k0 .. k0+15 of a row-major tile) through ldmatrix .x4 (16-byte
// aligned rows): lanes 0-7
// address rows r0..r0+7 at k0, 8-15 rows r0+8.. at k0, 16-23 rows r0.. at k0+8, 24-31 rows r0+8..
// at k0+8, so the four 8x8 blocks land in a0..a3.
__device__ __forceinline__ void ldsm_a(uint32_t a[4], const __nv_bfloat16* tile, int ld, int r0,
                                       int k0, int lane) {
  const __nv_bfloat16* p = tile + (r0 + (lane & 15)) * ld + k0 + (lane >> 4) * 8;
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(addr));
}

// Two B fragments through one ldmatrix .x4 (.trans with Trans) from the row this lane addresses
// (p, in shared memory): b0 = the first two 8x8 blocks (lanes 0-15's rows), b1 = the last two.
template <bool Trans = false>
__device__ __forceinline__ void ldsm_x4_pair(uint32_t b0[2], uint32_t b1[2],
                                             const __nv_bfloat16* p) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  if constexpr (Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(b0[0]), "=r"(b0[1]), "=r"(b1[0]), "=r"(b1[1])
                 : "r"(addr));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(b0[0]), "=r"(b0[1]), "=r"(b1[0]), "=r"(b1[1])
                 : "r"(addr));
}

// B fragments of two adjacent n-tiles (n0..n0+7 and n0+8..n0+15; k0..k0+15) from an n-major
// tile[n][k] through one ldmatrix .x4: b0 = the first tile's, b1 = the second's.
__device__ __forceinline__ void ldsm_b_nk2(uint32_t b0[2], uint32_t b1[2],
                                           const __nv_bfloat16* tile, int ld, int n0, int k0,
                                           int lane) {
  ldsm_x4_pair(b0, b1,
               tile + (n0 + (lane & 7) + ((lane >> 4) << 3)) * ld + k0 + ((lane >> 3) & 1) * 8);
}

// B fragment (k0 .. k0+15) x (n0 .. n0+7) from an n-major tile[n][k] through ldmatrix .x2:
// lanes 0-7 address rows n0.. at k0, lanes 8-15 the same rows at k0 + 8.
__device__ __forceinline__ void ldsm_b_nk(uint32_t b[2], const __nv_bfloat16* tile, int ld, int n0,
                                          int k0, int lane) {
  const __nv_bfloat16* p = tile + (n0 + (lane & 7)) * ld + k0 + ((lane >> 3) & 1) * 8;
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(b[0]), "=r"(b[1])
               : "r"(addr));
}

// A fragment (rows m0 .. m0+15, k0 .. k0+15) of the transpose of a tile stored [k][m]: ldmatrix
// .trans hands each lane the elements of the stored columns, so lanes 8i .. 8i+7 address the
// stored rows (k) of block i: a0 (m 0-7, k 0-7), a1 (m 8-15, k 0-7), a2 (m 0-7, k 8-15), a3.
__device__ __forceinline__ void ldsm_a_trans(uint32_t a[4], const __nv_bfloat16* tile, int ld,
                                             int m0, int k0, int lane) {
  const int blk = lane >> 3;
  const __nv_bfloat16* p = tile + (k0 + (lane & 7) + (blk >> 1) * 8) * ld + m0 + (blk & 1) * 8;
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(addr));
}

// 16 bytes global -> shared without a register round trip (completes at cp_async_wait).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(addr), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// The A fragment (16 rows x 16 k) held by C tiles j and j+1 (k = 8 j .. 8 j + 15), rounded to bf16.
__device__ __forceinline__ void c_to_a(uint32_t a[4], const float c0[4], const float c1[4]) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
}

// tf32 m16n8k8 with fp32 accumulators, for products whose operands are fp32 (the KDA state
// passes): each operand is rounded to tf32 (10-bit mantissa, to nearest) on the way in.
// Fragments: A (16 x 8, row-major) a0 = (g, c), a1 = (g+8, c), a2 = (g, c+4), a3 = (g+8, c+4);
// B (8 x 8, k x n) b0 = (k c, n g), b1 = (k c+4, n g); C as for the bf16 MMA.
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// A bf16 value as a tf32 operand: exact (bf16's 8-bit significand fits tf32's 11), so operands
// stored as bf16 (the KDA prepared block's bf16 layout) enter tf32 MMAs without a second rounding.
__device__ __forceinline__ uint32_t to_tf32(__nv_bfloat16 x) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(x)) << 16;
}

// c += a * b.
__device__ __forceinline__ void mma_tf32(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The tf32 A fragment (rows m0 .. m0+15, k0 .. k0+7) of an fp32 or bf16 matrix in shared
// memory: A(m, k) = A[m lda + k], or A[k lda + m] when TransA.
template <bool TransA, typename TA>
__device__ __forceinline__ void load_a_tf32(uint32_t a[4], const TA* A, int lda, int m0, int k0,
                                            int lane) {
  const int g = lane >> 2, c = lane & 3;
  const auto at = [&](int m, int k) { return TransA ? A[k * lda + m] : A[m * lda + k]; };
  a[0] = to_tf32(at(m0 + g, k0 + c));
  a[1] = to_tf32(at(m0 + g + 8, k0 + c));
  a[2] = to_tf32(at(m0 + g, k0 + c + 4));
  a[3] = to_tf32(at(m0 + g + 8, k0 + c + 4));
}

// The tf32 B fragment (k0 .. k0+7, columns n0 .. n0+7) of B(k, n) = B[k ldb + n].
__device__ __forceinline__ void load_b_tf32(uint32_t b[2], const float* B, int ldb, int k0, int n0,
                                            int lane) {
  const int g = lane >> 2, c = lane & 3;
  b[0] = to_tf32(B[(k0 + c) * ldb + n0 + g]);
  b[1] = to_tf32(B[(k0 + c + 4) * ldb + n0 + g]);
}

// acc[nt] += A(m0 .. m0+15, k) B(k, n0 + 8 nt .. n0 + 8 nt + 7) over k < kd (a multiple of 8), A
// fp32 or bf16 and B fp32 in shared memory as load_a_tf32 and load_b_tf32 read them.
// Conflict-free fragment loads need, for fp32 A, lda = 4 (mod 32) row-major and lda = 8 or 24
// (mod 32) transposed; for bf16 A, lda = 8 (mod 64) either way; and ldb = 8 or 24 (mod 32).
template <bool TransA, int NT, typename TA>
__device__ __forceinline__ void warp_mma_tf32(float (&acc)[NT][4], const TA* A, int lda, int m0,
                                              const float* B, int ldb, int n0, int kd, int lane) {
  for (int k0 = 0; k0 < kd; k0 += 8) {
    uint32_t a[4], b[NT][2];
    load_a_tf32<TransA>(a, A, lda, m0, k0, lane);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) load_b_tf32(b[nt], B, ldb, k0, n0 + 8 * nt, lane);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mma_tf32(acc[nt], a, b[nt]);
  }
}

// Max and sum over the four lanes that share a fragment row.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

}  // namespace mt::ops::cuda::mma
