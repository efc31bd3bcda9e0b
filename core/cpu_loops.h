// CPU loops: parallel_for over element indices (OpenMP over the machine's
// cores when the work is large enough) and map for elementwise maps.
#pragma once
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

template <class T, int N, class F>
void map(const MapArgs<T, N>& a, const F& f) {
  parallel_for(a.n, [&](int64_t i) {
    T v[N];
    for (int k = 0; k < N; ++k) v[k] = load_operand(a, k, i);
    a.out[i] = apply_map<T, N>(f, v);
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
