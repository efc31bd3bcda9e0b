// Strided N-d indexing shared by CPU loops and CUDA kernels: maps the linear
// index of an element in a logical shape to its offset in strided storage.
#pragma once
#include <cstdint>

#include "core/hd.h"
#include "core/shape.h"

namespace tg {

constexpr int kMaxDims = 8;

struct StridedIndexer {
  int rank = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};

  TG_HD int64_t offset(int64_t linear) const {
    int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      off += (linear % sizes[d]) * strides[d];
      linear /= sizes[d];
    }
    return off;
  }
};

// Throws naming `op` when the rank exceeds kMaxDims.
StridedIndexer make_indexer(const char* op, const Shape& shape, const Shape& strides);

}  // namespace tg
