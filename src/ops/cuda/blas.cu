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

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the column-major view of a
// row-major [r, c] matrix with row stride ld is a [c, r] matrix with leading dimension ld, so
// B plays cuBLAS's A and A plays its B, each transposed iff it is transposed here.
void build_plan(cublasLtHandle_t lt, const LtKey& key, LtPlan& plan) {
  MT_CUBLAS_CHECK(cublasLtMatmulDescInit(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opa = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  MT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(&plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
  MT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(&plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
  // Stored (column-major) shapes: B as [trans_b ? k : n, trans_b ? n : k], A likewise.
  const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  const int64_t m = key.m, n = key.n, k = key.k;
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutInit(&plan.a, lt_type(key.b), u(key.trans_b ? k : n),
                                           u(key.trans_b ? n : k), key.ldb));
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutInit(&plan.b, lt_type(key.a), u(key.trans_a ? m : k),
                                           u(key.trans_a ? k : m), key.lda));
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutInit(&plan.c, lt_type(key.c), u(n), u(m), key.ldc));
  cublasLtMatmulPreferenceOpaque_t pref;
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceInit(&pref));
  MT_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &key.workspace_bytes, sizeof key.workspace_bytes));
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  MT_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, &plan.op, &plan.a, &plan.b, &plan.c, &plan.c,
                                                 &pref, 1, &heur, &found));
  MT_CHECK(found > 0, InternalError, "cuBLASLt has no algorithm for ", m, "x", n, "x", k, " ",
           dtype_name(key.a), " -> ", dtype_name(key.c));
  plan.algo = heur.algo;
}

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
  const LtKey key{.m = m,
                  .n = n,
                  .k = k,
                  .lda = a.ld,
                  .ldb = b.ld,
                  .ldc = ldc,
                  .a = a.dtype,
                  .b = b.dtype,
                  .c = c_dtype,
                  .trans_a = trans_a,
                  .trans_b = trans_b,
                  .workspace_bytes = cr.lt_workspace_bytes};
  LtPlan& plan = cr.lt_plans.get(key, [&](LtPlan& fresh) { build_plan(cr.lt, key, fresh); });
  MT_CUBLAS_CHECK(cublasLtMatmul(cr.lt, &plan.op, &alpha, b.data, &plan.a, a.data, &plan.b, &beta,
                                 c, &plan.c, c, &plan.c, &plan.algo, cr.lt_workspace,
                                 cr.lt_workspace_bytes, cr.stream));
}

}  // namespace mt::ops::cuda
