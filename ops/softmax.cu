#include <cmath>

#include "core/cuda_loops.cuh"
#include "core/cuda_reduce.cuh"
#include "ops/softmax.h"

namespace tg::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // one warp per row

// Merges the running (max, sum of exp(x - max)) of two partial rows; -inf max = empty.
template <class T>
__device__ __forceinline__ void merge_max_sum(T& m, T& s, T m2, T s2) {
  const T mx = m > m2 ? m : m2;
  if (isinf(mx) && mx < 0) return;
  s = (isinf(m) && m < 0 ? T(0) : s * exp(m - mx)) + (isinf(m2) && m2 < 0 ? T(0) : s2 * exp(m2 - mx));
  m = mx;
}

// Pass 1: online max and sum over the row (one read); pass 2: write exp(x - max) / sum.
template <class T>
__global__ void softmax_forward_kernel(const T* x, T* y, int64_t rows, int64_t cols) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32;
  if (row >= rows) return;
  const T* xr = x + row * cols;
  T* yr = y + row * cols;
  T m = -INFINITY, s = 0;
  for (int64_t j = lane; j < cols; j += 32) merge_max_sum(m, s, xr[j], T(1));
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    merge_max_sum(m, s, __shfl_xor_sync(0xffffffffu, m, offset), __shfl_xor_sync(0xffffffffu, s, offset));
  const bool all_masked = isinf(m) && m < 0;
  const T inv = all_masked ? T(0) : T(1) / s;
  for (int64_t j = lane; j < cols; j += 32) yr[j] = all_masked ? T(0) : exp(xr[j] - m) * inv;
}

// gx = y * (g - sum(g * y)): a warp-wide dot, then one write pass.
template <class T>
__global__ void softmax_backward_kernel(const T* y, const T* g, T* gx, int64_t rows, int64_t cols) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32;
  if (row >= rows) return;
  const int64_t base = row * cols;
  T dot = 0;
  for (int64_t j = lane; j < cols; j += 32) dot += g[base + j] * y[base + j];
  dot = warp_sum(dot);
  for (int64_t j = lane; j < cols; j += 32) gx[base + j] = y[base + j] * (g[base + j] - dot);
}

int row_blocks(int64_t rows) { return static_cast<int>((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

// A [rows, cols, 1, 1] descriptor: cuDNN's "instance" softmax then runs over cols.
struct RowsDescriptor {
  cudnnTensorDescriptor_t desc = nullptr;
  RowsDescriptor(const Tensor& t, int64_t rows, int64_t cols) {
    TG_CHECK(rows <= INT32_MAX && cols <= INT32_MAX, "softmax (cuDNN): ", rows, " x ", cols, " exceeds cuDNN's int sizes");
    TG_CUDA_CHECK(cudnnCreateTensorDescriptor(&desc), "softmax (cuDNN)");
    TG_CUDA_CHECK(cudnnSetTensor4dDescriptor(desc, CUDNN_TENSOR_NCHW,
                                             t.dtype() == DType::Float64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT,
                                             static_cast<int>(rows), static_cast<int>(cols), 1, 1),
                  "softmax (cuDNN)");
  }
  ~RowsDescriptor() { cudnnDestroyTensorDescriptor(desc); }
  RowsDescriptor(const RowsDescriptor&) = delete;
  RowsDescriptor& operator=(const RowsDescriptor&) = delete;
};

}  // namespace

void softmax_forward(const Tensor& x, const Tensor& y, int64_t rows, int64_t cols) {
  if (rows == 0) return;
  TG_DISPATCH_FLOAT(x.dtype(), T, [&] {
    softmax_forward_kernel<<<row_blocks(rows), 32 * kRowsPerBlock, 0, stream()>>>(x.data<T>(), y.data<T>(), rows, cols);
  });
  check_launch("softmax");
}

void softmax_backward(const Tensor& y, const Tensor& g, const Tensor& gx, int64_t rows, int64_t cols) {
  if (rows == 0) return;
  TG_DISPATCH_FLOAT(y.dtype(), T, [&] {
    softmax_backward_kernel<<<row_blocks(rows), 32 * kRowsPerBlock, 0, stream()>>>(y.data<T>(), g.data<T>(),
                                                                                 gx.data<T>(), rows, cols);
  });
  check_launch("softmax_backward");
}

void softmax_forward_cudnn(const Tensor& x, const Tensor& y, int64_t rows, int64_t cols) {
  if (rows == 0) return;
  const RowsDescriptor d(x, rows, cols);
  const double one64 = 1, zero64 = 0;
  const float one32 = 1, zero32 = 0;
  const bool f64 = x.dtype() == DType::Float64;
  TG_CUDA_CHECK(cudnnSoftmaxForward(context().cudnn, CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_INSTANCE,
                                    f64 ? static_cast<const void*>(&one64) : &one32, d.desc, x.raw_data(),
                                    f64 ? static_cast<const void*>(&zero64) : &zero32, d.desc, y.raw_data()),
                "softmax (cuDNN)");
  check_launch("softmax (cuDNN)");
}

void softmax_backward_cudnn(const Tensor& y, const Tensor& g, const Tensor& gx, int64_t rows, int64_t cols) {
  if (rows == 0) return;
  const RowsDescriptor d(y, rows, cols);
  const double one64 = 1, zero64 = 0;
  const float one32 = 1, zero32 = 0;
  const bool f64 = y.dtype() == DType::Float64;
  TG_CUDA_CHECK(cudnnSoftmaxBackward(context().cudnn, CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_INSTANCE,
                                     f64 ? static_cast<const void*>(&one64) : &one32, d.desc, y.raw_data(), d.desc,
                                     g.raw_data(), f64 ? static_cast<const void*>(&zero64) : &zero32, d.desc,
                                     gx.raw_data()),
                "softmax_backward (cuDNN)");
  check_launch("softmax_backward (cuDNN)");
}

}  // namespace tg::cuda
