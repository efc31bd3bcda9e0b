// The dropout kernel, written once for both devices.
#pragma once
#include "core/dispatch.h"
#include "core/hd.h"
#include "core/pack.h"
#include "core/philox.h"
#include "core/tensor.h"

namespace tg {

// out[i] = in[i] * keep(i) * scale; with in == nullptr, out[i] = keep(i).
// The tensor is seen as rows of its last dim (`cols` long). One work item per
// Philox block: the eight columns 8q .. 8q+7 of one row (core/philox.h,
// dropout_block), so each block is computed once, and the elements move as
// aligned Quads when rows are whole quads.
template <class T>
struct DropoutApply {
  const T* in;
  const T* mask;  // nullptr: draw keep from Philox
  T* out;
  int64_t cols, blocks_per_row;
  PhiloxState rng;
  uint32_t keep_threshold;  // dropout_keep_threshold(p)
  T scale;
  bool vector;  // cols % 4 == 0 and in, mask, out Quad-aligned

  TG_HD T drawn(const Philox4& bits, int col) const { return dropout_draw(bits, col) >= keep_threshold ? T(1) : T(0); }

  TG_HD void operator()(int64_t block) const {
    const Philox4 bits = mask ? Philox4{} : philox_block(rng, static_cast<uint64_t>(block));
    const int64_t row = block / blocks_per_row, col0 = (block % blocks_per_row) * kDropoutBlockCols;
    const int64_t i0 = row * cols + col0;
    const int n = static_cast<int>(cols - col0 < kDropoutBlockCols ? cols - col0 : kDropoutBlockCols);
    if (vector) {  // n is 4 or 8
      for (int c0 = 0; c0 < n; c0 += 4) {
        const int64_t quad = (i0 + c0) / 4;
        const Quad<T> m = mask ? reinterpret_cast<const Quad<T>*>(mask)[quad] : Quad<T>{};
        const Quad<T> x = in ? reinterpret_cast<const Quad<T>*>(in)[quad] : Quad<T>{};
        Quad<T> y;
        for (int lane = 0; lane < 4; ++lane) {
          const T k = mask ? m.v[lane] : drawn(bits, c0 + lane);
          y.v[lane] = in ? x.v[lane] * k * scale : k;
        }
        reinterpret_cast<Quad<T>*>(out)[quad] = y;
      }
      return;
    }
    for (int c = 0; c < n; ++c) {
      const T k = mask ? mask[i0 + c] : drawn(bits, c);
      out[i0 + c] = in ? in[i0 + c] * k * scale : k;
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
  const int64_t rows = out.numel() / cols, blocks = (cols + kDropoutBlockCols - 1) / kDropoutBlockCols;
  TG_DISPATCH_FLOAT(out.dtype(), T, [&] {
    const T* in = data_or_null<T>(x);
    const T* m = data_or_null<T>(mask);
    const bool vector = cols % 4 == 0 && aligned16(in) && aligned16(m) && aligned16(out.data<T>());
    loop(rows * blocks, DropoutApply<T>{in, m, out.data<T>(), cols, blocks, rng,
                                       dropout_keep_threshold(static_cast<float>(p)),
                                       static_cast<T>(1.0 / (1.0 - p)), vector});
  });
}

}  // namespace tg
