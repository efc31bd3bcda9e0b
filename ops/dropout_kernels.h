// The dropout kernel, written once for both devices.
#pragma once
#include "core/dispatch.h"
#include "core/hd.h"
#include "core/pack.h"
#include "core/philox.h"
#include "core/tensor.h"

namespace tg {

// out[i] = in[i] * keep(i) * scale; with in == nullptr, out[i] = keep(i).
// One work item per Philox block: elements 4g .. 4g+3 share block g, so each
// block is computed once (keep(i) = lane i % 4 of block i / 4 >= p), and the
// four elements are read and written as one aligned Quad.
template <class T>
struct DropoutApply {
  const T* in;
  const T* mask;  // nullptr: draw keep(i) from Philox
  T* out;
  int64_t n;
  PhiloxState rng;
  float p;
  T scale;
  bool aligned;  // in, mask and out are Quad-aligned

  TG_HD T drawn(const Philox4& bits, int lane) const { return bits_to_uniform(bits.v[lane]) >= p ? T(1) : T(0); }

  TG_HD void operator()(int64_t group) const {
    const Philox4 bits = mask ? Philox4{} : philox_block(rng, static_cast<uint64_t>(group));
    const int64_t i0 = group * 4;
    if (aligned && i0 + 3 < n) {
      const Quad<T> m = mask ? reinterpret_cast<const Quad<T>*>(mask)[group] : Quad<T>{};
      const Quad<T> x = in ? reinterpret_cast<const Quad<T>*>(in)[group] : Quad<T>{};
      Quad<T> y;
      for (int lane = 0; lane < 4; ++lane) {
        const T k = mask ? m.v[lane] : drawn(bits, lane);
        y.v[lane] = in ? x.v[lane] * k * scale : k;
      }
      reinterpret_cast<Quad<T>*>(out)[group] = y;
      return;
    }
    for (int lane = 0; lane < 4 && i0 + lane < n; ++lane) {
      const T k = mask ? mask[i0 + lane] : drawn(bits, lane);
      out[i0 + lane] = in ? in[i0 + lane] * k * scale : k;
    }
  }
};

// Contiguous x (or undefined, to write the mask itself), mask (or undefined), out.
template <Device D>
struct DropoutKernels {
  static void apply(const Tensor& x, const Tensor& mask, PhiloxState rng, double p, const Tensor& out);
};
TG_EXTERN_CUDA_KERNELS(DropoutKernels);

template <Device D>
void DropoutKernels<D>::apply(const Tensor& x, const Tensor& mask, PhiloxState rng, double p, const Tensor& out) {
  const Loop<D> loop{"dropout"};
  const int64_t n = out.numel();
  TG_DISPATCH_FLOAT(out.dtype(), T, [&] {
    const T* in = data_or_null<T>(x);
    const T* m = data_or_null<T>(mask);
    const bool aligned = aligned16(in) && aligned16(m) && aligned16(out.data<T>());
    loop((n + 3) / 4, DropoutApply<T>{in, m, out.data<T>(), n, rng, static_cast<float>(p), static_cast<T>(1.0 / (1.0 - p)),
                                      aligned});
  });
}

}  // namespace tg
