// Quad<T>: four consecutive elements aligned so that they move as one 16-byte
// (float) or two 16-byte (double) vector accesses, on the CPU and the GPU.
#pragma once
#include <cstdint>

namespace tg {

template <class T>
struct alignas(4 * sizeof(T)) Quad {
  T v[4];
};

template <class T>
bool quad_aligned(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % sizeof(Quad<T>) == 0;
}

}  // namespace tg
