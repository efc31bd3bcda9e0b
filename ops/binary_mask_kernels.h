// Marks the elements of a mask that are neither 0 nor 1 (NaN included).
#pragma once
#include "core/dispatch.h"
#include "core/hd.h"
#include "core/map_args.h"
#include "core/tensor.h"

namespace tg {

template <class T>
struct NonBinary {
  TG_HD T operator()(T m) const { return (m == T(0) || m == T(1)) ? T(0) : T(1); }
};

template <Device D>
struct BinaryMaskKernels {
  static void mark_non_binary(const Tensor& mask, const Tensor& out);  // out contiguous, mask's shape
};
TG_EXTERN_CUDA_KERNELS(BinaryMaskKernels);

template <Device D>
void BinaryMaskKernels<D>::mark_non_binary(const Tensor& mask, const Tensor& out) {
  const Loop<D> loop{"check_binary_mask"};
  TG_DISPATCH_FLOAT(mask.dtype(), T, [&] { loop.map(make_map_args<T, 1>(loop.op, out, {mask}), NonBinary<T>{}); });
}

}  // namespace tg
