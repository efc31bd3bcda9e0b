// Pack<T, V>: V consecutive elements aligned to 16 bytes, so that they move as
// 16-byte vector accesses (one for 4 floats, two for 4 doubles), on the CPU and
// the GPU. Quad<T> is the four-element pack of the kernels that work in fours.
#pragma once
#include <cstdint>

namespace tg {

template <class T, int V>
struct alignas(16) Pack {
  static_assert(V * sizeof(T) % 16 == 0, "Pack: V elements must fill whole 16-byte vectors");
  T v[V];
};

template <class T>
using Quad = Pack<T, 4>;

// A Pack may be read or written at p (nullptr counts as aligned: nothing is read there).
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace tg
