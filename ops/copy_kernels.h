// Copy and fill kernels, written once for both devices.
#pragma once
#include <algorithm>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/dispatch.h"
#include "core/indexing.h"
#include "core/map_args.h"
#include "core/pack.h"
#include "core/tensor.h"

namespace tg {

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
  bool dense;  // index i is offset i (a dense tensor in any dim order): no index arithmetic
  T value;
  TG_HD void operator()(int64_t i) const { dst[dense ? i : idx.offset(i)] = value; }
};

template <class T>
struct Identity {
  TG_HD T operator()(T x) const { return x; }
};

// Same-device kernels.
template <Device Dev>
struct CopyKernels {
  static void copy_strided(const Tensor& dst, const Tensor& src);
  static void fill(const Tensor& dst, double value);
};
TG_EXTERN_CUDA_KERNELS(CopyKernels);

template <Device Dev>
void CopyKernels<Dev>::copy_strided(const Tensor& dst, const Tensor& src) {
  const Loop<Dev> loop{"copy_"};
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

template <Device Dev>
void CopyKernels<Dev>::fill(const Tensor& dst, double value) {
  const Loop<Dev> loop{"fill_"};
  // Any order of the elements will do: dims by decreasing stride, so that a
  // permuted view collapses as far as its storage allows (a contiguous
  // tensor of any rank, and a permuted one, become one dim); a stride-0 dim
  // (an expanded view) is one element written once.
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (int64_t d = 0; d < dst.dim(); ++d)
    dims.emplace_back(dst.strides()[d], dst.strides()[d] == 0 ? std::min<int64_t>(dst.shape()[d], 1) : dst.shape()[d]);
  std::stable_sort(dims.begin(), dims.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  Shape shape;
  std::vector<Shape> strides(1);
  for (const auto& [stride, size] : dims) shape.push_back(size), strides[0].push_back(stride);
  collapse_dims(shape, strides);
  Shape& st = strides[0];
  // Rows of whole quads (unit inner stride, inner size and outer strides
  // multiples of 4, 16-byte aligned) are filled a Quad (4 elements, 16-byte
  // aligned) at a time: a quarter of the index arithmetic, vector stores.
  bool quads = !shape.empty() && st.back() == 1 && shape.back() % 4 == 0 && aligned16(dst.raw_data());
  for (size_t d = 0; quads && d + 1 < shape.size(); ++d) quads = st[d] % 4 == 0;
  if (quads) {
    shape.back() /= 4;
    for (size_t d = 0; d + 1 < shape.size(); ++d) st[d] /= 4;
  }
  const bool dense = shape.empty() || (shape.size() == 1 && st[0] == 1);
  const auto run = [&](auto* at, auto v) {
    using E = std::remove_cvref_t<decltype(v)>;
    loop(numel(shape), FillStrided<E>{at, make_indexer(loop.op, shape, st), dense, v});
  };
  TG_DISPATCH_FLOAT(dst.dtype(), T, [&] {
    const T x = static_cast<T>(value);
    if (quads) run(reinterpret_cast<Quad<T>*>(dst.data<T>()), Quad<T>{{x, x, x, x}});
    else run(dst.data<T>(), x);
  });
}

namespace cuda {
// dst and src contiguous, same dtype, one on each device.
void copy_between_devices(const Tensor& dst, const Tensor& src);
}

}  // namespace tg
