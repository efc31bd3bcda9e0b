// Warp- and block-level sums with shuffles, shared by the reduction kernels.
#pragma once
#include <cuda_runtime.h>

namespace tg::cuda {

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
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
