#include "core/indexing.h"

#include "core/error.h"

namespace tg {

StridedIndexer make_indexer(const char* op, const Shape& shape, const Shape& strides) {
  TG_CHECK(shape.size() <= static_cast<size_t>(kMaxDims), op, ": tensors of rank ", shape.size(),
           " are not supported (at most ", kMaxDims, ")");
  StridedIndexer ix;
  ix.rank = static_cast<int>(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    ix.sizes[d] = shape[d];
    ix.strides[d] = strides[d];
  }
  return ix;
}

}  // namespace tg
