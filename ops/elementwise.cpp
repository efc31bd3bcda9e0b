#include "ops/elementwise.h"

#include "autograd/engine.h"
#include "core/cpu_loops.h"
#include "core/dispatch.h"
#include "ops/reduce.h"
#include "ops/views.h"

namespace tg {

namespace {

using Grads = std::vector<Tensor>;

Tensor unary(const char* name, UnaryOp op, const Tensor& x, double c = 0.0) {
  check_defined(name, "x", x);
  Tensor y = empty(x.shape(), {x.dtype(), x.device()});
  TG_DISPATCH_DEVICE(x, unary_forward, op, c, x, y);
  // The gradient formula reads the output for exp/tanh and the input otherwise.
  const Tensor v = math::unary_grad_uses_output(op) ? y : x;
  return autograd::record(name, y, {x}, {v}, [op, c](const Tensor& g, const auto& saved) {
    Tensor gx = empty(g.shape(), {g.dtype(), g.device()});
    TG_DISPATCH_DEVICE(g, unary_backward, op, c, g, saved[0], gx);
    return Grads{gx};
  });
}

Tensor binary_untracked(const char* name, BinaryOp op, const Tensor& a, const Tensor& b) {
  check_defined(name, "a", a);
  check_defined(name, "b", b);
  check_same_dtype_device(name, a, b);
  const Shape shape = broadcast_shapes(name, a.shape(), b.shape());
  Tensor out = empty(shape, {a.dtype(), a.device()});
  TG_DISPATCH_DEVICE(a, binary_forward, op, broadcast_view(name, a, shape), broadcast_view(name, b, shape), out);
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor y = binary_untracked("add", BinaryOp::Add, a, b);
  return autograd::record("add", y, {a, b}, {},
                          [sa = a.shape(), sb = b.shape()](const Tensor& g, const auto&) {
                            return Grads{sum_to(g, sa), sum_to(g, sb)};
                          });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor y = binary_untracked("sub", BinaryOp::Sub, a, b);
  return autograd::record("sub", y, {a, b}, {},
                          [sa = a.shape(), sb = b.shape()](const Tensor& g, const auto&) {
                            return Grads{sum_to(g, sa), sum_to(neg(g), sb)};
                          });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor y = binary_untracked("mul", BinaryOp::Mul, a, b);
  return autograd::record("mul", y, {a, b}, {a, b},
                          [](const Tensor& g, const auto& s) {
                            return Grads{sum_to(mul(g, s[1]), s[0].shape()), sum_to(mul(g, s[0]), s[1].shape())};
                          });
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor y = binary_untracked("div", BinaryOp::Div, a, b);
  return autograd::record("div", y, {a, b}, {b, y}, [sa = a.shape()](const Tensor& g, const auto& s) {
    const Tensor& b = s[0];
    const Tensor g_over_b = div(g, b);
    return Grads{sum_to(g_over_b, sa), sum_to(neg(mul(g_over_b, s[1])), b.shape())};
  });
}

Tensor add(const Tensor& x, double c) { return unary("add_scalar", UnaryOp::AddScalar, x, c); }
Tensor mul(const Tensor& x, double c) { return unary("mul_scalar", UnaryOp::MulScalar, x, c); }
Tensor neg(const Tensor& x) { return unary("neg", UnaryOp::Neg, x); }
Tensor exp(const Tensor& x) { return unary("exp", UnaryOp::Exp, x); }
Tensor log(const Tensor& x) { return unary("log", UnaryOp::Log, x); }
Tensor tanh(const Tensor& x) { return unary("tanh", UnaryOp::Tanh, x); }
Tensor relu(const Tensor& x) { return unary("relu", UnaryOp::Relu, x); }
Tensor gelu(const Tensor& x) { return unary("gelu", UnaryOp::Gelu, x); }
Tensor silu(const Tensor& x) { return unary("silu", UnaryOp::Silu, x); }

namespace cpu {
void unary_forward(UnaryOp op, double c, const Tensor& x, const Tensor& out) {
  unary_forward_with(Loop{"unary"}, op, c, x, out);
}
void unary_backward(UnaryOp op, double c, const Tensor& g, const Tensor& v, const Tensor& out) {
  unary_backward_with(Loop{"unary_backward"}, op, c, g, v, out);
}
void binary_forward(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  binary_forward_with(Loop{"binary"}, op, a, b, out);
}
}  // namespace cpu

}  // namespace tg
