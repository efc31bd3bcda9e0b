#include "ops/layer_norm.h"

#include <cmath>

#include "autograd/engine.h"
#include "core/cpu_loops.h"
#include "ops/layer_norm_kernels.h"
#include "ops/untracked.h"

namespace tg {

template <>
void LayerNormKernels<Device::CPU>::forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd, LayerNormDims d) {
  TG_DISPATCH_FLOAT(x.dtype(), T, [&] {
    const T *xp = x.data<T>(), *wp = data_or_null<T>(w), *bp = data_or_null<T>(b);
    T *yp = y.data<T>(), *mp = mean.data<T>(), *rp = rstd.data<T>();
    cpu::parallel_for(d.rows, [&](int64_t r) {
      const T* xr = xp + r * d.cols;
      double mu = 0, var = 0;
      for (int64_t c = 0; c < d.cols; ++c) mu += xr[c];
      mu /= d.cols;
      for (int64_t c = 0; c < d.cols; ++c) var += (xr[c] - mu) * (xr[c] - mu);
      const double rs = 1.0 / std::sqrt(var / d.cols + eps);
      for (int64_t c = 0; c < d.cols; ++c) {
        const T xh = static_cast<T>((xr[c] - mu) * rs);
        yp[r * d.cols + c] = xh * (wp ? wp[c] : T(1)) + (bp ? bp[c] : T(0));
      }
      mp[r] = static_cast<T>(mu);
      rp[r] = static_cast<T>(rs);
    });
  });
}

template <>
void LayerNormKernels<Device::CPU>::backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                                             const Tensor& g, const Tensor& gx, const Tensor& dw, const Tensor& db,
                                             LayerNormDims d) {
  if (gx.defined()) TG_DISPATCH_FLOAT(x.dtype(), T, [&] {
    const T *xp = x.data<T>(), *wp = data_or_null<T>(w), *gp = g.data<T>();
    const T *mp = mean.data<T>(), *rp = rstd.data<T>();
    T* out = gx.data<T>();
    cpu::parallel_for(d.rows, [&](int64_t r) {
      const int64_t base = r * d.cols;
      double mean_gw = 0, mean_gw_xh = 0;
      for (int64_t c = 0; c < d.cols; ++c) {
        const double gw = gp[base + c] * (wp ? wp[c] : T(1));
        mean_gw += gw;
        mean_gw_xh += gw * (xp[base + c] - mp[r]) * rp[r];
      }
      mean_gw /= d.cols;
      mean_gw_xh /= d.cols;
      for (int64_t c = 0; c < d.cols; ++c) {
        const double gw = gp[base + c] * (wp ? wp[c] : T(1)), xh = (xp[base + c] - mp[r]) * rp[r];
        out[base + c] = static_cast<T>(rp[r] * (gw - mean_gw - xh * mean_gw_xh));
      }
    });
  });
  layer_norm_param_grad_with(Loop<Device::CPU>{"layer_norm_backward"}, x, g, mean, rstd, dw, db, d);
}

namespace {
void check_affine(const char* arg, const Tensor& p, const Tensor& x) {
  if (!p.defined()) return;
  check_same_dtype_device("layer_norm", x, p);
  TG_CHECK(p.shape() == Shape{x.shape().back()}, "layer_norm: ", arg, " must be [", x.shape().back(),
           "] for x ", x.shape(), ", got ", p.shape());
}
}  // namespace

Tensor layer_norm(const Tensor& x_in, const Tensor& w, const Tensor& b, double eps) {
  check_defined("layer_norm", "x", x_in);
  TG_CHECK(x_in.dim() >= 1 && x_in.shape().back() > 0, "layer_norm: x must have a non-empty last dim, got ",
           x_in.shape());
  TG_CHECK(eps > 0, "layer_norm: eps must be positive, got ", eps);
  check_affine("weight", w, x_in);
  check_affine("bias", b, x_in);
  const Tensor x = materialize(x_in);
  const LayerNormDims d{x.numel() / x.shape().back(), x.shape().back()};
  const TensorOptions opts{x.dtype(), x.device()};
  Tensor y = empty(x.shape(), opts), mean = empty({d.rows}, opts), rstd = empty({d.rows}, opts);
  const Tensor wc = w.defined() ? materialize(w) : w, bc = b.defined() ? materialize(b) : b;
  TG_DISPATCH_DEVICE(x, LayerNormKernels, forward, x, wc, bc, eps, y, mean, rstd, d);
  const autograd::GradMask m = autograd::grad_mask({x_in, w, b});
  const bool reads_xhat = m[0] || m[1];  // db needs only g
  using autograd::keep_if;
  return autograd::record(OpId::layer_norm, y, {x_in, w, b},
                          {keep_if(reads_xhat, x), keep_if(m[0], wc), keep_if(reads_xhat, mean), keep_if(reads_xhat, rstd)},
                          [d](const Tensor& g, const auto& s, const autograd::GradMask& needs) {
    const TensorOptions opts{g.dtype(), g.device()};
    const Tensor gx = needs[0] ? empty(s[0].shape(), opts) : Tensor();
    const Tensor dw = needs[1] ? empty({d.cols}, opts) : Tensor(), db = needs[2] ? empty({d.cols}, opts) : Tensor();
    TG_DISPATCH_DEVICE(g, LayerNormKernels, backward, s[0], s[1], s[2], s[3], materialize(g), gx, dw, db, d);
    return std::vector<Tensor>{gx, dw, db};
  });
}

}  // namespace tg
