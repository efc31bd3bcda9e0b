// Copies: strided copy with dtype cast, fill, and moves between devices.
//
//   clone(x)        grad: x <- g
//   cast(x, dtype)  grad: x <- cast(g, x.dtype)
//   to_device(x, d) grad: x <- to_device(g, x.device)
#pragma once
#include "core/indexing.h"
#include "core/map_args.h"
#include "core/tensor.h"

namespace tg {

Tensor clone(const Tensor& x);
Tensor cast(const Tensor& x, DType dtype);
Tensor to_device(const Tensor& x, Device device);

// Untracked kernels behind the ops above and the in-place methods.
void copy_into(const Tensor& dst, const Tensor& src);  // same shape; any dtypes and devices
void fill_into(const Tensor& dst, double value);
// x itself when contiguous, else an untracked contiguous copy (for kernels).
Tensor materialize(const Tensor& x);

template <class D, class S>
struct CopyStrided {
  D* dst;
  const S* src;
  StridedIndexer dst_idx, src_idx;
  TG_HD void operator()(int64_t i) const { dst[dst_idx.offset(i)] = static_cast<D>(src[src_idx.offset(i)]); }
};

template <class T>
struct FillStrided {
  T* dst;
  StridedIndexer idx;
  bool contiguous;  // index i is offset i: no index arithmetic
  T value;
  TG_HD void operator()(int64_t i) const { dst[contiguous ? i : idx.offset(i)] = value; }
};

// Device-generic launchers: `loop` is cpu::Loop or cuda::Loop.
template <class T>
struct Identity {
  TG_HD T operator()(T x) const { return x; }
};

template <class Loop>
void copy_strided_with(const Loop& loop, const Tensor& dst, const Tensor& src) {
  if (dst.is_contiguous() && dst.dtype() == src.dtype()) {  // a gather: the packed map path
    TG_DISPATCH_FLOAT(dst.dtype(), T, [&] { loop.map(make_map_args<T, 1>(loop.op, dst, {src}), Identity<T>{}); });
    return;
  }
  Shape shape = dst.shape();
  std::vector<Shape> strides = {dst.strides(), src.strides()};
  collapse_dims(shape, strides);
  const StridedIndexer di = make_indexer(loop.op, shape, strides[0]), si = make_indexer(loop.op, shape, strides[1]);
  TG_DISPATCH_FLOAT(dst.dtype(), D, [&] {
    TG_DISPATCH_FLOAT(src.dtype(), S, [&] { loop(dst.numel(), CopyStrided<D, S>{dst.data<D>(), src.data<S>(), di, si}); });
  });
}

template <class Loop>
void fill_with(const Loop& loop, const Tensor& dst, double value) {
  TG_DISPATCH_FLOAT(dst.dtype(), T, [&] {
    loop(dst.numel(), FillStrided<T>{dst.data<T>(), make_indexer(loop.op, dst.shape(), dst.strides()),
                                     dst.is_contiguous(), static_cast<T>(value)});
  });
}

namespace cpu {
void copy_strided(const Tensor& dst, const Tensor& src);  // same device
void fill(const Tensor& dst, double value);
}  // namespace cpu
namespace cuda {
void copy_strided(const Tensor& dst, const Tensor& src);
void fill(const Tensor& dst, double value);
// dst and src contiguous, same dtype, one on each device.
void copy_between_devices(const Tensor& dst, const Tensor& src);
}  // namespace cuda

}  // namespace tg
