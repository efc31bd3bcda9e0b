// The split-fp16 products of core/mma.cuh's Fp16x3 on their own, for
// `cuda/mma_split` (tests/split_probe.cuh), and mma::sum_over_fragment_rows.
#include <cuda_fp16.h>

#include "core/cuda_context.h"
#include "core/mma.cuh"
#include "split_probe.cuh"

namespace tgtest {

namespace {

namespace mma = tg::cuda::mma;

// out[lane] = mma::sum_over_fragment_rows of v[lane][0 .. 7].
__global__ void __launch_bounds__(32) fragment_row_sums_kernel(const double* v, double* out) {
  double mine[8];
  for (int i = 0; i < 8; ++i) mine[i] = v[threadIdx.x * 8 + i];
  out[threadIdx.x] = mma::sum_over_fragment_rows(mine, threadIdx.x / 4);
}

}  // namespace

void split_product(int form, const float* a, const float* b, int k, float* c) {
  split_probe::split_product<mma::Fp16x3>(form, a, b, k, c);
}

void fragment_row_sums(const double* v, double* out) {
  fragment_row_sums_kernel<<<1, 32, 0, tg::cuda::stream()>>>(v, out);
  tg::cuda::check_launch("mma_probe");
}

}  // namespace tgtest
