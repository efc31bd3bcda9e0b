// Mean squared error, reduced to a 0-d tensor:
//
//   L = mean((a - b)^2)      a <- g 2 (a - b) / n      b <- -g 2 (a - b) / n      saves a, b
#pragma once
#include "core/tensor.h"

namespace tg {

Tensor mse_loss(const Tensor& a, const Tensor& b);

}  // namespace tg
