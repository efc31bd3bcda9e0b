// The split-fp16 products of core/mma.cuh on their own, for `cuda/mma_split`:
// one warp multiplies a 16 x k matrix by a k x 16 one in chunks of 64 along
// k, each chunk added into the running accumulators the way the attention
// kernels' dK and dV add every query tile, through one of the three product
// forms (both operands staged, A from accumulators, A from a float tile);
// and mma::sum_over_fragment_rows.
#include <cuda_fp16.h>

#include "core/cuda_context.h"
#include "core/mma.cuh"

namespace tgtest {

namespace {

namespace mma = tg::cuda::mma;
using Policy = mma::Fp16x3;

constexpr int kRows = 16, kCols = 16, kChunk = 64;
constexpr int kSplitStride = 136;   // a split row: 64 hi, 64 lo, 8 of padding (the kernels' kSplitStride)
constexpr int kFloatStride = 68;    // a float row of 64 (the kernels' kStride)

enum Form { kBothStaged = 0, kFromAccumulators = 1, kFromFloatTile = 2 };

// x as hi and lo (core/fp16_scale.cuh's split), the layout of a split tile row.
__device__ void store_split(__half* row, int col, float x) {
  const __half hi = __float2half_rn(x);
  row[col] = hi;
  row[col + mma::kLowOffset] = __float2half_rn(tg::cuda::low_part(x, __half2float(hi)));
}

// c (16 x 16, row-major) = a (16 x k, row-major) b (k x 16, row-major), k a
// multiple of 64.
template <int kForm>
__global__ void __launch_bounds__(32) split_product_kernel(const float* a, const float* b, int k, float* c) {
  __shared__ alignas(16) __half a_split[kRows * kSplitStride];
  __shared__ alignas(16) __half b_n_major[kCols * kSplitStride];   // [n][k], for kBothStaged
  __shared__ alignas(16) __half b_k_major[kChunk * kSplitStride];  // [k][n], for the other forms
  __shared__ alignas(16) float a_float[kRows * kFloatStride];
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  const auto same_row = [](int r) { return r; };
  float acc[2][4] = {};
  for (int k0 = 0; k0 < k; k0 += kChunk) {
    __syncthreads();  // the previous chunk is read
    for (int i = lane; i < kRows * kChunk; i += 32) {
      const int r = i / kChunk, x = i % kChunk;
      store_split(a_split + r * kSplitStride, x, a[r * k + k0 + x]);
      a_float[r * kFloatStride + x] = a[r * k + k0 + x];
    }
    for (int i = lane; i < kChunk * kCols; i += 32) {
      const int x = i / kCols, n = i % kCols;
      const float v = b[(k0 + x) * kCols + n];
      store_split(b_n_major + n * kSplitStride, x, v);
      store_split(b_k_major + x * kSplitStride, n, v);
    }
    __syncthreads();
    if constexpr (kForm == kBothStaged) {
      mma::tile_product<Policy, kChunk / 8, 2>(acc, a_split, kSplitStride, same_row, b_n_major, kSplitStride, 0,
                                               lane);
    } else if constexpr (kForm == kFromAccumulators) {
      float a_acc[kChunk / 8][4];  // k block s as an accumulator tile: rows g, g + 8, columns 8 s + 2 t, + 1
      for (int s = 0; s < kChunk / 8; ++s) {
        const float* top = a + g * k + k0 + 8 * s + 2 * t;
        const float* bottom = top + 8 * k;
        a_acc[s][0] = top[0], a_acc[s][1] = top[1], a_acc[s][2] = bottom[0], a_acc[s][3] = bottom[1];
      }
      mma::accumulator_product<Policy, kChunk / 8, 2>(acc, a_acc, b_k_major, kSplitStride, lane);
    } else {
      mma::scaled_float_product<Policy, kChunk / 8, 2>(acc, a_float, kFloatStride, same_row, 1.f, b_k_major,
                                                       kSplitStride, lane);
    }
  }
  for (int nt = 0; nt < 2; ++nt) {
    const int col = 8 * nt + 2 * t;
    c[g * kCols + col] = acc[nt][0];
    c[g * kCols + col + 1] = acc[nt][1];
    c[(g + 8) * kCols + col] = acc[nt][2];
    c[(g + 8) * kCols + col + 1] = acc[nt][3];
  }
}

// out[lane] = mma::sum_over_fragment_rows of v[lane][0 .. 7].
__global__ void __launch_bounds__(32) fragment_row_sums_kernel(const double* v, double* out) {
  double mine[8];
  for (int i = 0; i < 8; ++i) mine[i] = v[threadIdx.x * 8 + i];
  out[threadIdx.x] = mma::sum_over_fragment_rows(mine, threadIdx.x / 4);
}

}  // namespace

void split_product(int form, const float* a, const float* b, int k, float* c) {
  TG_CHECK(k > 0 && k % kChunk == 0, "mma_probe: k = ", k, " is not a positive multiple of ", kChunk);
  const auto launch = [&](auto kernel) {
    kernel<<<1, 32, 0, tg::cuda::stream()>>>(a, b, k, c);
    tg::cuda::check_launch("mma_probe");
  };
  if (form == kBothStaged) launch(split_product_kernel<kBothStaged>);
  else if (form == kFromAccumulators) launch(split_product_kernel<kFromAccumulators>);
  else if (form == kFromFloatTile) launch(split_product_kernel<kFromFloatTile>);
  else TG_FAIL("mma_probe: form ", form, " is none of 0, 1 and 2");
}

void fragment_row_sums(const double* v, double* out) {
  fragment_row_sums_kernel<<<1, 32, 0, tg::cuda::stream()>>>(v, out);
  tg::cuda::check_launch("mma_probe");
}

}  // namespace tgtest
