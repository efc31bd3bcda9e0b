// View ops: new shape/strides over the same storage, no copy (contiguous()
// copies only when it must). Gradient rules:
//
//   view/reshape(x, s)    x <- reshape(g, x.shape)
//   permute(x, p)         x <- permute(g, inverse(p))
//   transpose(x, i, j)    x <- transpose(g, i, j)
//   narrow(x, d, s, n)    x <- zeros(x.shape) with g written into [s, s+n) of dim d
//   expand(x, s)          x <- sum_to(g, x.shape)
//   unsqueeze(x, d)       x <- reshape(g, x.shape)
//   squeeze(x, d)         x <- reshape(g, x.shape)
//   contiguous(x)         x <- g
#pragma once
#include <vector>

#include "core/tensor.h"

namespace tg {

Tensor view(const Tensor& x, const Shape& shape);     // x must be contiguous
Tensor reshape(const Tensor& x, const Shape& shape);  // copies only when x is not contiguous
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor expand(const Tensor& x, const Shape& shape);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x, int64_t dim);  // dim must have size 1
Tensor contiguous(const Tensor& x);

}  // namespace tg
