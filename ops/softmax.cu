#include <cmath>
#include <cstdio>
#include <type_traits>

#include "core/cuda_loops.cuh"
#include "core/cuda_reduce.cuh"
#include "ops/softmax_kernels.h"

namespace tg::cuda {

namespace {

// y = exp(x - max) / sum exp(x - max): a max sweep, a sum sweep, a write sweep;
// with the row in registers (K > 0) it is read from memory once and each exp
// is computed once.
template <class T, int K>
__global__ void softmax_forward_kernel(const T* x, T* y, int64_t rows, int64_t cols) {
  after_previous_kernels();
  const int64_t row = warp_row();
  if (row >= rows) return;
  WarpRow<T, K> r{x + row * cols, cols, static_cast<int>(threadIdx.x % 32)};
  T mx = -INFINITY;
  r.sweep([&](int k, int64_t j) { mx = nan_max(mx, r.load(k, j)); });
  mx = warp_reduce(mx, [](T a, T b) { return nan_max(a, b); });
  const bool all_masked = isinf(mx) && mx < 0;  // every key masked: the row is zeros
  const auto shifted_exp = [&](T v) { return all_masked ? T(0) : exp(v - mx); };
  T sum = 0;
  r.sweep([&](int k, int64_t j) { sum += r.transform(k, j, shifted_exp); });
  const T inv = all_masked ? T(0) : T(1) / warp_sum(sum);
  r.sweep([&](int k, int64_t j) { y[row * cols + j] = r.transformed(k, j, shifted_exp) * inv; });
}

// gx = y * (g - sum(g * y)): a dot sweep, then a write sweep.
template <class T, int K>
__global__ void softmax_backward_kernel(const T* y, const T* g, T* gx, int64_t rows, int64_t cols) {
  after_previous_kernels();
  const int64_t row = warp_row();
  if (row >= rows) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  WarpRow<T, K> yr{y + row * cols, cols, lane}, gr{g + row * cols, cols, lane};
  T dot = 0;
  yr.sweep([&](int k, int64_t j) { dot += yr.load(k, j) * gr.load(k, j); });
  dot = warp_sum(dot);
  yr.sweep([&](int k, int64_t j) { gx[row * cols + j] = yr.get(k, j) * (gr.get(k, j) - dot); });
}

// A [rows, cols, 1, 1] descriptor: cuDNN's "instance" softmax then runs over
// cols. Also holds the alpha = 1, beta = 0 scalars of the tensor's dtype.
struct RowsDescriptor {
  cudnnTensorDescriptor_t desc = nullptr;
  HostScalar one, zero;

  RowsDescriptor(const Tensor& t, int64_t rows, int64_t cols) : one(1.0, t.dtype()), zero(0.0, t.dtype()) {
    // cuDNN's legacy tensor descriptors hold at most 2^31 - 1 elements in all, not only per dimension.
    TG_CHECK(rows <= INT32_MAX && cols <= INT32_MAX && rows * cols <= INT32_MAX, "softmax (cuDNN): ", rows, " x ", cols,
             " exceeds the 2^31 - 1 elements of a cuDNN tensor (use SoftmaxImpl::Native)");
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

}  // namespace tg::cuda

namespace tg {

template <>
void SoftmaxKernels<Device::CUDA>::forward(const Tensor& x, const Tensor& y, int64_t rows, int64_t cols) {
  using namespace cuda;
  if (rows == 0) return;
  TG_DISPATCH_FLOAT(x.dtype(), T, [&] {
    with_row_registers(cols, [&](auto k) {
      launch("softmax", softmax_forward_kernel<T, decltype(k)::value>, row_blocks(rows), 32 * kRowsPerBlock, 0,
             x.data<T>(), y.data<T>(), rows, cols);
    });
  });
}

template <>
void SoftmaxKernels<Device::CUDA>::backward(const Tensor& y, const Tensor& g, const Tensor& gx, int64_t rows,
                                            int64_t cols) {
  using namespace cuda;
  if (rows == 0) return;
  TG_DISPATCH_FLOAT(y.dtype(), T, [&] {
    with_row_registers(cols, [&](auto k) {
      launch("softmax_backward", softmax_backward_kernel<T, decltype(k)::value>, row_blocks(rows), 32 * kRowsPerBlock,
             0, y.data<T>(), g.data<T>(), gx.data<T>(), rows, cols);
    });
  });
}

void cuda::softmax_forward_cudnn(const Tensor& x, const Tensor& y, int64_t rows, int64_t cols) {
  if (rows == 0) return;
  const RowsDescriptor d(x, rows, cols);
  TG_CUDA_CHECK(cudnnSoftmaxForward(cudnn(), CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_INSTANCE, d.one.get(),
                                    d.desc, x.raw_data(), d.zero.get(), d.desc, y.raw_data()),
                "softmax (cuDNN)");
  check_launch("softmax (cuDNN)");
}

void cuda::softmax_backward_cudnn(const Tensor& y, const Tensor& g, const Tensor& gx, int64_t rows, int64_t cols) {
  if (rows == 0) return;
  const RowsDescriptor d(y, rows, cols);
  TG_CUDA_CHECK(cudnnSoftmaxBackward(cudnn(), CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_INSTANCE, d.one.get(),
                                     d.desc, y.raw_data(), d.desc, g.raw_data(), d.zero.get(), d.desc, gx.raw_data()),
                "softmax_backward (cuDNN)");
  check_launch("softmax_backward (cuDNN)");
}

}  // namespace tg
