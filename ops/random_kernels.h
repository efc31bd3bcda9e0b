// The random fills, written once for both devices: one work item per Philox
// block, which makes four uniforms or two normals (core/philox.h), so a block
// is computed once, not once per element it feeds.
#pragma once
#include "core/dispatch.h"
#include "core/hd.h"
#include "core/philox.h"
#include "core/tensor.h"

namespace tg {

// The two distributions, by their draws of one block (core/philox.h).
struct Uniforms {
  static constexpr int kPerBlock = kUniformsPerBlock;
  TG_HD static double draw(const Philox4& r, int k) { return block_uniform(r, k); }
};
struct Normals {
  static constexpr int kPerBlock = kNormalsPerBlock;
  TG_HD static double draw(const Philox4& r, int k) { return block_normal(r, k); }
};

// out[i] for the elements i of one block: kPerBlock * block + k, k < kPerBlock, i < n.
template <class T, class Draws>
struct FillFromBlock {
  T* out;
  int64_t n;
  PhiloxDraw draw;
  TG_HD void operator()(int64_t block) const {
    const Philox4 r = philox_block(draw, static_cast<uint64_t>(block));
    TG_UNROLL(Draws::kPerBlock)
    for (int k = 0; k < Draws::kPerBlock; ++k) {  // unrolled: r.v's lanes stay in registers on the GPU
      const int64_t i = Draws::kPerBlock * block + k;
      if (i < n) out[i] = static_cast<T>(Draws::draw(r, k));
    }
  }
};

template <class Draws, Device D>
void fill_from_blocks(const char* op, const Tensor& dst, PhiloxState state) {
  const int64_t n = dst.numel(), blocks = (n + Draws::kPerBlock - 1) / Draws::kPerBlock;
  TG_DISPATCH_FLOAT(dst.dtype(), T, [&] {
    Loop<D>{op}(blocks, FillFromBlock<T, Draws>{dst.data<T>(), n, philox_draw(state)});
  });
}

// dst contiguous.
template <Device D>
struct RandomKernels {
  static void uniform(const Tensor& dst, PhiloxState state);
  static void normal(const Tensor& dst, PhiloxState state);
};
TG_EXTERN_CUDA_KERNELS(RandomKernels);

template <Device D>
void RandomKernels<D>::uniform(const Tensor& dst, PhiloxState state) {
  fill_from_blocks<Uniforms, D>("rand", dst, state);
}

template <Device D>
void RandomKernels<D>::normal(const Tensor& dst, PhiloxState state) {
  fill_from_blocks<Normals, D>("randn", dst, state);
}

}  // namespace tg
