// Dropout: y = x * keep / (1 - p). The keep mask is either regenerated from
// Philox (seed, offset, element index) — never stored — or given explicitly as
// a 0/1 tensor. Dropout is linear in x, so its backward is the same op on g:
//
//   x <- g * keep / (1 - p)
//
// p = 0 is the identity. The CUDA kernel draws the same mask bit for bit.
#pragma once
#include <optional>

#include "core/hd.h"
#include "core/philox.h"
#include "core/tensor.h"

namespace tg {

struct DropoutOptions {
  double p = 0.0;
  std::optional<PhiloxState> rng;  // the draw to use; none = next draw of the default generator
  Tensor mask;                     // explicit 0/1 keep mask of x's shape; wins over rng
};

Tensor dropout(const Tensor& x, const DropoutOptions& options);
// The 0/1 keep mask that dropout(x, {p, state}) applies to a tensor of `shape`.
Tensor dropout_mask(const Shape& shape, double p, PhiloxState state, TensorOptions opts = {});

// out[i] = in[i] * keep(i) * scale; with in == nullptr, out[i] = keep(i).
// One work item per Philox block: elements 4g .. 4g+3 share block g, so each
// block is computed once (keep(i) = lane i % 4 of block i / 4 >= p).
template <class T>
struct DropoutApply {
  const T* in;
  const T* mask;  // nullptr: draw keep(i) from Philox
  T* out;
  int64_t n;
  PhiloxState rng;
  float p;
  T scale;
  TG_HD void operator()(int64_t group) const {
    const Philox4 bits = mask ? Philox4{} : philox_block(rng, static_cast<uint64_t>(group));
    for (int lane = 0; lane < 4; ++lane) {
      const int64_t i = group * 4 + lane;
      if (i >= n) return;
      const T keep = mask ? mask[i] : (bits_to_uniform(bits.v[lane]) >= p ? T(1) : T(0));
      out[i] = in ? in[i] * keep * scale : keep;
    }
  }
};

template <class Loop>
void dropout_with(const Loop& loop, const Tensor& x, const Tensor& mask, PhiloxState rng, double p,
                  const Tensor& out) {
  const int64_t n = out.numel();
  TG_DISPATCH_FLOAT(out.dtype(), T, [&] {
    loop((n + 3) / 4, DropoutApply<T>{x.defined() ? x.data<T>() : nullptr, mask.defined() ? mask.data<T>() : nullptr,
                                      out.data<T>(), n, rng, static_cast<float>(p), static_cast<T>(1.0 / (1.0 - p))});
  });
}

// Contiguous x (or undefined, to write the mask itself), mask, out.
namespace cpu {
void dropout(const Tensor& x, const Tensor& mask, PhiloxState rng, double p, const Tensor& out);
}
namespace cuda {
void dropout(const Tensor& x, const Tensor& mask, PhiloxState rng, double p, const Tensor& out);
}

}  // namespace tg
