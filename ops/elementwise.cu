#include "core/cuda_loops.cuh"
#include "ops/elementwise.h"

namespace tg::cuda {

void unary_forward(UnaryOp op, double c, const Tensor& x, const Tensor& out) {
  unary_forward_with(Loop{"unary"}, op, c, x, out);
}
void unary_backward(UnaryOp op, double c, const Tensor& g, const Tensor& v, const Tensor& out) {
  unary_backward_with(Loop{"unary_backward"}, op, c, g, v, out);
}
void binary_forward(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  binary_forward_with(Loop{"binary"}, op, a, b, out);
}

}  // namespace tg::cuda
