// Softmax over the last dim. A row whose every entry is -inf (all keys masked)
// gives zeros rather than NaN; a NaN anywhere in a row makes the row NaN.
//
//   y = softmax(x)      x <- y * (g - sum(g * y, -1))       saves y
//
// On CUDA two implementations: the hand-written warp-per-row kernels (Native)
// and cuDNN's (Cudnn), selectable per call. cuDNN gives NaN for all -inf rows.
#pragma once
#include "core/tensor.h"

namespace tg {

enum class SoftmaxImpl { Native, Cudnn };

Tensor softmax(const Tensor& x, SoftmaxImpl impl = SoftmaxImpl::Native);

}  // namespace tg
