// Mean squared error, reduced to a 0-d tensor:
//
//   L = mean((a - b)^2)      a <- g 2 (a - b) / n      b <- -g 2 (a - b) / n
#pragma once
#include "core/hd.h"
#include "core/map_args.h"
#include "core/tensor.h"

namespace tg {

Tensor mse_loss(const Tensor& a, const Tensor& b);

template <class T>
struct SquaredDiff {
  TG_HD T operator()(T a, T b) const { return (a - b) * (a - b); }
};

template <class T>
struct MseGrad {  // (a, b, g) -> dL/da
  T two_over_n;
  TG_HD T operator()(T a, T b, T g) const { return g * two_over_n * (a - b); }
};

template <class Loop>
void mse_forward_with(const Loop& loop, const Tensor& a, const Tensor& b, const Tensor& sq) {
  TG_DISPATCH_FLOAT(a.dtype(), T, [&] { loop.map(make_map_args<T, 2>(loop.op, sq, {a, b}), SquaredDiff<T>{}); });
}

template <class Loop>
void mse_backward_with(const Loop& loop, const Tensor& a, const Tensor& b, const Tensor& g, const Tensor& ga) {
  TG_DISPATCH_FLOAT(a.dtype(), T, [&] {
    loop.map(make_map_args<T, 3>(loop.op, ga, {a, b, g}), MseGrad<T>{static_cast<T>(2.0 / a.numel())});
  });
}

// sq = (a - b)^2 elementwise; ga = 2 (a - b) g / n with g broadcast to a's shape.
namespace cpu {
void mse_forward(const Tensor& a, const Tensor& b, const Tensor& sq);
void mse_backward(const Tensor& a, const Tensor& b, const Tensor& g, const Tensor& ga);
}  // namespace cpu
namespace cuda {
void mse_forward(const Tensor& a, const Tensor& b, const Tensor& sq);
void mse_backward(const Tensor& a, const Tensor& b, const Tensor& g, const Tensor& ga);
}  // namespace cuda

}  // namespace tg
