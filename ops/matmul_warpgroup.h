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

// The tile sizes: c in tiles of kSplitGemmRows x kSplitGemmCols, k in chunks of kSplitGemmDepth.
constexpr int64_t kSplitGemmRows = 128, kSplitGemmCols = 128, kSplitGemmDepth = 64;

// Whether the kernel takes these sizes: cols a multiple of kSplitGemmCols,
// each stored row a multiple of 16 bytes (8 halves), rows and depth within
// the grid's and the TMA's coordinates (the parts' bases 16-byte aligned,
// as allocations are).
inline bool split_gemm_fits(int64_t rows, int64_t cols, int64_t depth, bool transpose_a, bool transpose_b) {
  const bool depth_rows = !transpose_a || transpose_b;  // a stored row of depth halves
  return rows > 0 && depth > 0 && cols % kSplitGemmCols == 0 && (!transpose_a || rows % 8 == 0) &&
         (!depth_rows || depth % 8 == 0) && (rows + kSplitGemmRows - 1) / kSplitGemmRows <= 65535 &&
         rows <= INT32_MAX && depth <= INT32_MAX;
}

void launch_split_gemm_warpgroup(const SplitGemm& g);

}  // namespace tg::cuda
