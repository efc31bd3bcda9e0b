// CUDA loops: for_each over element indices (grid-stride) and map for
// elementwise maps, with 16-byte vector loads when every operand is
// contiguous and aligned. The CPU twins are in core/cpu_loops.h.
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/cuda_context.h"
#include "core/cuda_launch.cuh"
#include "core/dispatch.h"
#include "core/map_args.h"
#include "core/pack.h"

namespace tg::cuda {

constexpr int kThreads = 256;

inline int grid_for(int64_t work_items) {
  const int64_t cap = static_cast<int64_t>(context().sm_count) * 32;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((work_items + kThreads - 1) / kThreads, cap)));
}

template <class F>
__global__ void for_each_kernel(int64_t n, F f) {
  after_previous_kernels();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    f(i);
}

template <class F>
void for_each(const char* op, int64_t n, const F& f) {
  if (n == 0) return;
  launch(op, for_each_kernel<F>, grid_for(n), kThreads, 0, n, f);
}

// Loads operand k of elements i0 .. i0+V-1, which lie in one innermost row.
template <class T, int N, int V>
__device__ __forceinline__ void load_run(const MapArgs<T, N>& a, int k, int64_t i0, T (&out)[V]) {
  switch (a.run[k]) {
    case RunKind::Vector: {
      const Pack<T, V> p = reinterpret_cast<const Pack<T, V>*>(a.in[k])[i0 / V];
#pragma unroll
      for (int j = 0; j < V; ++j) out[j] = p.v[j];
      return;
    }
    case RunKind::Stride1: {
      const T* base = a.in[k] + (a.in_contiguous[k] ? i0 : a.in_idx[k].offset(i0));
#pragma unroll
      for (int j = 0; j < V; ++j) out[j] = base[j];
      return;
    }
    case RunKind::Broadcast: {
      const T v = a.in[k][a.in_idx[k].offset(i0)];
#pragma unroll
      for (int j = 0; j < V; ++j) out[j] = v;
      return;
    }
    case RunKind::Gather:
#pragma unroll
      for (int j = 0; j < V; ++j) out[j] = load_operand(a, k, i0 + j);
      return;
  }
}

// Packed path: each thread makes 16 bytes of output per step (one vector
// store), reading each operand by its RunKind, so one index computation serves
// V elements. kAllVector compiles the common all-contiguous case without the
// per-operand switch, so its loads issue back to back.
template <bool kAllVector, class T, int N, class F>
__device__ __forceinline__ void packed_loop(const MapArgs<T, N>& a, const F& f, int64_t tid, int64_t stride) {
  constexpr int V = 16 / sizeof(T);
  for (int64_t p = tid; p < a.n / V; p += stride) {
    T in[N][V];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      if constexpr (kAllVector) {
        const Pack<T, V> v = reinterpret_cast<const Pack<T, V>*>(a.in[k])[p];
#pragma unroll
        for (int j = 0; j < V; ++j) in[k][j] = v.v[j];
      } else {
        load_run(a, k, p * V, in[k]);
      }
    }
    Pack<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      T v[N];
#pragma unroll
      for (int k = 0; k < N; ++k) v[k] = in[k][j];
      out.v[j] = apply_map<T, N>(f, v);
    }
    reinterpret_cast<Pack<T, V>*>(a.out)[p] = out;
  }
}

enum class MapPath { AllVector, Packed, Scalar };

// The tail past the last whole pack, and the scalar path, go element by element.
template <class T, int N, class F>
__global__ void map_kernel(MapArgs<T, N> a, F f, MapPath path) {
  after_previous_kernels();
  constexpr int V = 16 / sizeof(T);
  const int64_t tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  if (path == MapPath::AllVector) packed_loop<true>(a, f, tid, stride);
  if (path == MapPath::Packed) packed_loop<false>(a, f, tid, stride);
  for (int64_t i = (path == MapPath::Scalar ? 0 : a.n / V * V) + tid; i < a.n; i += stride) {
    T v[N];
    for (int k = 0; k < N; ++k) v[k] = load_operand(a, k, i);
    a.out[i] = apply_map<T, N>(f, v);
  }
}

// Packs need an aligned output and runs that never cross an innermost row.
template <class T, int N>
MapPath choose_path(const MapArgs<T, N>& a) {
  constexpr int V = 16 / sizeof(T);
  if (!aligned16(a.out)) return MapPath::Scalar;
  bool all_vector = true;
  for (int k = 0; k < N; ++k) {
    all_vector = all_vector && a.run[k] == RunKind::Vector;
    if (a.run[k] != RunKind::Vector && a.inner % V != 0) return MapPath::Scalar;
  }
  return all_vector ? MapPath::AllVector : MapPath::Packed;
}

template <class T, int N, class F>
void map(const char* op, const MapArgs<T, N>& a, const F& f) {
  if (a.n == 0) return;
  const MapPath path = choose_path(a);
  const int64_t work = path == MapPath::Scalar ? a.n : a.n / (16 / sizeof(T)) + 1;
  launch(op, map_kernel<T, N, F>, grid_for(work), kThreads, 0, a, f, path);
}

}  // namespace tg::cuda

namespace tg {

// The CUDA loop as an object; the twin of Loop<Device::CPU>.
template <>
struct Loop<Device::CUDA> {
  const char* op;
  template <class F>
  void operator()(int64_t n, const F& f) const { cuda::for_each(op, n, f); }
  template <class T, int N, class F>
  void map(const MapArgs<T, N>& a, const F& f) const { cuda::map(op, a, f); }
};

}  // namespace tg
