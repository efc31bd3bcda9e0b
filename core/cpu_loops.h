// CPU loops: parallel_for over element indices (OpenMP over the machine's
// cores when the work is large enough) and map for elementwise maps.
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/dispatch.h"
#include "core/map_args.h"

namespace tg::cpu {

constexpr int64_t kParallelGrain = 1 << 14;

template <class F>
void parallel_for(int64_t n, const F& f) {
#pragma omp parallel for if (n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) f(i);
}

// Elements [begin, end) of one row of the innermost (collapsed) dim: each
// operand's first element found once, then walked at its inner stride (1, 0
// for a broadcast, or any), with no per-element index arithmetic.
template <class T, int N, class F>
void map_run(const MapArgs<T, N>& a, const F& f, int64_t begin, int64_t end) {
  const T* in[N];
  int64_t step[N];
  for (int k = 0; k < N; ++k) {
    const StridedIndexer& ix = a.in_idx[k];
    in[k] = a.in[k] + (a.in_contiguous[k] ? begin : ix.offset(begin));
    step[k] = a.in_contiguous[k] || ix.rank == 0 ? 1 : ix.strides[ix.rank - 1];
  }
  T* out = a.out + begin;
  for (int64_t j = 0; j < end - begin; ++j) {
    T v[N];
    for (int k = 0; k < N; ++k) v[k] = in[k][j * step[k]];
    out[j] = apply_map<T, N>(f, v);
  }
}

// out[i] = f(in0[i], ...) in blocks of kMapBlock elements (in parallel when
// large), each block cut into runs at the rows' ends.
constexpr int64_t kMapBlock = 4096;
template <class T, int N, class F>
void map(const MapArgs<T, N>& a, const F& f) {
  const int64_t blocks = (a.n + kMapBlock - 1) / kMapBlock;
#pragma omp parallel for if (a.n >= kParallelGrain)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t end = std::min(a.n, (b + 1) * kMapBlock);
    for (int64_t i = b * kMapBlock; i < end;) {
      const int64_t row_end = std::min(end, (i / a.inner + 1) * a.inner);
      map_run(a, f, i, row_end);
      i = row_end;
    }
  }
}

}  // namespace tg::cpu

namespace tg {

// The CPU loop as an object, so generic kernels take either it or Loop<Device::CUDA>.
template <>
struct Loop<Device::CPU> {
  const char* op;
  template <class F>
  void operator()(int64_t n, const F& f) const { cpu::parallel_for(n, f); }
  template <class T, int N, class F>
  void map(const MapArgs<T, N>& a, const F& f) const { cpu::map(a, f); }
};

}  // namespace tg
