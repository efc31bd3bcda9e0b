// The mean-squared-error kernels, written once for both devices.
#pragma once
#include "core/dispatch.h"
#include "core/hd.h"
#include "core/map_args.h"
#include "core/tensor.h"

namespace tg {

template <class T>
struct SquaredDiff {
  TG_HD T operator()(T a, T b) const { return (a - b) * (a - b); }
};

template <class T>
struct MseGrad {  // (a, b, g) -> dL/da
  T two_over_n;
  TG_HD T operator()(T a, T b, T g) const { return g * two_over_n * (a - b); }
};

// sq = (a - b)^2 elementwise; ga = 2 (a - b) g / n with g broadcast to a's shape.
template <Device D>
struct MseKernels {
  static void forward(const Tensor& a, const Tensor& b, const Tensor& sq);
  static void backward(const Tensor& a, const Tensor& b, const Tensor& g, const Tensor& ga);
};
TG_EXTERN_CUDA_KERNELS(MseKernels);

template <Device D>
void MseKernels<D>::forward(const Tensor& a, const Tensor& b, const Tensor& sq) {
  const Loop<D> loop{"mse_loss"};
  TG_DISPATCH_FLOAT(a.dtype(), T, [&] { loop.map(make_map_args<T, 2>(loop.op, sq, {a, b}), SquaredDiff<T>{}); });
}

template <Device D>
void MseKernels<D>::backward(const Tensor& a, const Tensor& b, const Tensor& g, const Tensor& ga) {
  const Loop<D> loop{"mse_loss_backward"};
  TG_DISPATCH_FLOAT(a.dtype(), T, [&] {
    loop.map(make_map_args<T, 3>(loop.op, ga, {a, b, g}), MseGrad<T>{static_cast<T>(2.0 / a.numel())});
  });
}

}  // namespace tg
