// Reductions over dims. Gradient rules:
//
//   sum(x, dims)     x <- expand(g with dims kept as 1, x.shape)
//   mean(x, dims)    sum(x, dims) * (1/n): its gradient follows from sum's and mul's
//   sum_to(x, s)     x <- expand(g, x.shape)       (the adjoint of broadcasting)
#pragma once
#include <vector>

#include "core/tensor.h"

namespace tg {

// dims = {} reduces nothing (the result is x's values); sum(x) reduces every dim.
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor sum(const Tensor& x);  // every element, a 0-d tensor
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
// Sums x down to `shape`, which broadcasts to x's shape.
Tensor sum_to(const Tensor& x, const Shape& shape);

}  // namespace tg
