#include "core/cuda.h"
#include "core/error.h"

namespace tg {

namespace {
MatmulPrecision global_precision = MatmulPrecision::Highest;
}

void set_float32_matmul_precision(const std::string& precision) {
  if (precision == "highest") global_precision = MatmulPrecision::Highest;
  else if (precision == "high") global_precision = MatmulPrecision::High;
  else TG_FAIL("set_float32_matmul_precision: precision '", precision,
               "' is not one of \"highest\", \"high\"");
}

MatmulPrecision float32_matmul_precision() { return global_precision; }

MatmulPrecision resolve_precision(MatmulPrecision requested) {
  return requested == MatmulPrecision::Default ? global_precision : requested;
}

}  // namespace tg
