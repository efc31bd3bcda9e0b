// The GEMM problem both back ends solve, and its kernels.
#pragma once
#include <vector>

#include "core/cuda.h"
#include "core/dispatch.h"
#include "core/tensor.h"

namespace tg {

// One strided matrix of a GEMM: element (r, c) is at ptr[r * row_stride + c * col_stride].
struct GemmMatrix {
  void* ptr = nullptr;
  int64_t row_stride = 0, col_stride = 0;
};

// A batch dim shared by the three operands, with each one's stride.
struct GemmBatchDim {
  int64_t size = 1, stride_a = 0, stride_b = 0, stride_c = 0;
};

// C = A @ B + beta * C for every batch index; A [n,k], B [k,m], C [n,m].
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

template <Device D>
struct GemmKernels {
  static void gemm(const GemmProblem& p);  // k >= 1
};

}  // namespace tg
