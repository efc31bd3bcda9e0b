// Softmax over the last dim. A row whose every entry is -inf (all keys masked)
// gives zeros rather than NaN.
//
//   y = softmax(x)      x <- y * (g - sum(g * y, -1))
//
// On CUDA two implementations: the hand-written warp-per-row kernels (Native)
// and cuDNN's (Cudnn), selectable per call. cuDNN gives NaN for all -inf rows.
#pragma once
#include "core/tensor.h"

namespace tg {

enum class SoftmaxImpl { Native, Cudnn };

Tensor softmax(const Tensor& x, SoftmaxImpl impl = SoftmaxImpl::Native);

// Kernels on contiguous [rows, cols] data.
namespace cpu {
void softmax_forward(const Tensor& x, const Tensor& y, int64_t rows, int64_t cols);
void softmax_backward(const Tensor& y, const Tensor& g, const Tensor& gx, int64_t rows, int64_t cols);
}  // namespace cpu
namespace cuda {
void softmax_forward(const Tensor& x, const Tensor& y, int64_t rows, int64_t cols);
void softmax_backward(const Tensor& y, const Tensor& g, const Tensor& gx, int64_t rows, int64_t cols);
void softmax_forward_cudnn(const Tensor& x, const Tensor& y, int64_t rows, int64_t cols);
void softmax_backward_cudnn(const Tensor& y, const Tensor& g, const Tensor& gx, int64_t rows, int64_t cols);
}  // namespace cuda

}  // namespace tg
