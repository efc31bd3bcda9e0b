// masked_fill(x, mask, value): value where mask != 0, else x; mask broadcasts to x.
//
//   x <- masked_fill(g, mask, 0)     (the same kernel, applied to g; saves the mask)
#pragma once
#include "core/tensor.h"

namespace tg {

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

}  // namespace tg
