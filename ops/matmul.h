// Matrix products. GEMMs go through Eigen on the CPU and cuBLAS on CUDA; any
// operand whose last two dims have a unit stride on either side (a transposed
// view, say) is passed as it is, never copied just to transpose.
//
//   matmul(a, b)     a [..., n, k] @ b [..., k, m], batch dims broadcast
//                    a <- sum_to(g @ b^T, a.shape)     b <- sum_to(a^T @ g, b.shape)
//   linear(x, W, b)  x W^T + b with x [..., in], W [out, in], b [out]
//                    x <- g W     W <- g^T x (all tokens)     b <- sum of g over tokens
#pragma once
#include <vector>

#include "core/cuda.h"
#include "core/tensor.h"

namespace tg {

Tensor matmul(const Tensor& a, const Tensor& b, MatmulPrecision precision = MatmulPrecision::Default);
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              MatmulPrecision precision = MatmulPrecision::Default);

// One strided matrix of a GEMM: element (r, c) is at ptr[r * row_stride + c * col_stride].
struct GemmMatrix {
  void* ptr = nullptr;
  int64_t row_stride = 0, col_stride = 0;
};

// A batch dim shared by the three operands, with each one's stride.
struct GemmBatchDim {
  int64_t size = 1, stride_a = 0, stride_b = 0, stride_c = 0;
};

// C = A @ B + beta * C for every batch index; A [n,k], B [k,m], C [n,m] row-major contiguous.
struct GemmProblem {
  DType dtype = DType::Float32;
  int64_t n = 0, m = 0, k = 0;
  GemmMatrix a, b, c;
  std::vector<GemmBatchDim> batch;  // merged where strides allow; the last one is innermost
  double beta = 0.0;
  MatmulPrecision precision = MatmulPrecision::Highest;
};

// Untracked: c = a @ b + beta * c over broadcast batch dims; c is contiguous with the result's shape.
void gemm_into(const char* op, const Tensor& a, const Tensor& b, const Tensor& c, double beta,
               MatmulPrecision precision);

namespace cpu {
void gemm(const GemmProblem& p);
}
namespace cuda {
void gemm(const GemmProblem& p);
}

}  // namespace tg
