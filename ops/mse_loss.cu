#include "core/cuda_loops.cuh"
#include "ops/mse_loss.h"

namespace tg::cuda {

void mse_forward(const Tensor& a, const Tensor& b, const Tensor& sq) { mse_forward_with(Loop{"mse_loss"}, a, b, sq); }
void mse_backward(const Tensor& a, const Tensor& b, const Tensor& g, const Tensor& ga) {
  mse_backward_with(Loop{"mse_loss_backward"}, a, b, g, ga);
}

}  // namespace tg::cuda
