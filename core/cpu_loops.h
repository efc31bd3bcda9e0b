// CPU loops: parallel_for over element indices (OpenMP over the machine's
// cores when the work is large enough) and map for elementwise maps.
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/dispatch.h"
#include "core/map_args.h"
#ifdef _OPENMP
#include <omp.h>
#endif

namespace tg::cpu {

constexpr int64_t kParallelGrain = 1 << 14;

// The threads an OpenMP loop runs on (1 without OpenMP).
inline int threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

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

// f(begin, end) over [0, n) in blocks of kMapBlock elements, in parallel when n is large.
constexpr int64_t kMapBlock = 4096;
template <class F>
void for_each_block(int64_t n, const F& f) {
  const int64_t blocks = (n + kMapBlock - 1) / kMapBlock;
#pragma omp parallel for if (n >= kParallelGrain)
  for (int64_t b = 0; b < blocks; ++b) f(b * kMapBlock, std::min(n, (b + 1) * kMapBlock));
}

// out[i] = f(in0[i], ...) by blocks, each cut into runs at the rows' ends.
template <class T, int N, class F>
void map(const MapArgs<T, N>& a, const F& f) {
  for_each_block(a.n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end;) {
      const int64_t row_end = std::min(end, (i / a.inner + 1) * a.inner);
      map_run(a, f, i, row_end);
      i = row_end;
    }
  });
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
