#include "ops/softmax.h"

#include <cmath>
#include <limits>

#include "autograd/engine.h"
#include "core/cpu_loops.h"
#include "ops/softmax_kernels.h"
#include "ops/untracked.h"

namespace tg {

template <>
void SoftmaxKernels<Device::CPU>::forward(const Tensor& x, const Tensor& y, int64_t rows, int64_t cols) {
  TG_DISPATCH_FLOAT(x.dtype(), T, [&] {
    const T* in = x.data<T>();
    T* out = y.data<T>();
    cpu::parallel_for(rows, [&](int64_t r) {
      const T* xr = in + r * cols;
      T* yr = out + r * cols;
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < cols; ++j) mx = nan_max(mx, xr[j]);
      if (std::isinf(mx) && mx < 0) {  // every key masked
        for (int64_t j = 0; j < cols; ++j) yr[j] = T(0);
        return;
      }
      T total = 0;
      for (int64_t j = 0; j < cols; ++j) total += yr[j] = std::exp(xr[j] - mx);
      for (int64_t j = 0; j < cols; ++j) yr[j] /= total;
    });
  });
}

template <>
void SoftmaxKernels<Device::CPU>::backward(const Tensor& y, const Tensor& g, const Tensor& gx, int64_t rows,
                                           int64_t cols) {
  TG_DISPATCH_FLOAT(y.dtype(), T, [&] {
    const T* yp = y.data<T>();
    const T* gp = g.data<T>();
    T* out = gx.data<T>();
    cpu::parallel_for(rows, [&](int64_t r) {
      const int64_t base = r * cols;
      T dot = 0;
      for (int64_t j = 0; j < cols; ++j) dot += gp[base + j] * yp[base + j];
      for (int64_t j = 0; j < cols; ++j) out[base + j] = yp[base + j] * (gp[base + j] - dot);
    });
  });
}

namespace {

void forward_kernel([[maybe_unused]] SoftmaxImpl impl, const Tensor& x, const Tensor& y, int64_t rows, int64_t cols) {
#ifdef TG_CUDA
  if (impl == SoftmaxImpl::Cudnn && x.is_cuda()) return cuda::softmax_forward_cudnn(x, y, rows, cols);
#endif
  TG_DISPATCH_DEVICE(x, SoftmaxKernels, forward, x, y, rows, cols);
}

void backward_kernel([[maybe_unused]] SoftmaxImpl impl, const Tensor& y, const Tensor& g, const Tensor& gx, int64_t rows,
                     int64_t cols) {
#ifdef TG_CUDA
  if (impl == SoftmaxImpl::Cudnn && y.is_cuda()) return cuda::softmax_backward_cudnn(y, g, gx, rows, cols);
#endif
  TG_DISPATCH_DEVICE(y, SoftmaxKernels, backward, y, g, gx, rows, cols);
}

}  // namespace

Tensor softmax(const Tensor& x_in, SoftmaxImpl impl) {
  check_defined("softmax", "x", x_in);
  TG_CHECK(x_in.dim() >= 1, "softmax: x must have at least one dim, got shape ", x_in.shape());
  TG_CHECK(impl == SoftmaxImpl::Native || x_in.is_cuda(), "softmax: the cuDNN implementation needs a "
           "CUDA tensor, got a ", x_in.device(), " tensor of shape ", x_in.shape());
  const Tensor x = materialize(x_in);
  const int64_t cols = x.shape().back(), rows = cols ? x.numel() / cols : 0;
  Tensor y = empty(x.shape(), {x.dtype(), x.device()});
  forward_kernel(impl, x, y, rows, cols);
  return autograd::record(OpId::softmax, y, {x_in}, {y}, [impl, rows, cols](const Tensor& g, const auto& s, const auto&) {
    const Tensor& y = s[0];
    Tensor gx = empty(y.shape(), {y.dtype(), y.device()});
    backward_kernel(impl, y, materialize(g), gx, rows, cols);
    return std::vector<Tensor>{gx};
  });
}

}  // namespace tg
