// Layer normalisation over the last dim (size N), with optional affine weight/bias [N].
//
//   mu = mean(x), rstd = 1/sqrt(var(x) + eps), xh = (x - mu) rstd, y = xh w + b
//   x <- rstd (gw - mean(gw) - xh mean(gw xh))   where gw = g w
//   w <- sum over rows of g xh                     b <- sum over rows of g
#pragma once
#include "core/hd.h"
#include "core/tensor.h"
#include "ops/reduce.h"

namespace tg {

Tensor layer_norm(const Tensor& x, const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                  double eps = 1e-5);

struct LayerNormDims {
  int64_t rows, cols;
};

// dw[c] = sum_r g[r,c] xh[r,c] and db[c] = sum_r g[r,c], as two-stage column sums.
template <class T>
struct GradTimesXhat {
  const T *x, *g, *mean, *rstd;
  int64_t cols;
  TG_HD T operator()(int64_t r, int64_t c) const { return g[r * cols + c] * (x[r * cols + c] - mean[r]) * rstd[r]; }
};

template <class Loop>
void layer_norm_param_grad_with(const Loop& loop, const Tensor& x, const Tensor& g, const Tensor& mean,
                                const Tensor& rstd, const Tensor& dw, const Tensor& db, LayerNormDims d) {
  TG_DISPATCH_FLOAT(x.dtype(), T, [&] {
    if (dw.defined())
      column_sums_with(loop, GradTimesXhat<T>{x.data<T>(), g.data<T>(), mean.data<T>(), rstd.data<T>(), d.cols}, d.rows,
                       d.cols, dw.data<T>(), x.device());
    if (db.defined()) column_sums_with(loop, ReadValue<T>{g.data<T>(), d.cols}, d.rows, d.cols, db.data<T>(), x.device());
  });
}

// Contiguous [rows, cols] tensors; weight/bias/dw/db may be undefined.
namespace cpu {
void layer_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd, LayerNormDims d);
void layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                         const Tensor& g, const Tensor& gx, const Tensor& dw, const Tensor& db, LayerNormDims d);
}  // namespace cpu
namespace cuda {
void layer_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd, LayerNormDims d);
void layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                         const Tensor& g, const Tensor& gx, const Tensor& dw, const Tensor& db, LayerNormDims d);
}  // namespace cuda

}  // namespace tg
