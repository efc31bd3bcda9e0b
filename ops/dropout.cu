#include "core/cuda_loops.cuh"
#include "ops/dropout.h"

namespace tg::cuda {

void dropout(const Tensor& x, const Tensor& mask, PhiloxState rng, double p, const Tensor& out) {
  dropout_with(Loop{"dropout"}, x, mask, rng, p, out);
}

}  // namespace tg::cuda
