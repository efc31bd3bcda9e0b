// The masked_fill kernel, written once for both devices.
#pragma once
#include "core/dispatch.h"
#include "core/hd.h"
#include "core/map_args.h"
#include "core/tensor.h"

namespace tg {

template <class T>
struct MaskedFill {
  T value;
  TG_HD T operator()(T x, T mask) const { return mask != T(0) ? value : x; }
};

// x and mask already broadcast to out's shape.
template <Device D>
struct MaskedFillKernels {
  static void masked_fill(const Tensor& x, const Tensor& mask, double value, const Tensor& out);
};
TG_EXTERN_CUDA_KERNELS(MaskedFillKernels);

template <Device D>
void MaskedFillKernels<D>::masked_fill(const Tensor& x, const Tensor& mask, double value, const Tensor& out) {
  const Loop<D> loop{"masked_fill"};
  TG_DISPATCH_FLOAT(x.dtype(), T, [&] {
    loop.map(make_map_args<T, 2>(loop.op, out, {x, mask}), MaskedFill<T>{static_cast<T>(value)});
  });
}

}  // namespace tg
