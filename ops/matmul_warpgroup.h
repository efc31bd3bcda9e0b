// The "highest" split GEMM on Hopper's warpgroup MMA (ops/matmul_warpgroup.cu,
// built for sm_90a): c = alpha (A_hi B_hi) + low_alpha (A_hi B_lo + A_lo B_hi)
// for fp16 parts of op(A) [rows, depth] and op(B) [depth, cols] (to_fp16_split's
// hi and lo) into row-major float c [rows, cols], the products that gemm_fp16
// otherwise runs as cuBLAS GEMMs over k slices of 512 (ops/matmul.cu). Each
// 64-long stretch of k is a fresh hi hi accumulation in the tensor cores,
// added to a float running sum in registers; the cross terms, 2^-11 smaller,
// accumulate in the tensor cores over the whole k (docs/derivations.md, "The
// split GEMM"). CUDA internal: included by .cu files alone.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "ops/matmul_kernels.h"

namespace tg::cuda {

// op(A) [rows, depth] and op(B) [depth, cols] as gemm_fp16 takes them: A
// stored [rows, depth] or, transposed, [depth, rows]; B stored [depth, cols]
// or, transposed, [cols, depth]; row-major, each row 16-byte aligned.
struct SplitGemm {
  const __half *a_hi, *a_lo, *b_hi, *b_lo;
  bool transpose_a, transpose_b;
  float* c;                        // [rows, cols]
  const float *alpha, *low_alpha;  // device scalars (the fp16 group's)
  int64_t rows, cols, depth;
  // k in `splits` stretches, one CTA per tile and stretch: the first into c,
  // the others into partials [splits - 1, rows, cols], which the caller
  // adds to c in order.
  int splits = 1;
  float* partials = nullptr;
};

// Whether the kernel takes the product: cols a multiple of kSplitGemmCols,
// rows and depth within the grid's and the TMA's coordinates, what the TMA
// reads 16-byte aligned (the parts' bases and their stored rows: 8 halves)
// and c 8-byte aligned (float2 stores; the C API's outputs may be any float
// pointer).
inline bool split_gemm_takes(const SplitGemm& g) {
  const auto aligned = [](const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  const bool depth_rows = !g.transpose_a || g.transpose_b;  // a stored row of depth halves
  return g.rows > 0 && g.depth > 0 && g.cols % kSplitGemmCols == 0 && (!g.transpose_a || g.rows % 8 == 0) &&
         (!depth_rows || g.depth % 8 == 0) && (g.rows + kSplitGemmRows - 1) / kSplitGemmRows <= 65535 &&
         g.rows <= INT32_MAX && g.depth <= INT32_MAX && aligned(g.a_hi, 16) && aligned(g.a_lo, 16) &&
         aligned(g.b_hi, 16) && aligned(g.b_lo, 16) && aligned(g.c, 8);
}

void launch_split_gemm_warpgroup(const SplitGemm& g);

}  // namespace tg::cuda
