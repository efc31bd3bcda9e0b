// The dropout kernel, written once for both devices.
#pragma once
#include "core/dispatch.h"
#include "core/hd.h"
#include "core/pack.h"
#include "core/philox.h"
#include "core/tensor.h"

namespace tg {

// out[i] = in[i] * keep(i) * scale; with in == nullptr, out[i] = keep(i).
// The tensor is seen as rows of its last dim (`cols` long). One work item
// per quad of columns 4q .. 4q+3 of one row, which move as one aligned Quad
// when rows are whole quads: consecutive threads then touch consecutive 16
// bytes. A quad is half of a Philox block (core/philox.h, dropout_block), so
// the two quads of a block each draw it: twice the Philox work of one draw
// per block, which this memory-bound op hides, where items of a whole block
// (two Quads per thread, 32 bytes apart) ran at 56% of the copy bandwidth
// instead of 87% (bench/NOTES.md, version 14).
template <class T>
struct DropoutApply {
  const T* in;
  const T* mask;  // nullptr: draw keep from Philox
  T* out;
  int64_t cols, quads_per_row;
  PhiloxState rng;
  uint32_t keep_threshold;  // dropout_keep_threshold(p)
  T scale;
  bool vector;  // cols % 4 == 0 and in, mask, out Quad-aligned

  TG_HD void operator()(int64_t quad) const {
    const int64_t row = quad / quads_per_row, col0 = (quad % quads_per_row) * 4, i0 = row * cols + col0;
    const Philox4 bits = mask ? Philox4{} : philox_block(rng, dropout_block(row, col0, cols));
    const auto keep = [&](int lane) {
      return mask ? mask[i0 + lane] : (dropout_draw(bits, col0 + lane) >= keep_threshold ? T(1) : T(0));
    };
    if (vector) {
      const Quad<T> x = in ? reinterpret_cast<const Quad<T>*>(in)[i0 / 4] : Quad<T>{};
      const Quad<T> m = mask ? reinterpret_cast<const Quad<T>*>(mask)[i0 / 4] : Quad<T>{};
      Quad<T> y;
      for (int lane = 0; lane < 4; ++lane) {
        const T k = mask ? m.v[lane] : keep(lane);
        y.v[lane] = in ? x.v[lane] * k * scale : k;
      }
      reinterpret_cast<Quad<T>*>(out)[i0 / 4] = y;
      return;
    }
    for (int lane = 0; lane < 4 && col0 + lane < cols; ++lane) {
      const T k = keep(lane);
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
  const int64_t cols = out.dim() == 0 ? 1 : out.shape().back();
  if (out.numel() == 0) return;
  const int64_t rows = out.numel() / cols, quads = (cols + 3) / 4;
  TG_DISPATCH_FLOAT(out.dtype(), T, [&] {
    const T* in = data_or_null<T>(x);
    const T* m = data_or_null<T>(mask);
    const bool vector = cols % 4 == 0 && aligned16(in) && aligned16(m) && aligned16(out.data<T>());
    loop(rows * quads, DropoutApply<T>{in, m, out.data<T>(), cols, quads, rng,
                                       dropout_keep_threshold(static_cast<float>(p)),
                                       static_cast<T>(1.0 / (1.0 - p)), vector});
  });
}

}  // namespace tg
