// masked_fill(x, mask, value): value where mask != 0, else x; mask broadcasts to x.
//
//   x <- masked_fill(g, mask, 0)     (the same kernel, applied to g)
#pragma once
#include "core/hd.h"
#include "core/map_args.h"
#include "core/tensor.h"

namespace tg {

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

template <class T>
struct MaskedFill {
  T value;
  TG_HD T operator()(T x, T mask) const { return mask != T(0) ? value : x; }
};

template <class Loop>
void masked_fill_with(const Loop& loop, const Tensor& x, const Tensor& mask, double value, const Tensor& out) {
  TG_DISPATCH_FLOAT(x.dtype(), T, [&] {
    loop.map(make_map_args<T, 2>(loop.op, out, {x, mask}), MaskedFill<T>{static_cast<T>(value)});
  });
}

// x and mask already broadcast to out's shape.
namespace cpu {
void masked_fill(const Tensor& x, const Tensor& mask, double value, const Tensor& out);
}
namespace cuda {
void masked_fill(const Tensor& x, const Tensor& mask, double value, const Tensor& out);
}

}  // namespace tg
