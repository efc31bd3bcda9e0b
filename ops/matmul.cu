#include "core/cuda_allocator.h"
#include "core/cuda_context.h"
#include "core/cuda_loops.cuh"
#include "core/indexing.h"
#include "ops/matmul_kernels.h"

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

// The batch dims of one operand as an indexer over the batch index.
StridedIndexer batch_indexer(const GemmProblem& p, int64_t GemmBatchDim::*stride) {
  Shape sizes, strides;
  for (const GemmBatchDim& d : p.batch) {
    sizes.push_back(d.size);
    strides.push_back(d.*stride);
  }
  return make_indexer("matmul", sizes, strides);
}

// Pointers to every batch's matrices, for cuBLAS's pointer-array batched GEMM:
// [0, n) the first operand (B), [n, 2n) the second (A), [2n, 3n) C.
struct BatchPointers {
  char *a, *b, *c;
  StridedIndexer ia, ib, ic;
  int64_t count, elem;
  void** out;
  TG_HD void operator()(int64_t i) const {
    out[i] = b + ib.offset(i) * elem;
    out[count + i] = a + ia.offset(i) * elem;
    out[2 * count + i] = c + ic.offset(i) * elem;
  }
};

// Device memory for a few pointers, back to the cache when done (stream-ordered reuse).
class DeviceScratch {
 public:
  explicit DeviceScratch(std::size_t bytes) : ptr_(allocate(bytes)) {}
  ~DeviceScratch() { deallocate(ptr_); }
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  void** pointers() const { return static_cast<void**>(ptr_); }

 private:
  void* ptr_;
};

}  // namespace

}  // namespace tg::cuda

namespace tg {

// One launch per product: batch dims that merge into one stride go to the
// strided-batched GEMM; any others (q k^T on views of a permuted projection,
// say) to the pointer-array batched GEMM, its pointers written by a kernel.
template <>
void GemmKernels<Device::CUDA>::gemm(const GemmProblem& p) {
  using namespace cuda;
  const CublasOperand a = as_transposed_operand(p.a), b = as_transposed_operand(p.b);
  const cudaDataType_t type = p.dtype == DType::Float64 ? CUDA_R_64F : CUDA_R_32F;
  const HostScalar alpha(1.0, p.dtype), beta(p.beta, p.dtype);
  int64_t count = 1;
  for (const GemmBatchDim& d : p.batch) count *= d.size;
  for (const int64_t v : {p.m, p.n, p.k, a.ld, b.ld, p.c.row_stride, count})
    TG_CHECK(v <= INT32_MAX, "matmul: a size or leading dimension of ", v, " exceeds cuBLAS's int (", p.n, " x ", p.k,
             " @ ", p.k, " x ", p.m, ", batch ", count, ")");
  const int m = static_cast<int>(p.m), n = static_cast<int>(p.n), k = static_cast<int>(p.k);
  const int ldc = static_cast<int>(p.c.row_stride);
  if (p.batch.size() <= 1) {
    const GemmBatchDim d = p.batch.empty() ? GemmBatchDim{} : p.batch.back();
    TG_CUDA_CHECK(cublasGemmStridedBatchedEx(cublas(), b.op, a.op, m, n, k, alpha.get(), p.b.ptr, type,
                                             static_cast<int>(b.ld), d.stride_b, p.a.ptr, type, static_cast<int>(a.ld),
                                             d.stride_a, beta.get(), p.c.ptr, type, ldc, d.stride_c,
                                             static_cast<int>(d.size), compute_type(p), CUBLAS_GEMM_DEFAULT),
                  "matmul");
  } else {
    const DeviceScratch scratch(3 * count * sizeof(void*));
    const int64_t elem = static_cast<int64_t>(element_size(p.dtype));
    for_each("matmul (batch pointers)", count,
             BatchPointers{static_cast<char*>(p.a.ptr), static_cast<char*>(p.b.ptr), static_cast<char*>(p.c.ptr),
                           batch_indexer(p, &GemmBatchDim::stride_a), batch_indexer(p, &GemmBatchDim::stride_b),
                           batch_indexer(p, &GemmBatchDim::stride_c), count, elem, scratch.pointers()});
    void** ptrs = scratch.pointers();
    TG_CUDA_CHECK(cublasGemmBatchedEx(cublas(), b.op, a.op, m, n, k, alpha.get(), ptrs, type,
                                      static_cast<int>(b.ld), ptrs + count, type, static_cast<int>(a.ld), beta.get(),
                                      ptrs + 2 * count, type, ldc, static_cast<int>(count), compute_type(p),
                                      CUBLAS_GEMM_DEFAULT),
                  "matmul");
  }
  check_launch("matmul");
}

}  // namespace tg
