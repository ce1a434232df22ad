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

// Two consecutive bf16 elements of shared memory (4-byte aligned) as one register.
__device__ __forceinline__ uint32_t ld_pair(const __nv_bfloat16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// c += a * b.
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// A fragment of rows r0 .. r0+15, cols k0 .. k0+15 of a row-major bf16 tile with leading
// dimension `ld` (elements).
__device__ __forceinline__ void load_a(uint32_t a[4], const __nv_bfloat16* tile, int ld, int r0,
                                       int k0, int lane) {
  const int g = lane >> 2, c = lane & 3;
  const __nv_bfloat16* p = tile + (r0 + g) * ld + k0 + 2 * c;
  a[0] = ld_pair(p);
  a[1] = ld_pair(p + 8 * ld);
  a[2] = ld_pair(p + 8);
  a[3] = ld_pair(p + 8 * ld + 8);
}

// B fragment (k0 .. k0+15) x (n0 .. n0+7) from a tile stored n-major: tile[n][k] (B transposed,
// e.g. keys [key][dim] for q.k^T). Two consecutive k of one n are adjacent.
__device__ __forceinline__ void load_b_nk(uint32_t b[2], const __nv_bfloat16* tile, int ld, int n0,
                                          int k0, int lane) {
  const int g = lane >> 2, c = lane & 3;
  const __nv_bfloat16* p = tile + (n0 + g) * ld + k0 + 2 * c;
  b[0] = ld_pair(p);
  b[1] = ld_pair(p + 8);
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

// The A fragment (16 rows x 16 k) held by C tiles j and j+1 (k = 8 j .. 8 j + 15), rounded to bf16.
__device__ __forceinline__ void c_to_a(uint32_t a[4], const float c0[4], const float c1[4]) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
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
