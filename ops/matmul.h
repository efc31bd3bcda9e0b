// Matrix products. GEMMs go through Eigen on the CPU and cuBLAS on CUDA; an
// operand whose last two dims have a unit stride on either side (a transposed
// view, say) is read in place, never copied just to transpose.
//
//   matmul(a, b)     a [..., n, k] @ b [..., k, m], batch dims broadcast
//                    a <- sum_to(g @ b^T, a.shape)     b <- sum_to(a^T @ g, b.shape)
//   linear(x, W, b)  x W^T + b with x [..., in], W [out, in], b [out]
//                    x <- g W     W <- g^T x (all tokens)     b <- sum of g over tokens
//   linear_fp16(x, W, b)  the same with its GEMMs on fp16 tensor cores (CUDA
//                    float32; each product's operands converted together by
//                    to_fp16, ops/matmul_kernels.h: TF32's mantissa at twice
//                    TF32's rate, but one power-of-two scale per matrix, so
//                    an element 2^22 below its matrix's largest loses
//                    precision), b added in the GEMM's epilogue where
//                    cuBLASLt takes it (as PyTorch's addmm does; a bias on
//                    a 16-byte boundary), else by a pass after. The fused
//                    attention layer's projections at "high". Elsewhere it
//                    is linear at "high".
//
// float32 GEMMs run at `precision` ("highest" = fp32, "high" = TF32 tensor
// cores on CUDA); float64 GEMMs are always fp64.
#pragma once
#include "core/cuda.h"
#include "core/tensor.h"

namespace tg {

Tensor matmul(const Tensor& a, const Tensor& b, MatmulPrecision precision = MatmulPrecision::Default);
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              MatmulPrecision precision = MatmulPrecision::Default);
Tensor linear_fp16(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace tg
