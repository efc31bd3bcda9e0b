#include "core/dtype.h"

namespace tg {

void unknown_dtype(const char* where, DType t) {
  TG_FAIL(where, ": unknown dtype (enumerator ", static_cast<int>(t), ")");
}

}  // namespace tg
