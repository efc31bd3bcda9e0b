// MapArgs: the operands of an elementwise map out[i] = f(in0[i], in1[i], ...),
// each input already broadcast (expanded) to the output's shape. The CPU loop
// (core/cpu_loops.h) and the CUDA kernel (core/cuda_loops.cuh) both consume it.
#pragma once
#include <array>

#include "core/indexing.h"
#include "core/tensor.h"

namespace tg {

template <class T, int N>
struct MapArgs {
  T* out = nullptr;  // contiguous
  const T* in[N] = {};
  StridedIndexer in_idx[N];
  int64_t n = 0;
  bool contiguous = true;  // every input contiguous: index i is offset i
};

template <class T, int N>
MapArgs<T, N> make_map_args(const char* op, const Tensor& out, const std::array<Tensor, N>& ins) {
  MapArgs<T, N> a;
  a.out = out.data<T>();
  a.n = out.numel();
  Shape shape = out.shape();
  std::vector<Shape> strides;
  for (int k = 0; k < N; ++k) {
    TG_CHECK(ins[k].shape() == out.shape(), op, ": operand ", k, " of shape ", ins[k].shape(),
             " was not broadcast to the output shape ", out.shape());
    a.in[k] = ins[k].template data<T>();
    a.contiguous = a.contiguous && ins[k].is_contiguous();
    strides.push_back(ins[k].strides());
  }
  collapse_dims(shape, strides);
  for (int k = 0; k < N; ++k) a.in_idx[k] = make_indexer(op, shape, strides[k]);
  return a;
}

// Calls f with the N loaded operands of element i.
template <class T, int N, class F>
TG_HD T apply_map(const F& f, const T (&v)[N]) {
  if constexpr (N == 1) return f(v[0]);
  else if constexpr (N == 2) return f(v[0], v[1]);
  else return f(v[0], v[1], v[2]);
}

}  // namespace tg
