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

struct StridedIndexer {
  int rank = 0;
  bool narrow = false;  // every index and offset fits in 31 bits
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};

  TG_HD int64_t offset(int64_t linear) const {
    int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) off += pop_index(linear, sizes[d], narrow) * strides[d];
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
