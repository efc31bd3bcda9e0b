#include "core/indexing.h"

#include <algorithm>

#include "core/error.h"

namespace tg {

StridedIndexer make_indexer(const char* op, const Shape& shape, const Shape& strides) {
  TG_CHECK(shape.size() <= static_cast<size_t>(kMaxDims), op, ": tensors of rank ", shape.size(),
           " are not supported (at most ", kMaxDims, ")");
  StridedIndexer ix;
  ix.rank = static_cast<int>(shape.size());
  int64_t max_offset = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    ix.sizes[d] = shape[d];
    ix.strides[d] = strides[d];
    max_offset += (shape[d] - 1) * strides[d];
  }
  ix.narrow = numel(shape) < (int64_t(1) << 31) && max_offset < (int64_t(1) << 31);
  for (size_t d = 0; d < shape.size(); ++d) ix.narrow = ix.narrow && strides[d] >= 0;
  if (ix.narrow)
    for (size_t d = 0; d < shape.size(); ++d) ix.dividers[d] = Divider(static_cast<uint32_t>(std::max<int64_t>(shape[d], 1)));  // 0: no elements
  return ix;
}

void collapse_dims(Shape& shape, std::vector<Shape>& strides) {
  Shape out_shape;
  std::vector<Shape> out_strides(strides.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !out_shape.empty();
    for (size_t k = 0; k < strides.size() && merge; ++k) merge = out_strides[k].back() == strides[k][d] * shape[d];
    if (merge) {
      out_shape.back() *= shape[d];
      for (size_t k = 0; k < strides.size(); ++k) out_strides[k].back() = strides[k][d];
    } else {
      out_shape.push_back(shape[d]);
      for (size_t k = 0; k < strides.size(); ++k) out_strides[k].push_back(strides[k][d]);
    }
  }
  shape = std::move(out_shape);
  strides = std::move(out_strides);
}

}  // namespace tg
