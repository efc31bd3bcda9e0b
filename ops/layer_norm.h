// Layer normalisation over the last dim (size N), with optional affine weight/bias [N].
//
//   mu = mean(x), rstd = 1/sqrt(var(x) + eps), xh = (x - mu) rstd, y = xh w + b
//   x <- rstd (gw - mean(gw) - xh mean(gw xh))   where gw = g w
//   w <- sum over rows of g xh                     b <- sum over rows of g
#pragma once
#include "core/hd.h"
#include "core/tensor.h"

namespace tg {

Tensor layer_norm(const Tensor& x, const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                  double eps = 1e-5);

struct LayerNormDims {
  int64_t rows, cols;
};

// Column c of dw and db: one thread (or CPU iteration) walks every row.
template <class T>
struct LayerNormParamGrad {
  const T *x, *g, *mean, *rstd;
  T *dw, *db;  // either may be nullptr
  LayerNormDims d;
  TG_HD void operator()(int64_t c) const {
    T acc_w = 0, acc_b = 0;
    for (int64_t r = 0; r < d.rows; ++r) {
      const T gv = g[r * d.cols + c];
      acc_w += gv * (x[r * d.cols + c] - mean[r]) * rstd[r];
      acc_b += gv;
    }
    if (dw) dw[c] = acc_w;
    if (db) db[c] = acc_b;
  }
};

template <class Loop>
void layer_norm_param_grad_with(const Loop& loop, const Tensor& x, const Tensor& g, const Tensor& mean,
                                const Tensor& rstd, const Tensor& dw, const Tensor& db, LayerNormDims d) {
  TG_DISPATCH_FLOAT(x.dtype(), T, [&] {
    loop(d.cols, LayerNormParamGrad<T>{x.data<T>(), g.data<T>(), mean.data<T>(), rstd.data<T>(),
                                       dw.defined() ? dw.data<T>() : nullptr, db.defined() ? db.data<T>() : nullptr,
                                       d});
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
