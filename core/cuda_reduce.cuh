// Warp- and block-level sums with shuffles, shared by the reduction kernels.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace tg::cuda {

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <class T>
__device__ __forceinline__ T warp_max(T v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Row kernels keep a row of up to 32 K elements in registers, K per lane.
// Calls launch(integral_constant<int, K>) with the smallest K in {1, 4, 16, 32}
// such that 32 K >= cols; returns false when the row is longer than 1024.
constexpr int64_t kMaxRegisterCols = 32 * 32;

template <class Launch>
bool with_register_count(int64_t cols, const Launch& launch) {
  if (cols <= 32) return launch(std::integral_constant<int, 1>{}), true;
  if (cols <= 128) return launch(std::integral_constant<int, 4>{}), true;
  if (cols <= 512) return launch(std::integral_constant<int, 16>{}), true;
  if (cols <= kMaxRegisterCols) return launch(std::integral_constant<int, 32>{}), true;
  return false;
}

// Sum over the whole block; every thread gets the result. Safe to call repeatedly.
template <class T>
__device__ T block_sum(T v) {
  __shared__ T partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  v = warp_sum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  T total = lane < warps ? partial[lane] : T(0);
  total = warp_sum(total);
  __syncthreads();  // partial[] may be reused by the next call
  return total;
}

}  // namespace tg::cuda
