// Layer-norm kernels: forward and backward per device, the parameter
// gradients (column sums) written once for both.
#pragma once
#include "core/dispatch.h"
#include "core/hd.h"
#include "core/tensor.h"
#include "ops/reduce_kernels.h"

namespace tg {

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
  TG_DISPATCH_FLOAT(g.dtype(), T, [&] {
    if (dw.defined())
      column_sums_into<T>(loop, GradTimesXhat<T>{x.data<T>(), g.data<T>(), mean.data<T>(), rstd.data<T>(), d.cols},
                          d.rows, d.cols, dw.data<T>(), g.device());
    if (db.defined())
      column_sums_into<T>(loop, ReadValue<T>{g.data<T>(), d.cols}, d.rows, d.cols, db.data<T>(), g.device());
  });
}

// Contiguous [rows, cols] tensors; weight/bias and the gradients gx/dw/db may
// be undefined (a gradient not wanted is not computed).
template <Device D>
struct LayerNormKernels {
  static void forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y,
                      const Tensor& mean, const Tensor& rstd, LayerNormDims d);
  static void backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& g,
                       const Tensor& gx, const Tensor& dw, const Tensor& db, LayerNormDims d);
};

}  // namespace tg
