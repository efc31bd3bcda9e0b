// MapArgs: the operands of an elementwise map out[i] = f(in0[i], in1[i], ...),
// each input already broadcast (expanded) to the output's shape. The CPU loop
// (core/cpu_loops.h) and the CUDA kernel (core/cuda_loops.cuh) both consume it.
#pragma once
#include <array>

#include "core/indexing.h"
#include "core/pack.h"
#include "core/tensor.h"

namespace tg {

// How an operand is read in runs of consecutive elements (see cuda::map_kernel).
enum class RunKind : int8_t {
  Vector,     // contiguous and 16-byte aligned: one vector load per run
  Stride1,    // elements of a run are consecutive in memory
  Broadcast,  // every element of a run is the same element (stride 0)
  Gather,     // none of these: an offset per element
};

template <class T, int N>
struct MapArgs {
  T* out = nullptr;  // contiguous
  const T* in[N] = {};
  StridedIndexer in_idx[N];
  bool in_contiguous[N] = {};  // index i is offset i
  RunKind run[N] = {};         // for runs of 16 bytes that stay inside the innermost dim
  int64_t inner = 1;           // size of the innermost collapsed dim
  int64_t n = 0;
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
    a.in_contiguous[k] = ins[k].is_contiguous();
    strides.push_back(ins[k].strides());
  }
  collapse_dims(shape, strides);
  a.inner = shape.empty() ? 1 : shape.back();
  for (int k = 0; k < N; ++k) {
    a.in_idx[k] = make_indexer(op, shape, strides[k]);
    const int64_t inner_stride = shape.empty() ? 1 : strides[k].back();
    a.run[k] = a.in_contiguous[k] && aligned16(a.in[k]) ? RunKind::Vector
               : inner_stride == 1           ? RunKind::Stride1
               : inner_stride == 0           ? RunKind::Broadcast
                                             : RunKind::Gather;
  }
  return a;
}

// Operand k of element i, by the cheapest addressing it allows.
template <class T, int N>
TG_HD T load_operand(const MapArgs<T, N>& a, int k, int64_t i) {
  return a.in[k][a.in_contiguous[k] ? i : a.in_idx[k].offset(i)];
}

// Calls f with the N loaded operands of element i.
template <class T, int N, class F>
TG_HD T apply_map(const F& f, const T (&v)[N]) {
  if constexpr (N == 1) return f(v[0]);
  else if constexpr (N == 2) return f(v[0], v[1]);
  else return f(v[0], v[1], v[2]);
}

}  // namespace tg
