// The split-fp16 products of a policy on their own, for `cuda/mma_split`:
// one CTA of four warps (every warp its 16 rows, as in the attention
// kernels) multiplies a 64 x k matrix by a k x 64 one in chunks of 64 along
// k, each chunk added into the running accumulators the way the kernels add
// every query tile into dK and dV, through one of the three product forms
// (both operands staged, A from accumulators, A from a float tile); with the
// warpgroup products the first two also with B staged as mma::SwizzledRows
// (the attention backward's Q and dO tiles: lo a 64 x 64 block of its own).
// Included by tests/mma_probe.cu (Fp16x3, mma.sync) and tests/wgmma_probe.cu
// (Fp16x3Warpgroup, sm_90a, which includes core/wgmma.cuh first so that its
// products are the ones found).
#pragma once
#include <cuda_fp16.h>

#include "core/cuda_context.h"
#include "core/mma.cuh"

namespace tgtest::split_probe {

namespace mma = tg::cuda::mma;

constexpr int kRows = 64, kCols = 64, kChunk = 64;
constexpr int kSplitStride = 136;  // Fp16x3's split row: 64 hi, 64 lo, 8 of padding (the kernels' kSplitStride)
constexpr int kFloatStride = 68;   // a float row of 64 (the kernels' kStride)
constexpr int kTileBytes = kRows * kFloatStride * sizeof(float);  // the larger of a split tile and a float one

enum Form {
  kBothStaged = 0,
  kFromAccumulators = 1,
  kFromFloatTile = 2,
  kBothStagedSwizzledB = 3,        // warpgroup products only
  kFromAccumulatorsSwizzledB = 4,  // warpgroup products only
};

// Where the hi value of element (r, k) of a split tile lies, in halves (its
// lo value Policy::kLowOffset further): rows of kSplitStride, or core
// matrices of 128-half rows with the warpgroup products.
template <class Policy>
__device__ int split_at(int r, int k) {
  if constexpr (Policy::kWarpgroup) return mma::core_matrix_offset(r, k, 2 * kChunk);
  else return r * kSplitStride + k;
}

// x split at tile[at] (hi) and tile[at + low_offset] (lo).
__device__ inline void store_parts(__half* tile, int at, int low_offset, float x) {
  const __half hi = __float2half_rn(x);
  tile[at] = hi;
  tile[at + low_offset] = __float2half_rn(tg::cuda::low_part(x, __half2float(hi)));
}

template <class Policy>
__device__ void store_split(__half* tile, int r, int k, float x) {
  store_parts(tile, split_at<Policy>(r, k), Policy::kLowOffset, x);
}

// The same at row r, column col of a SwizzledRows tile.
__device__ inline void store_swizzled(__half* tile, int r, int col, float x) {
  store_parts(tile, mma::swizzled_row_offset(r, col), mma::kSwizzledPart, x);
}

// c (64 x 64, row-major) = a (64 x k, row-major) b (k x 64, row-major), k a
// multiple of 64.
template <class Policy, int kForm>
__global__ void __launch_bounds__(128) split_product_kernel(const float* a, const float* b, int k, float* c) {
  static_assert(kRows * kSplitStride * sizeof(__half) <= kTileBytes, "a split tile fits");
  static_assert(kRows == kCols && kCols == kChunk, "one loop stages A's rows and B's columns, 64 each");
  constexpr bool kSwizzledB = kForm >= kBothStagedSwizzledB;
  constexpr int kProduct = kSwizzledB ? kForm - kBothStagedSwizzledB : kForm;  // the form of the product
  static_assert(!kSwizzledB || (Policy::kWarpgroup && 2 * mma::kSwizzledPart * sizeof(__half) <= kTileBytes),
                "swizzled B tiles are the warpgroup products' (both parts fit)");
  __shared__ alignas(128) unsigned char first[kTileBytes];    // A split (kBothStaged) or float (kFromFloatTile)
  __shared__ alignas(1024) unsigned char second[kTileBytes];  // B split, [n][k] (kBothStaged) or [k][n]
  __half* a_split = reinterpret_cast<__half*>(first);
  float* a_float = reinterpret_cast<float*>(first);
  __half* b_split = reinterpret_cast<__half*>(second);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const mma::WarpRows warp_rows{warp};
  float acc[8][4] = {};
  for (int k0 = 0; k0 < k; k0 += kChunk) {
    __syncthreads();  // the previous chunk is read
    for (int i = threadIdx.x; i < kRows * kChunk; i += blockDim.x) {
      const int r = i / kChunk, x = i % kChunk;
      const float va = a[r * k + k0 + x], vb = b[(k0 + x) * kCols + r];  // r: B's column here
      if constexpr (kProduct == kBothStaged) store_split<Policy>(a_split, r, x, va);
      if constexpr (kProduct == kFromFloatTile) a_float[r * kFloatStride + x] = va;
      if constexpr (kSwizzledB && kProduct == kBothStaged) store_swizzled(b_split, r, x, vb);  // [n][k]
      else if constexpr (kSwizzledB) store_swizzled(b_split, x, r, vb);                       // [k][n]
      else if constexpr (kProduct == kBothStaged) store_split<Policy>(b_split, r, x, vb);     // [n][k]
      else store_split<Policy>(b_split, x, r, vb);                                             // [k][n]
    }
    mma::operand_tiles_written<Policy>();
    __syncthreads();
    const auto b_tile = [&] {
      if constexpr (kSwizzledB) return mma::SwizzledRows{b_split};
      else return b_split;
    }();
    if constexpr (kProduct == kBothStaged) {
      mma::tile_product<Policy, kChunk / 8, 8>(acc, a_split, kSplitStride, warp_rows, b_tile, kSplitStride, 0, lane);
    } else if constexpr (kProduct == kFromAccumulators) {
      float a_acc[kChunk / 8][4];  // k block s as an accumulator tile: rows g, g + 8, columns 8 s + 2 t, + 1
      for (int s = 0; s < kChunk / 8; ++s) {
        const float* top = a + (16 * warp + g) * k + k0 + 8 * s + 2 * t;
        const float* bottom = top + 8 * k;
        a_acc[s][0] = top[0], a_acc[s][1] = top[1], a_acc[s][2] = bottom[0], a_acc[s][3] = bottom[1];
      }
      mma::accumulator_product<Policy, kChunk / 8, 8>(acc, a_acc, b_tile, kSplitStride, lane);
    } else {
      mma::scaled_float_product<Policy, kChunk / 8, 8>(acc, a_float, kFloatStride, warp_rows, 1.f, b_split,
                                                       kSplitStride, lane);
    }
    mma::products_done<Policy>();
  }
  for (int nt = 0; nt < 8; ++nt) {
    const int row = 16 * warp + g, col = 8 * nt + 2 * t;
    c[row * kCols + col] = acc[nt][0];
    c[row * kCols + col + 1] = acc[nt][1];
    c[(row + 8) * kCols + col] = acc[nt][2];
    c[(row + 8) * kCols + col + 1] = acc[nt][3];
  }
}

template <class Policy>
void split_product(int form, const float* a, const float* b, int k, float* c) {
  TG_CHECK(k > 0 && k % kChunk == 0, "split_probe: k = ", k, " is not a positive multiple of ", kChunk);
  const auto launch = [&](auto kernel) {
    kernel<<<1, 128, 0, tg::cuda::stream()>>>(a, b, k, c);
    tg::cuda::check_launch("split_probe");
  };
  if (form == kBothStaged) launch(split_product_kernel<Policy, kBothStaged>);
  else if (form == kFromAccumulators) launch(split_product_kernel<Policy, kFromAccumulators>);
  else if (form == kFromFloatTile) launch(split_product_kernel<Policy, kFromFloatTile>);
  else if constexpr (Policy::kWarpgroup) {
    if (form == kBothStagedSwizzledB) launch(split_product_kernel<Policy, kBothStagedSwizzledB>);
    else if (form == kFromAccumulatorsSwizzledB) launch(split_product_kernel<Policy, kFromAccumulatorsSwizzledB>);
    else TG_FAIL("split_probe: form ", form, " is none of 0 to 4");
  } else {
    TG_FAIL("split_probe: form ", form, " is none of 0, 1 and 2 (swizzled B tiles are the warpgroup products')");
  }
}

}  // namespace tgtest::split_probe
