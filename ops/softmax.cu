#include <cmath>
#include <cstdio>
#include <type_traits>

#include "core/cuda_loops.cuh"
#include "core/cuda_reduce.cuh"
#include "ops/softmax.h"

namespace tg::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // one warp per row
// Rows of up to 32 K columns: each lane keeps its K elements in registers, so
// the row is read once and written once: max, then exp and sum, then scale.
template <class T, int K>
__global__ void softmax_forward_registers(const T* x, T* y, int64_t rows, int64_t cols) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32;
  if (row >= rows) return;
  const T* xr = x + row * cols;
  T v[K];
  T mx = -INFINITY;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t j = lane + 32 * k;
    v[k] = j < cols ? xr[j] : T(-INFINITY);
    mx = max(mx, v[k]);
  }
  mx = warp_max(mx);
  const bool all_masked = isinf(mx) && mx < 0;  // every key masked: the row is zeros
  T sum = 0;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    v[k] = all_masked ? T(0) : exp(v[k] - mx);
    sum += v[k];
  }
  sum = warp_sum(sum);
  const T inv = all_masked ? T(0) : T(1) / sum;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t j = lane + 32 * k;
    if (j < cols) y[row * cols + j] = v[k] * inv;
  }
}

// Longer rows: three sweeps (max, sum, write); the second and third hit the cache.
template <class T>
__global__ void softmax_forward_long_rows(const T* x, T* y, int64_t rows, int64_t cols) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32;
  if (row >= rows) return;
  const T* xr = x + row * cols;
  T mx = -INFINITY;
  for (int64_t j = lane; j < cols; j += 32) mx = max(mx, xr[j]);
  mx = warp_max(mx);
  const bool all_masked = isinf(mx) && mx < 0;
  T sum = 0;
  for (int64_t j = lane; j < cols; j += 32) sum += all_masked ? T(0) : exp(xr[j] - mx);
  const T inv = all_masked ? T(0) : T(1) / warp_sum(sum);
  for (int64_t j = lane; j < cols; j += 32) y[row * cols + j] = all_masked ? T(0) : exp(xr[j] - mx) * inv;
}

// gx = y * (g - sum(g * y)), the row held in registers.
template <class T, int K>
__global__ void softmax_backward_registers(const T* y, const T* g, T* gx, int64_t rows, int64_t cols) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32;
  if (row >= rows) return;
  const int64_t base = row * cols;
  T yv[K], gv[K];
  T dot = 0;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t j = lane + 32 * k;
    yv[k] = j < cols ? y[base + j] : T(0);
    gv[k] = j < cols ? g[base + j] : T(0);
    dot += yv[k] * gv[k];
  }
  dot = warp_sum(dot);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t j = lane + 32 * k;
    if (j < cols) gx[base + j] = yv[k] * (gv[k] - dot);
  }
}

template <class T>
__global__ void softmax_backward_long_rows(const T* y, const T* g, T* gx, int64_t rows, int64_t cols) {
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

constexpr float kOne32 = 1, kZero32 = 0;
constexpr double kOne64 = 1, kZero64 = 0;

// A [rows, cols, 1, 1] descriptor: cuDNN's "instance" softmax then runs over
// cols. Also hands out the alpha = 1, beta = 0 scalars of the tensor's dtype.
struct RowsDescriptor {
  cudnnTensorDescriptor_t desc = nullptr;
  bool f64 = false;
  const void* one() const { return f64 ? static_cast<const void*>(&kOne64) : &kOne32; }
  const void* zero() const { return f64 ? static_cast<const void*>(&kZero64) : &kZero32; }

  RowsDescriptor(const Tensor& t, int64_t rows, int64_t cols) : f64(t.dtype() == DType::Float64) {
    TG_CHECK(rows <= INT32_MAX && cols <= INT32_MAX, "softmax (cuDNN): ", rows, " x ", cols, " exceeds cuDNN's int sizes");
    TG_CUDA_CHECK(cudnnCreateTensorDescriptor(&desc), "softmax (cuDNN)");
    TG_CUDA_CHECK(cudnnSetTensor4dDescriptor(desc, CUDNN_TENSOR_NCHW,
                                             t.dtype() == DType::Float64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT,
                                             static_cast<int>(rows), static_cast<int>(cols), 1, 1),
                  "softmax (cuDNN)");
  }
  ~RowsDescriptor() {  // a destructor cannot throw: a failure is reported
    const cudnnStatus_t status = cudnnDestroyTensorDescriptor(desc);
    if (status != CUDNN_STATUS_SUCCESS) std::fprintf(stderr, "tapegrad: softmax (cuDNN): %s\n", cudnnGetErrorString(status));
  }
  RowsDescriptor(const RowsDescriptor&) = delete;
  RowsDescriptor& operator=(const RowsDescriptor&) = delete;
};

}  // namespace

void softmax_forward(const Tensor& x, const Tensor& y, int64_t rows, int64_t cols) {
  if (rows == 0) return;
  const dim3 grid(row_blocks(rows)), block(32 * kRowsPerBlock);
  TG_DISPATCH_FLOAT(x.dtype(), T, [&] {
    const bool short_rows = with_register_count(cols, [&](auto k) {
      softmax_forward_registers<T, decltype(k)::value><<<grid, block, 0, stream()>>>(x.data<T>(), y.data<T>(), rows, cols);
    });
    if (!short_rows) softmax_forward_long_rows<T><<<grid, block, 0, stream()>>>(x.data<T>(), y.data<T>(), rows, cols);
  });
  check_launch("softmax");
}

void softmax_backward(const Tensor& y, const Tensor& g, const Tensor& gx, int64_t rows, int64_t cols) {
  if (rows == 0) return;
  const dim3 grid(row_blocks(rows)), block(32 * kRowsPerBlock);
  TG_DISPATCH_FLOAT(y.dtype(), T, [&] {
    const bool short_rows = with_register_count(cols, [&](auto k) {
      softmax_backward_registers<T, decltype(k)::value>
          <<<grid, block, 0, stream()>>>(y.data<T>(), g.data<T>(), gx.data<T>(), rows, cols);
    });
    if (!short_rows)
      softmax_backward_long_rows<T><<<grid, block, 0, stream()>>>(y.data<T>(), g.data<T>(), gx.data<T>(), rows, cols);
  });
  check_launch("softmax_backward");
}

void softmax_forward_cudnn(const Tensor& x, const Tensor& y, int64_t rows, int64_t cols) {
  if (rows == 0) return;
  const RowsDescriptor d(x, rows, cols);
  TG_CUDA_CHECK(cudnnSoftmaxForward(context().cudnn, CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_INSTANCE, d.one(),
                                    d.desc, x.raw_data(), d.zero(), d.desc, y.raw_data()),
                "softmax (cuDNN)");
  check_launch("softmax (cuDNN)");
}

void softmax_backward_cudnn(const Tensor& y, const Tensor& g, const Tensor& gx, int64_t rows, int64_t cols) {
  if (rows == 0) return;
  const RowsDescriptor d(y, rows, cols);
  TG_CUDA_CHECK(cudnnSoftmaxBackward(context().cudnn, CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_INSTANCE, d.one(),
                                     d.desc, y.raw_data(), d.desc, g.raw_data(), d.zero(), d.desc, gx.raw_data()),
                "softmax_backward (cuDNN)");
  check_launch("softmax_backward (cuDNN)");
}

}  // namespace tg::cuda
