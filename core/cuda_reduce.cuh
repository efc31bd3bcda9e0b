// Warp- and block-level sums with shuffles, shared by the reduction kernels.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace tg::cuda {

// The value of lane ^ offset: a scalar, or a float3 or double2 one part at a time.
template <class T>
__device__ __forceinline__ T shuffle_xor(T v, int offset) {
  return __shfl_xor_sync(0xffffffffu, v, offset);
}
__device__ __forceinline__ float3 shuffle_xor(float3 v, int offset) {
  return {shuffle_xor(v.x, offset), shuffle_xor(v.y, offset), shuffle_xor(v.z, offset)};
}
__device__ __forceinline__ double2 shuffle_xor(double2 v, int offset) {
  return {shuffle_xor(v.x, offset), shuffle_xor(v.y, offset)};
}

// Combines the 32 lanes' values with `op`; every lane gets the result.
template <class T, class Op>
__device__ __forceinline__ T warp_reduce(T v, const Op& op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, shuffle_xor(v, offset));
  return v;
}

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  return warp_reduce(v, [](T a, T b) { return a + b; });
}

__device__ __forceinline__ float warp_max(float v) {
  return warp_reduce(v, [](float a, float b) { return fmaxf(a, b); });
}

// One warp's view of one row in a row kernel: lane l owns elements
// j = l + 32 k. With K > 0 (rows of up to 32 K elements) the first sweep
// keeps the lane's elements in registers and later sweeps read them there; with
// K == 0 (longer rows) every sweep reads memory again, mostly from the cache.
template <class T, int K>
struct WarpRow {
  const T* row;
  int64_t cols;
  int lane;
  T reg[K > 0 ? K : 1];

  // Calls f(k, j) for each element the lane owns.
  template <class F>
  __device__ __forceinline__ void sweep(const F& f) {
    if constexpr (K > 0) {
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (lane + 32 * k < cols) f(k, lane + 32 * int64_t(k));
    } else {
      int k = 0;
      for (int64_t j = lane; j < cols; j += 32, ++k) f(k, j);
    }
  }
  // The first sweep's read.
  __device__ __forceinline__ T load(int k, int64_t j) {
    const T v = row[j];
    if constexpr (K > 0) reg[k] = v;
    return v;
  }
  // Later sweeps' reads.
  __device__ __forceinline__ T get(int k, int64_t j) const {
    if constexpr (K > 0) return reg[k];
    else return row[j];
  }
  // Returns f(element); when cached, the element is replaced by f(element).
  template <class F>
  __device__ __forceinline__ T transform(int k, int64_t j, const F& f) {
    const T v = f(get(k, j));
    if constexpr (K > 0) reg[k] = v;
    return v;
  }
  // After transform(k, j, f): f(element) again, cached or recomputed.
  template <class F>
  __device__ __forceinline__ T transformed(int k, int64_t j, const F& f) const {
    if constexpr (K > 0) return reg[k];
    else return f(row[j]);
  }
};

// Calls launch(integral_constant<int, K>) with the smallest K in {1, 4, 16, 32},
// K <= kMaxK, such that 32 K >= cols, or K = 0 (no register cache) for longer
// rows. A kernel whose K = 32 variant needs too many registers to keep a wave
// of blocks resident caps kMaxK at 16.
template <int kMaxK = 32, class Launch>
void with_row_registers(int64_t cols, const Launch& launch) {
  static_assert(kMaxK == 16 || kMaxK == 32, "with_row_registers: kMaxK is 16 or 32");
  if (cols <= 32) launch(std::integral_constant<int, 1>{});
  else if (cols <= 128) launch(std::integral_constant<int, 4>{});
  else if (cols <= 512) launch(std::integral_constant<int, 16>{});
  else if constexpr (kMaxK == 32) {
    if (cols <= 1024) launch(std::integral_constant<int, 32>{});
    else launch(std::integral_constant<int, 0>{});
  } else {
    launch(std::integral_constant<int, 0>{});
  }
}

// Row kernels run one warp per row, this many rows per block.
constexpr int kRowsPerBlock = 8;
inline unsigned row_blocks(int64_t rows) { return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock); }
__device__ __forceinline__ int64_t warp_row() { return blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32; }

// Combines the whole block's values with `op` (`identity` its neutral
// element); every thread gets the result. Safe to call repeatedly.
template <class T, class Op>
__device__ T block_reduce(T v, const Op& op, T identity) {
  __shared__ T partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  v = warp_reduce(v, op);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  T total = lane < warps ? partial[lane] : identity;
  total = warp_reduce(total, op);
  __syncthreads();  // partial[] may be reused by the next call
  return total;
}

template <class T>
__device__ T block_sum(T v) {
  return block_reduce(v, [](T a, T b) { return a + b; }, T(0));
}

// The block's largest value, for values >= 0 (0 the identity: a block of
// no values gives 0).
__device__ inline float block_max(float v) {
  return block_reduce(v, [](float a, float b) { return fmaxf(a, b); }, 0.f);
}

// The block's largest of each of three values (each >= 0): one exchange
// through shared memory, where three block_max take three.
__device__ inline float3 block_max3(float3 v) {
  const auto max3 = [](float3 a, float3 b) { return float3{fmaxf(a.x, b.x), fmaxf(a.y, b.y), fmaxf(a.z, b.z)}; };
  return block_reduce(v, max3, float3{0.f, 0.f, 0.f});
}

// *amax_bits = max(*amax_bits, the block's largest m), every thread's m >= 0:
// non-negative floats order like their bits, so one integer atomicMax per block.
__device__ __forceinline__ void block_max_into(float m, unsigned* amax_bits) {
  m = block_max(m);
  if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(m));
}

}  // namespace tg::cuda
