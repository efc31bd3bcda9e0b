// Copies that autograd tracks:
//
//   clone(x)        grad: x <- g
//   cast(x, dtype)  grad: x <- cast(g, x.dtype)
//   to_device(x, d) grad: x <- to_device(g, x.device)
#pragma once
#include "core/tensor.h"

namespace tg {

Tensor clone(const Tensor& x);
Tensor cast(const Tensor& x, DType dtype);
Tensor to_device(const Tensor& x, Device device);

}  // namespace tg
