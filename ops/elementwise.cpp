#include "ops/elementwise.h"

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cmath>

#include "autograd/engine.h"
#include "ops/untracked.h"
#include "core/cpu_loops.h"
#include "ops/elementwise_kernels.h"
#include "ops/reduce.h"
#include "ops/views.h"

namespace tg {

namespace math {

// The formulas of ops/elementwise_kernels.h on lanes: Eigen arrays of a cache
// line of floats or doubles. Their tanh is Eigen's vectorized one in float
// (a few ulp, NaN kept, exactly +-1 from |x| ~ 8 where libm's tanhf reaches
// it at ~9; in double Eigen 3.4 calls libm's): libm's tanhf, one element at a
// time, had taken ~15% of the main demo's samples in GELU (bench/NOTES.md
// "CPU demo"; GELU is now written with sigmoid). exp, log and sqrt stay
// libm's, element by element (Eigen's float exp gives ~2^-128, not 0, below
// -88.72, and its fast sqrt NaN at infinity); sigmoid, 1 / (1 + e^-x), takes
// Eigen's vectorized exp, whose ~2^-128 leaves it exactly 1 there and whose
// infinity above 88.72 exactly 0 (libm's expf one element at a time made
// GELU 4.4x slower).
template <class T, int L>
struct Fn<Eigen::Array<T, L, 1>> {
  using V = Eigen::Array<T, L, 1>;
  static V constant(T c) { return V::Constant(c); }
  static V exp(const V& x) { return x.unaryExpr([](T v) { return std::exp(v); }); }
  static V log(const V& x) { return x.unaryExpr([](T v) { return std::log(v); }); }
  static V sqrt(const V& x) { return x.unaryExpr([](T v) { return std::sqrt(v); }); }
  static V tanh(const V& x) { return x.tanh(); }
  static V sigmoid(const V& x) { return (T(1) + (-x).exp()).inverse(); }
  static V relu(const V& x) { return (x < T(0)).select(T(0), x); }  // NaN stays NaN
  static V step(const V& x) { return (x > T(0)).template cast<T>(); }
};

}  // namespace math

namespace cpu {

namespace {

template <class T>
using Lanes = Eigen::Array<T, 64 / sizeof(T), 1>;

// count (at most a Lanes) elements from p, the rest of the Lanes zeros.
template <class T>
Lanes<T> load_lanes(const T* p, int64_t count) {
  if (count == Lanes<T>::SizeAtCompileTime) return Eigen::Map<const Lanes<T>>(p);
  Lanes<T> v = Lanes<T>::Zero();
  std::copy(p, p + count, v.data());
  return v;
}

// out[i] = f(in[0][i], ...) over n contiguous elements, by cpu::map's blocks,
// a Lanes at a time (a block's last few elements padded with zeros), so that
// every element gets the same arithmetic wherever it sits.
template <class T, int N, class F>
void map_in_lanes(const std::array<const T*, N>& in, T* out, int64_t n, const F& f) {
  using V = Lanes<T>;
  constexpr int64_t L = V::SizeAtCompileTime;
  for_each_block(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; i += L) {
      const int64_t count = std::min(L, end - i);
      V v[N];
      for (int k = 0; k < N; ++k) v[k] = load_lanes(in[k] + i, count);
      const V y = apply_map<V, N>(f, v);
      std::copy(y.data(), y.data() + count, out + i);
    }
  });
}

bool contiguous_like(const Tensor& x, const Tensor& out) { return x.is_contiguous() && x.shape() == out.shape(); }

}  // namespace

bool unary_forward_in_lanes(UnaryOp op, double c, const Tensor& x, const Tensor& out) {
  if (!contiguous_like(x, out)) return false;
  TG_DISPATCH_FLOAT(x.dtype(), T, [&] {
    map_in_lanes<T, 1>({x.data<T>()}, out.data<T>(), out.numel(), math::UnaryForward<T>{op, static_cast<T>(c)});
  });
  return true;
}

bool unary_backward_in_lanes(UnaryOp op, double c, const Tensor& g, const Tensor& v, const Tensor& out) {
  if (!contiguous_like(g, out) || !contiguous_like(v, out)) return false;
  TG_DISPATCH_FLOAT(g.dtype(), T, [&] {
    map_in_lanes<T, 2>({g.data<T>(), v.data<T>()}, out.data<T>(), out.numel(),
                       math::UnaryBackward<T>{op, static_cast<T>(c)});
  });
  return true;
}

}  // namespace cpu

TG_INSTANTIATE_KERNELS(ElementwiseKernels, Device::CPU);

namespace {

using Grads = std::vector<Tensor>;
using autograd::grad_if;
using autograd::GradMask;

Tensor unary_untracked(UnaryOp op, double c, const Tensor& x) {
  Tensor y = empty(x.shape(), {x.dtype(), x.device()});
  TG_DISPATCH_DEVICE(x, ElementwiseKernels, unary_forward, op, c, x, y);
  return y;
}

// Ops whose derivative is a constant (neg, c x, x + c) save nothing and scale g.
Tensor constant_derivative_grad(UnaryOp op, double c, const Tensor& g) {
  switch (op) {
    case UnaryOp::AddScalar: return g;
    case UnaryOp::Neg: return unary_untracked(UnaryOp::Neg, 0.0, g);
    default: return unary_untracked(UnaryOp::MulScalar, c, g);
  }
}

Tensor unary(OpId name, UnaryOp op, const Tensor& x, double c = 0.0) {
  check_defined(op_name(name), "x", x);
  Tensor y = unary_untracked(op, c, x);
  const math::Reads reads = math::derivative_reads(op);
  const Tensor v = reads == math::Reads::Output ? y : reads == math::Reads::Input ? x : Tensor();
  return autograd::record(name, y, {x}, {v}, [op, c, reads](const Tensor& g, const auto& saved, const GradMask&) {
    if (reads == math::Reads::Nothing) return Grads{constant_derivative_grad(op, c, g)};
    Tensor gx = empty(g.shape(), {g.dtype(), g.device()});
    TG_DISPATCH_DEVICE(g, ElementwiseKernels, unary_backward, op, c, g, saved[0], gx);
    return Grads{gx};
  });
}

Tensor binary_untracked(const char* name, BinaryOp op, const Tensor& a, const Tensor& b) {
  check_defined(name, "a", a);
  check_defined(name, "b", b);
  check_same_dtype_device(name, a, b);
  const Shape shape = broadcast_shapes(name, a.shape(), b.shape());
  Tensor out = empty(shape, {a.dtype(), a.device()});
  TG_DISPATCH_DEVICE(a, ElementwiseKernels, binary_forward, op, broadcast_view(name, a, shape),
                     broadcast_view(name, b, shape), out);
  return out;
}

}  // namespace

void add_into(const Tensor& dst, const Tensor& b) {
  check_defined("add_into", "dst", dst);
  check_defined("add_into", "b", b);
  check_same_dtype_device("add_into", dst, b);
  TG_CHECK(dst.is_contiguous(), "add_into: dst ", dst.shape(), " must be contiguous");
  // Elementwise, each output from the inputs at its own index: dst may be an input.
  TG_DISPATCH_DEVICE(dst, ElementwiseKernels, binary_forward, BinaryOp::Add, dst,
                     broadcast_view("add_into", b, dst.shape()), dst);
}

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor y = binary_untracked("add", BinaryOp::Add, a, b);
  return autograd::record(OpId::add, y, {a, b}, {},
                          [sa = a.shape(), sb = b.shape()](const Tensor& g, const auto&, const GradMask& needs) {
                            return Grads{grad_if(needs[0], [&] { return sum_to(g, sa); }),
                                         grad_if(needs[1], [&] { return sum_to(g, sb); })};
                          });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor y = binary_untracked("sub", BinaryOp::Sub, a, b);
  return autograd::record(OpId::sub, y, {a, b}, {},
                          [sa = a.shape(), sb = b.shape()](const Tensor& g, const auto&, const GradMask& needs) {
                            return Grads{grad_if(needs[0], [&] { return sum_to(g, sa); }),
                                         grad_if(needs[1], [&] { return sum_to(neg(g), sb); })};
                          });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor y = binary_untracked("mul", BinaryOp::Mul, a, b);
  const GradMask m = autograd::grad_mask({a, b});
  return autograd::record(OpId::mul, y, {a, b}, {autograd::keep_if(m[0], b), autograd::keep_if(m[1], a)},
                          [sa = a.shape(), sb = b.shape()](const Tensor& g, const auto& s, const GradMask& needs) {
                            return Grads{grad_if(needs[0], [&] { return sum_to(mul(g, s[0]), sa); }),
                                         grad_if(needs[1], [&] { return sum_to(mul(g, s[1]), sb); })};
                          });
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor y = binary_untracked("div", BinaryOp::Div, a, b);
  const GradMask m = autograd::grad_mask({a, b});
  return autograd::record(OpId::div, y, {a, b}, {b, autograd::keep_if(m[1], y)},
                          [sa = a.shape()](const Tensor& g, const auto& s, const GradMask& needs) {
                            const Tensor& b = s[0];
                            const Tensor g_over_b = div(g, b);
                            return Grads{grad_if(needs[0], [&] { return sum_to(g_over_b, sa); }),
                                         grad_if(needs[1], [&] { return sum_to(neg(mul(g_over_b, s[1])), b.shape()); })};
                          });
}

Tensor add(const Tensor& x, double c) { return unary(OpId::add_scalar, UnaryOp::AddScalar, x, c); }
Tensor mul(const Tensor& x, double c) { return unary(OpId::mul_scalar, UnaryOp::MulScalar, x, c); }
Tensor neg(const Tensor& x) { return unary(OpId::neg, UnaryOp::Neg, x); }
Tensor exp(const Tensor& x) { return unary(OpId::exp, UnaryOp::Exp, x); }
Tensor log(const Tensor& x) { return unary(OpId::log, UnaryOp::Log, x); }
Tensor sqrt(const Tensor& x) { return unary(OpId::sqrt, UnaryOp::Sqrt, x); }
Tensor tanh(const Tensor& x) { return unary(OpId::tanh, UnaryOp::Tanh, x); }
Tensor relu(const Tensor& x) { return unary(OpId::relu, UnaryOp::Relu, x); }
Tensor gelu(const Tensor& x) { return unary(OpId::gelu, UnaryOp::Gelu, x); }
Tensor silu(const Tensor& x) { return unary(OpId::silu, UnaryOp::Silu, x); }

}  // namespace tg
