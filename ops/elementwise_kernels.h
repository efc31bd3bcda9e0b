// The elementwise formulas (forward and derivative, once, TG_HD) and the
// kernels that map them over tensors on either device.
#pragma once
#include <cmath>
#include <type_traits>

#include "core/dispatch.h"
#include "core/hd.h"
#include "core/map_args.h"
#include "core/tensor.h"

namespace tg {

enum class UnaryOp { Neg, MulScalar, AddScalar, Exp, Log, Sqrt, Tanh, Relu, Gelu, Silu };
enum class BinaryOp { Add, Sub, Mul, Div };

namespace math {

constexpr double kGeluK0 = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluK1 = 0.044715;

// What a unary op's derivative reads: nothing (a constant), its input, or its output.
enum class Reads { Nothing, Input, Output };
constexpr Reads derivative_reads(UnaryOp op) {
  switch (op) {
    case UnaryOp::Neg:
    case UnaryOp::MulScalar:
    case UnaryOp::AddScalar: return Reads::Nothing;
    case UnaryOp::Exp:
    case UnaryOp::Sqrt:
    case UnaryOp::Tanh: return Reads::Output;
    case UnaryOp::Log:
    case UnaryOp::Relu:
    case UnaryOp::Gelu:
    case UnaryOp::Silu: return Reads::Input;
  }
  return Reads::Input;
}

// The functions the formulas below call, for a value type V: a scalar (on
// either device) or, on the CPU, a short Eigen array of lanes, for which
// ops/elementwise.cpp specializes Fn (there tanh and sigmoid's exp are
// Eigen's vectorized ones: libm's work one element at a time).
template <class V>
struct Fn {
  template <class T>
  TG_HD static V constant(T c) { return V(c); }
  TG_HD static V exp(const V& x) { return std::exp(x); }
  TG_HD static V log(const V& x) { return std::log(x); }
  TG_HD static V sqrt(const V& x) { return std::sqrt(x); }
  TG_HD static V tanh(const V& x) { return std::tanh(x); }
  TG_HD static V sigmoid(const V& x) { return V(1) / (V(1) + std::exp(-x)); }  // exactly 0 and 1 at the ends
  TG_HD static V relu(const V& x) { return x < V(0) ? V(0) : x; }  // NaN stays NaN, as in PyTorch
  TG_HD static V step(const V& x) { return x > V(0) ? V(1) : V(0); }  // [x > 0]
};

// GELU's tanh argument u = k0 (x + k1 x^3). GELU is written through
// (1 + tanh u) / 2 = sigmoid(2u): next to t = tanh u = -1 (or 1 for the
// derivative's 1 - t^2) the tanh form subtracts nearly equal numbers, and a
// tanh u off by d costs the derivative ~4.8 d at x = -3 (its value -0.0116).
template <class T, class V>
TG_HD V gelu_u(const V& x) { return T(kGeluK0) * (x + T(kGeluK1) * x * x * x); }

// y = op(x) for x of value type V (a scalar, or lanes of scalars T).
template <class T, class V>
TG_HD V unary_forward(UnaryOp op, const V& x, T c) {
  using F = Fn<V>;
  switch (op) {
    case UnaryOp::Neg: return T(-1) * x;  // exact; keeps -0 where Eigen's 0 - x lanes would not
    case UnaryOp::MulScalar: return c * x;
    case UnaryOp::AddScalar: return x + c;
    case UnaryOp::Exp: return F::exp(x);
    case UnaryOp::Log: return F::log(x);
    case UnaryOp::Sqrt: return F::sqrt(x);
    case UnaryOp::Tanh: return F::tanh(x);
    case UnaryOp::Relu: return F::relu(x);
    case UnaryOp::Gelu: return x * F::sigmoid(T(2) * gelu_u<T>(x));  // x (1 + tanh u) / 2
    case UnaryOp::Silu: return x * F::sigmoid(x);
  }
  return x;
}

// dy/dx, given v = y or x as derivative_reads(op) says (ignored for constants).
template <class T, class V>
TG_HD V unary_derivative(UnaryOp op, const V& v, T c) {
  using F = Fn<V>;
  switch (op) {
    case UnaryOp::Neg: return F::constant(T(-1));
    case UnaryOp::MulScalar: return F::constant(c);
    case UnaryOp::AddScalar: return F::constant(T(1));
    case UnaryOp::Exp: return v;
    case UnaryOp::Log: return T(1) / v;
    case UnaryOp::Sqrt: return T(0.5) / v;
    case UnaryOp::Tanh: return T(1) - v * v;
    case UnaryOp::Relu: return F::step(v);
    case UnaryOp::Gelu: {  // p + 2 x p q u', p = (1 + tanh u) / 2 and q = (1 - tanh u) / 2 each without cancellation
      const V u = gelu_u<T>(v);
      const V p = F::sigmoid(T(2) * u), q = F::sigmoid(T(-2) * u);
      const V pqx = p * q * v;  // 0 past |x| ~10.06 (float; e^2u overflows), and x^2 comes in as (pqx x) x, never inf * 0
      return p + T(2 * kGeluK0) * (pqx + T(3 * kGeluK1) * (pqx * v) * v);
    }
    case UnaryOp::Silu: {
      const V s = F::sigmoid(v);
      return s * (T(1) + v * (T(1) - s));
    }
  }
  return F::constant(T(0));
}

template <class T>
TG_HD T binary_forward(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::Add: return a + b;
    case BinaryOp::Sub: return a - b;
    case BinaryOp::Mul: return a * b;
    case BinaryOp::Div: return a / b;
  }
  return a;
}

// Unary maps, on scalars or lanes of them (V).
template <class T>
struct UnaryForward {
  UnaryOp op;
  T c;
  template <class V>
  TG_HD V operator()(const V& x) const { return unary_forward(op, x, c); }
};

template <class T>
struct UnaryBackward {  // (g, v) -> g * dy/dx
  UnaryOp op;
  T c;
  template <class V>
  TG_HD V operator()(const V& g, const V& v) const { return g * unary_derivative(op, v, c); }
};

template <class T>
struct BinaryForward {
  BinaryOp op;
  TG_HD T operator()(T a, T b) const { return binary_forward(op, a, b); }
};

// The same with the op fixed at compile time: a CPU loop over it vectorizes
// (with a switch per element it does not: bench/cpu_maps, bench/NOTES.md).
template <class T, BinaryOp Op>
struct BinaryForwardOf {
  TG_HD T operator()(T a, T b) const { return binary_forward(Op, a, b); }
};

// f(std::integral_constant<BinaryOp, op>{}): the op as a compile-time constant.
template <class F>
void with_binary_op(BinaryOp op, const F& f) {
  switch (op) {
    case BinaryOp::Add: return f(std::integral_constant<BinaryOp, BinaryOp::Add>{});
    case BinaryOp::Sub: return f(std::integral_constant<BinaryOp, BinaryOp::Sub>{});
    case BinaryOp::Mul: return f(std::integral_constant<BinaryOp, BinaryOp::Mul>{});
    case BinaryOp::Div: return f(std::integral_constant<BinaryOp, BinaryOp::Div>{});
  }
  TG_FAIL("binary op ", static_cast<int>(op), " is not one of add, sub, mul, div");
}

}  // namespace math

namespace cpu {
// The CPU's unary maps where every operand is contiguous, in lanes of Eigen
// arrays (ops/elementwise.cpp); false, with nothing done, where one is not.
bool unary_forward_in_lanes(UnaryOp op, double c, const Tensor& x, const Tensor& out);
bool unary_backward_in_lanes(UnaryOp op, double c, const Tensor& g, const Tensor& v, const Tensor& out);
}  // namespace cpu

// Kernels on tensors already broadcast to out's shape; out is contiguous.
template <Device D>
struct ElementwiseKernels {
  static void unary_forward(UnaryOp op, double c, const Tensor& x, const Tensor& out);
  static void unary_backward(UnaryOp op, double c, const Tensor& g, const Tensor& v, const Tensor& out);
  static void binary_forward(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out);
};
TG_EXTERN_CUDA_KERNELS(ElementwiseKernels);

template <Device D>
void ElementwiseKernels<D>::unary_forward(UnaryOp op, double c, const Tensor& x, const Tensor& out) {
  if constexpr (D == Device::CPU)
    if (cpu::unary_forward_in_lanes(op, c, x, out)) return;
  const Loop<D> loop{"unary"};
  TG_DISPATCH_FLOAT(x.dtype(), T, [&] {
    loop.map(make_map_args<T, 1>(loop.op, out, {x}), math::UnaryForward<T>{op, static_cast<T>(c)});
  });
}

template <Device D>
void ElementwiseKernels<D>::unary_backward(UnaryOp op, double c, const Tensor& g, const Tensor& v, const Tensor& out) {
  if constexpr (D == Device::CPU)
    if (cpu::unary_backward_in_lanes(op, c, g, v, out)) return;
  const Loop<D> loop{"unary_backward"};
  TG_DISPATCH_FLOAT(g.dtype(), T, [&] {
    loop.map(make_map_args<T, 2>(loop.op, out, {g, v}), math::UnaryBackward<T>{op, static_cast<T>(c)});
  });
}

template <Device D>
void ElementwiseKernels<D>::binary_forward(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  const Loop<D> loop{"binary"};
  TG_DISPATCH_FLOAT(a.dtype(), T, [&] {
    const auto args = make_map_args<T, 2>(loop.op, out, {a, b});
    if constexpr (D == Device::CPU)
      math::with_binary_op(op, [&](auto fixed) { loop.map(args, math::BinaryForwardOf<T, fixed.value>{}); });
    else
      loop.map(args, math::BinaryForward<T>{op});
  });
}

}  // namespace tg
