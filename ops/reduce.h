// Reductions over dims. Gradient rules:
//
//   sum(x, dims)     x <- expand(g with dims kept as 1, x.shape)
//   mean(x, dims)    x <- expand(g with dims kept as 1, x.shape) / n
//   sum_to(x, s)     x <- expand(g, x.shape)       (the adjoint of broadcasting)
#pragma once
#include <vector>

#include "core/tensor.h"

namespace tg {

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor sum(const Tensor& x);  // every element, a 0-d tensor
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
// Sums x down to `shape`, which x's shape broadcasts from.
Tensor sum_to(const Tensor& x, const Shape& shape);

// Kernels: out[r] = sum_j x[r, j] for a contiguous x viewed as [rows, cols].
namespace cpu {
void sum_rows(const Tensor& x, const Tensor& out, int64_t rows, int64_t cols);
}
namespace cuda {
void sum_rows(const Tensor& x, const Tensor& out, int64_t rows, int64_t cols);
}

}  // namespace tg
