// Strided N-d indexing shared by CPU loops and CUDA kernels: maps the linear
// index of an element in a logical shape to its offset in strided storage.
#pragma once
#include <cstdint>

#include "core/hd.h"
#include "core/shape.h"

namespace tg {

constexpr int kMaxDims = 8;

// Returns linear % size and leaves linear / size in `linear`; in 32-bit
// arithmetic when `narrow` (much cheaper on the GPU than 64-bit div/mod).
TG_HD int64_t pop_index(int64_t& linear, int64_t size, bool narrow) {
  if (narrow) {
    const uint32_t l = static_cast<uint32_t>(linear), s = static_cast<uint32_t>(size);
    linear = l / s;
    return l % s;
  }
  const int64_t r = linear % size;
  linear /= size;
  return r;
}

// Division by a fixed divisor d in [1, 2^31) of dividends n < 2^31 as a
// multiply-high, an add and a shift instead of a division (~20 GPU
// instructions even in 32 bits): with s = ceil(log2 d) and
// m = floor(2^32 (2^s - d) / d) + 1, n / d = (umulhi(n, m) + n) >> s
// (Granlund and Montgomery's method, in the form of PyTorch's IntDivider).
struct Divider {
  uint32_t divisor = 1, magic = 1, shift = 0;
  Divider() = default;
  explicit Divider(uint32_t d) : divisor(d) {
    while ((uint64_t(1) << shift) < d) ++shift;
    magic = static_cast<uint32_t>((uint64_t(1) << 32) * ((uint64_t(1) << shift) - d) / d + 1);
  }
  TG_HD uint32_t quotient(uint32_t n) const {
#ifdef __CUDA_ARCH__
    const uint32_t high = __umulhi(n, magic);
#else
    const uint32_t high = static_cast<uint32_t>((uint64_t(n) * magic) >> 32);
#endif
    return (high + n) >> shift;
  }
};

struct StridedIndexer {
  int rank = 0;
  bool narrow = false;  // every index and offset fits in 31 bits: 32-bit arithmetic, dividers
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  Divider dividers[kMaxDims] = {};  // by sizes[d], when narrow

  TG_HD int64_t offset(int64_t linear) const {
    if (narrow) {
      uint32_t rest = static_cast<uint32_t>(linear), off = 0;
      for (int d = rank - 1; d >= 0; --d) {
        const uint32_t q = dividers[d].quotient(rest);
        off += (rest - q * dividers[d].divisor) * static_cast<uint32_t>(strides[d]);
        rest = q;
      }
      return off;
    }
    int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) off += pop_index(linear, sizes[d], false) * strides[d];
    return off;
  }
};

// Throws naming `op` when the rank exceeds kMaxDims.
StridedIndexer make_indexer(const char* op, const Shape& shape, const Shape& strides);

// Merges neighbouring dims that every operand walks as one (stride[d] ==
// stride[d+1] * size[d+1] in all of them) and drops size-1 dims, so indexers
// do fewer div/mods. `strides` holds one stride vector per operand.
void collapse_dims(Shape& shape, std::vector<Shape>& strides);

}  // namespace tg
