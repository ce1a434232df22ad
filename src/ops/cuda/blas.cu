#include "ops/cuda/blas.h"
#include "ops/cuda/common.cuh"

namespace mt::ops::cuda {

namespace {

cudaDataType_t lt_type(DType t) {
  switch (t) {
    case DType::F32:
      return CUDA_R_32F;
    case DType::BF16:
      return CUDA_R_16BF;
    default:
      MT_THROW(ShapeError, "matmul: CUDA path takes f32 or bf16, got ", dtype_name(t));
  }
}

// cuBLASLt descriptors freed on every path out of lt_matmul.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtDescs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace

void lt_matmul(Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
               float alpha, MatRef a, MatRef b, float beta, void* c, DType c_dtype, int64_t ldc) {
  if (m == 0 || n == 0) return;
  MT_CHECK(a.dtype == b.dtype, ShapeError, "matmul: operands are ", dtype_name(a.dtype), " and ",
           dtype_name(b.dtype));
  CudaResources& cr = cuda_resources(ctx);
  if (k == 0) {  // C = beta C: cuBLASLt needs k > 0
    MT_CHECK(beta == 0.f, ValueError, "matmul: k == 0 with beta != 0 is not supported on CUDA");
    for (int64_t r = 0; r < m; ++r)
      MT_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(c) + r * ldc * dtype_size(c_dtype), 0,
                                    static_cast<size_t>(n) * dtype_size(c_dtype), cr.stream));
    return;
  }
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the column-major view of a
  // row-major [r, c] matrix with row stride ld is a [c, r] matrix with leading dimension ld, so
  // B plays cuBLAS's A and A plays its B, each transposed iff it is transposed here.
  LtDescs d;
  MT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opa = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  MT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
  MT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
  // Stored (column-major) shapes: B as [trans_b ? k : n, trans_b ? n : k], A likewise.
  const uint64_t a_rows = static_cast<uint64_t>(trans_b ? k : n);
  const uint64_t a_cols = static_cast<uint64_t>(trans_b ? n : k);
  const uint64_t b_rows = static_cast<uint64_t>(trans_a ? m : k);
  const uint64_t b_cols = static_cast<uint64_t>(trans_a ? k : m);
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, lt_type(b.dtype), a_rows, a_cols, b.ld));
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, lt_type(a.dtype), b_rows, b_cols, a.ld));
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, lt_type(c_dtype), static_cast<uint64_t>(n),
                                             static_cast<uint64_t>(m), ldc));
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&d.pref));
  MT_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &cr.lt_workspace_bytes, sizeof cr.lt_workspace_bytes));
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  MT_CUBLAS_CHECK(
      cublasLtMatmulAlgoGetHeuristic(cr.lt, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &heur, &found));
  MT_CHECK(found > 0, InternalError, "cuBLASLt has no algorithm for ", m, "x", n, "x", k, " ",
           dtype_name(a.dtype), " -> ", dtype_name(c_dtype));
  MT_CUBLAS_CHECK(cublasLtMatmul(cr.lt, d.op, &alpha, b.data, d.a, a.data, d.b, &beta, c, d.c, c,
                                 d.c, &heur.algo, cr.lt_workspace, cr.lt_workspace_bytes,
                                 cr.stream));
}

}  // namespace mt::ops::cuda
