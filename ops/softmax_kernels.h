// Softmax kernels on contiguous [rows, cols] data.
#pragma once
#include "core/hd.h"
#include "core/tensor.h"

namespace tg {

// max that lets a NaN through (std::max and fmaxf drop it), so a row holding
// NaN is not mistaken for a fully masked one.
template <class T>
TG_HD T nan_max(T running, T v) {
  return (v > running || v != v) ? v : running;
}

template <Device D>
struct SoftmaxKernels {
  static void forward(const Tensor& x, const Tensor& y, int64_t rows, int64_t cols);
  static void backward(const Tensor& y, const Tensor& g, const Tensor& gx, int64_t rows, int64_t cols);
};

namespace cuda {
void softmax_forward_cudnn(const Tensor& x, const Tensor& y, int64_t rows, int64_t cols);
void softmax_backward_cudnn(const Tensor& y, const Tensor& g, const Tensor& gx, int64_t rows, int64_t cols);
}  // namespace cuda

}  // namespace tg
