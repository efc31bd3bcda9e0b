// The random fills, written once for both devices: one work item per Philox
// block, which makes four uniforms or two normals (core/philox.h), so a block
// is computed once, not once per element it feeds.
#pragma once
#include "core/dispatch.h"
#include "core/hd.h"
#include "core/philox.h"
#include "core/tensor.h"

namespace tg {

// out[i] = philox_uniform(s, i): lane i % 4 of block i / 4.
template <class T>
struct UniformBlock {
  T* out;
  int64_t n;
  PhiloxDraw draw;
  TG_HD void operator()(int64_t block) const {
    const Philox4 r = philox_block(draw, static_cast<uint64_t>(block));
    TG_UNROLL(4)
    for (int lane = 0; lane < 4; ++lane)
      if (4 * block + lane < n) out[4 * block + lane] = static_cast<T>(bits_to_uniform(r.v[lane]));
  }
};

// out[i] = philox_normal(s, i): lanes 0, 1 of block i / 2 for an even i, 2, 3 for an odd one.
template <class T>
struct NormalBlock {
  T* out;
  int64_t n;
  PhiloxDraw draw;
  TG_HD void operator()(int64_t block) const {
    const Philox4 r = philox_block(draw, static_cast<uint64_t>(block));
    out[2 * block] = static_cast<T>(box_muller(r.v[0], r.v[1]));
    if (2 * block + 1 < n) out[2 * block + 1] = static_cast<T>(box_muller(r.v[2], r.v[3]));
  }
};

// dst contiguous.
template <Device D>
struct RandomKernels {
  static void uniform(const Tensor& dst, PhiloxState state);
  static void normal(const Tensor& dst, PhiloxState state);
};
TG_EXTERN_CUDA_KERNELS(RandomKernels);

template <Device D>
void RandomKernels<D>::uniform(const Tensor& dst, PhiloxState state) {
  const int64_t n = dst.numel();
  TG_DISPATCH_FLOAT(dst.dtype(), T, [&] {
    Loop<D>{"rand"}((n + 3) / 4, UniformBlock<T>{dst.data<T>(), n, philox_draw(state)});
  });
}

template <Device D>
void RandomKernels<D>::normal(const Tensor& dst, PhiloxState state) {
  const int64_t n = dst.numel();
  TG_DISPATCH_FLOAT(dst.dtype(), T, [&] {
    Loop<D>{"randn"}((n + 1) / 2, NormalBlock<T>{dst.data<T>(), n, philox_draw(state)});
  });
}

}  // namespace tg
