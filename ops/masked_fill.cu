#include "core/cuda_loops.cuh"
#include "ops/masked_fill.h"

namespace tg::cuda {

void masked_fill(const Tensor& x, const Tensor& mask, double value, const Tensor& out) {
  masked_fill_with(Loop{"masked_fill"}, x, mask, value, out);
}

}  // namespace tg::cuda
