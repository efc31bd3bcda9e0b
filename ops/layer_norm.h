// Layer normalisation over the last dim (size N), with optional affine weight/bias [N].
//
//   mu = mean(x), rstd = 1/sqrt(var(x) + eps), xh = (x - mu) rstd, y = xh w + b
//   x <- rstd (gw - mean(gw) - xh mean(gw xh))   where gw = g w
//   w <- sum over rows of g xh                     b <- sum over rows of g
//   saves x, mu and rstd when dx or dw is wanted, w when dx is
#pragma once
#include "core/tensor.h"

namespace tg {

Tensor layer_norm(const Tensor& x, const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                  double eps = 1e-5);

}  // namespace tg
