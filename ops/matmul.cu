#include "core/cuda_context.h"
#include "core/indexing.h"
#include "ops/matmul.h"

namespace tg::cuda {

namespace {

// cuBLAS is column-major: a row-major matrix with leading dim ld is its own
// transpose there. Row-major C = A B is computed as column-major C^T = B^T A^T.
struct CublasOperand {
  cublasOperation_t op;
  int64_t ld;
};

CublasOperand as_transposed_operand(const GemmMatrix& m) {
  if (m.col_stride == 1) return {CUBLAS_OP_N, m.row_stride};  // row-major: already X^T in column-major
  return {CUBLAS_OP_T, m.col_stride};                         // column-major X: transpose it
}

cublasComputeType_t compute_type(const GemmProblem& p) {
  if (p.dtype == DType::Float64) return CUBLAS_COMPUTE_64F;
  return p.precision == MatmulPrecision::High ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

}  // namespace

void gemm(const GemmProblem& p) {
  const CublasOperand a = as_transposed_operand(p.a), b = as_transposed_operand(p.b);
  const cudaDataType_t type = p.dtype == DType::Float64 ? CUDA_R_64F : CUDA_R_32F;
  const size_t elem = element_size(p.dtype);
  const GemmBatchDim inner = p.batch.empty() ? GemmBatchDim{} : p.batch.back();
  Shape outer_sizes, sa, sb, sc;  // the batch dims cuBLAS cannot stride over: looped here
  for (size_t d = 0; d + 1 < p.batch.size(); ++d) {
    outer_sizes.push_back(p.batch[d].size);
    sa.push_back(p.batch[d].stride_a), sb.push_back(p.batch[d].stride_b), sc.push_back(p.batch[d].stride_c);
  }
  const StridedIndexer ia = make_indexer("matmul", outer_sizes, sa), ib = make_indexer("matmul", outer_sizes, sb),
                       ic = make_indexer("matmul", outer_sizes, sc);
  const HostScalar alpha(1.0, p.dtype), beta(p.beta, p.dtype);
  for (int64_t i = 0; i < numel(outer_sizes); ++i) {
    const char* A = static_cast<const char*>(p.a.ptr) + ia.offset(i) * elem;
    const char* B = static_cast<const char*>(p.b.ptr) + ib.offset(i) * elem;
    char* C = static_cast<char*>(p.c.ptr) + ic.offset(i) * elem;
    TG_CUDA_CHECK(cublasGemmStridedBatchedEx(context().cublas, b.op, a.op, static_cast<int>(p.m), static_cast<int>(p.n),
                                             static_cast<int>(p.k), alpha.get(), B, type, static_cast<int>(b.ld),
                                             inner.stride_b, A, type, static_cast<int>(a.ld), inner.stride_a, beta.get(), C,
                                             type, static_cast<int>(p.c.row_stride), inner.stride_c,
                                             static_cast<int>(inner.size), compute_type(p), CUBLAS_GEMM_DEFAULT),
                  "matmul");
  }
  check_launch("matmul");
}

}  // namespace tg::cuda
