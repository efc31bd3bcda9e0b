// CUDA loops: for_each over element indices (grid-stride) and map for
// elementwise maps, with 16-byte vector loads when every operand is
// contiguous and aligned. The CPU twins are in core/cpu_loops.h.
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/cuda_context.h"
#include "core/map_args.h"

namespace tg::cuda {

constexpr int kThreads = 256;

inline int grid_for(int64_t work_items) {
  const int64_t cap = static_cast<int64_t>(context().sm_count) * 32;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((work_items + kThreads - 1) / kThreads, cap)));
}

template <class F>
__global__ void for_each_kernel(int64_t n, F f) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    f(i);
}

template <class F>
void for_each(const char* op, int64_t n, const F& f) {
  if (n == 0) return;
  for_each_kernel<<<grid_for(n), kThreads, 0, stream()>>>(n, f);
  check_launch(op);
}

template <class T, int V>
struct alignas(16) Pack {
  T v[V];
};

template <class T, int N, class F>
__global__ void map_kernel(MapArgs<T, N> a, F f, bool vectorized) {
  constexpr int V = 16 / sizeof(T);
  const int64_t tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t scalar_start = 0;
  if (vectorized) {
    const int64_t packs = a.n / V;
    for (int64_t p = tid; p < packs; p += stride) {
      Pack<T, V> in[N];
      for (int k = 0; k < N; ++k) in[k] = reinterpret_cast<const Pack<T, V>*>(a.in[k])[p];
      Pack<T, V> out;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        T v[N];
        for (int k = 0; k < N; ++k) v[k] = in[k].v[j];
        out.v[j] = apply_map<T, N>(f, v);
      }
      reinterpret_cast<Pack<T, V>*>(a.out)[p] = out;
    }
    scalar_start = packs * V;
  }
  for (int64_t i = scalar_start + tid; i < a.n; i += stride) {
    T v[N];
    for (int k = 0; k < N; ++k) v[k] = a.in[k][a.contiguous ? i : a.in_idx[k].offset(i)];
    a.out[i] = apply_map<T, N>(f, v);
  }
}

template <class T, int N>
bool aligned16(const MapArgs<T, N>& a) {
  bool ok = reinterpret_cast<uintptr_t>(a.out) % 16 == 0;
  for (int k = 0; k < N; ++k) ok = ok && reinterpret_cast<uintptr_t>(a.in[k]) % 16 == 0;
  return ok;
}

template <class T, int N, class F>
void map(const char* op, const MapArgs<T, N>& a, const F& f) {
  if (a.n == 0) return;
  const bool vectorized = a.contiguous && aligned16(a);
  const int64_t work = vectorized ? a.n / (16 / sizeof(T)) + 1 : a.n;
  map_kernel<<<grid_for(work), kThreads, 0, stream()>>>(a, f, vectorized);
  check_launch(op);
}

}  // namespace tg::cuda

namespace tg::cuda {

// The CUDA loop as an object; the twin of cpu::Loop.
struct Loop {
  const char* op;
  template <class F>
  void operator()(int64_t n, const F& f) const { for_each(op, n, f); }
  template <class T, int N, class F>
  void map(const MapArgs<T, N>& a, const F& f) const { cuda::map(op, a, f); }
};

}  // namespace tg::cuda
