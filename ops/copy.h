// Copies that autograd tracks:
//
//   clone(x)        grad: x <- g
//   cast(x, dtype)  grad: x <- cast(g, x.dtype)
//   to_device(x, d) grad: x <- to_device(g, x.device)
#pragma once
#include <utility>

#include "core/tensor.h"

namespace tg {

Tensor clone(const Tensor& x);
Tensor cast(const Tensor& x, DType dtype);
Tensor to_device(const Tensor& x, Device device);

// a and b lie on one device and some byte is in both (one Storage, or two
// tensors over the same external buffer). copy_ reads such a source through
// a copy; the C API refuses outputs that overlap inputs.
bool bytes_overlap(const Tensor& a, const Tensor& b);
// The bytes a view can touch, [begin, end).
std::pair<const char*, const char*> byte_range(const Tensor& t);

}  // namespace tg
