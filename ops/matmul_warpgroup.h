// The "highest" split GEMM on Hopper's warpgroup MMA (ops/matmul_warpgroup.cu,
// built for sm_90a): c = alpha (A_hi B_hi) + low_alpha (A_hi B_lo + A_lo B_hi)
// for row-major fp16 parts A [rows, depth] and B [depth, cols] (to_fp16_split's
// hi and lo) into row-major float c [rows, cols], the products that gemm_fp16
// otherwise runs as cuBLAS GEMMs over k slices of 512 (ops/matmul.cu). Each
// 64-long stretch of k is a fresh hi hi accumulation in the tensor cores,
// added to a float running sum in registers; the cross terms, 2^-11 smaller,
// accumulate in the tensor cores over the whole k (docs/derivations.md, "The
// split GEMM"). CUDA internal: included by .cu files alone.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

namespace tg::cuda {

struct SplitGemm {
  const __half *a_hi, *a_lo;  // [rows, depth], row length depth
  const __half *b_hi, *b_lo;  // [depth, cols], row length cols
  float* c;                   // [rows, cols]
  const float *alpha, *low_alpha;  // device scalars (the fp16 group's)
  int64_t rows, cols, depth;
  __half* b_transposed;  // workspace of 2 cols depth halves: B's parts as [cols, depth], K-major like A
};

// The tile sizes: c in tiles of kSplitGemmRows x kSplitGemmCols, k in chunks of kSplitGemmDepth.
constexpr int64_t kSplitGemmRows = 128, kSplitGemmCols = 128, kSplitGemmDepth = 64;

// Whether the kernel takes these sizes: cols a multiple of kSplitGemmCols,
// depth of kSplitGemmDepth, rows and depth within the grid's and the TMA's
// coordinates (the parts 16-byte aligned, as allocations are).
inline bool split_gemm_fits(int64_t rows, int64_t cols, int64_t depth) {
  return rows > 0 && depth > 0 && cols % kSplitGemmCols == 0 && depth % kSplitGemmDepth == 0 &&
         (rows + kSplitGemmRows - 1) / kSplitGemmRows <= 65535 && depth <= INT32_MAX;
}

void launch_split_gemm_warpgroup(const SplitGemm& g);

}  // namespace tg::cuda
