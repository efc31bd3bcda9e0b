// Elementwise ops with NumPy broadcasting. Each formula below is written once
// (TG_HD) and used by both the CPU loop and the CUDA kernel.
//
//   op          forward                      gradient (y = output, g = dL/dy)
//   add(a, b)   a + b                        a <- sum_to(g)        b <- sum_to(g)
//   sub(a, b)   a - b                        a <- sum_to(g)        b <- sum_to(-g)
//   mul(a, b)   a * b                        a <- sum_to(g * b)    b <- sum_to(g * a)
//   div(a, b)   a / b                        a <- sum_to(g / b)    b <- sum_to(-g * y / b)
//   neg(x)      -x                           x <- -g
//   mul(x, c)   c x                          x <- c g
//   add(x, c)   x + c                        x <- g
//   exp(x)      e^x                          x <- g y
//   log(x)      ln x                         x <- g / x
//   tanh(x)     tanh x                       x <- g (1 - y^2)
//   relu(x)     max(x, 0)                    x <- g [x > 0]
//   gelu(x)     x/2 (1 + tanh u), u = k0 (x + k1 x^3)
//                                            x <- g (1/2 (1 + tanh u) + x/2 (1 - tanh^2 u) k0 (1 + 3 k1 x^2))
//   silu(x)     x s, s = sigmoid(x)          x <- g s (1 + x (1 - s))
#pragma once
#include <cmath>

#include "core/hd.h"
#include "core/map_args.h"
#include "core/tensor.h"

namespace tg {

enum class UnaryOp { Neg, MulScalar, AddScalar, Exp, Log, Tanh, Relu, Gelu, Silu };
enum class BinaryOp { Add, Sub, Mul, Div };

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& x, double c);
Tensor mul(const Tensor& x, double c);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);  // tanh approximation
Tensor silu(const Tensor& x);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator-(const Tensor& x) { return neg(x); }
inline Tensor operator*(const Tensor& x, double c) { return mul(x, c); }
inline Tensor operator*(double c, const Tensor& x) { return mul(x, c); }
inline Tensor operator+(const Tensor& x, double c) { return add(x, c); }
inline Tensor operator-(const Tensor& x, double c) { return add(x, -c); }

namespace math {

constexpr double kGeluK0 = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluK1 = 0.044715;

// Whether the gradient formula reads the op's output (else its input).
inline bool unary_grad_uses_output(UnaryOp op) { return op == UnaryOp::Exp || op == UnaryOp::Tanh; }

template <class T>
TG_HD T sigmoid(T x) { return T(1) / (T(1) + std::exp(-x)); }

template <class T>
TG_HD T unary_forward(UnaryOp op, T x, T c) {
  switch (op) {
    case UnaryOp::Neg: return -x;
    case UnaryOp::MulScalar: return c * x;
    case UnaryOp::AddScalar: return x + c;
    case UnaryOp::Exp: return std::exp(x);
    case UnaryOp::Log: return std::log(x);
    case UnaryOp::Tanh: return std::tanh(x);
    case UnaryOp::Relu: return x > T(0) ? x : T(0);
    case UnaryOp::Gelu: return T(0.5) * x * (T(1) + std::tanh(T(kGeluK0) * (x + T(kGeluK1) * x * x * x)));
    case UnaryOp::Silu: return x * sigmoid(x);
  }
  return x;
}

// dy/dx, given v = y when unary_grad_uses_output(op), else v = x.
template <class T>
TG_HD T unary_derivative(UnaryOp op, T v, T c) {
  switch (op) {
    case UnaryOp::Neg: return T(-1);
    case UnaryOp::MulScalar: return c;
    case UnaryOp::AddScalar: return T(1);
    case UnaryOp::Exp: return v;
    case UnaryOp::Log: return T(1) / v;
    case UnaryOp::Tanh: return T(1) - v * v;
    case UnaryOp::Relu: return v > T(0) ? T(1) : T(0);
    case UnaryOp::Gelu: {
      const T t = std::tanh(T(kGeluK0) * (v + T(kGeluK1) * v * v * v));
      return T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * T(kGeluK0) * (T(1) + T(3 * kGeluK1) * v * v);
    }
    case UnaryOp::Silu: {
      const T s = sigmoid(v);
      return s * (T(1) + v * (T(1) - s));
    }
  }
  return T(0);
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

template <class T>
struct UnaryForward {
  UnaryOp op;
  T c;
  TG_HD T operator()(T x) const { return unary_forward(op, x, c); }
};

template <class T>
struct UnaryBackward {  // (g, v) -> g * dy/dx
  UnaryOp op;
  T c;
  TG_HD T operator()(T g, T v) const { return g * unary_derivative(op, v, c); }
};

template <class T>
struct BinaryForward {
  BinaryOp op;
  TG_HD T operator()(T a, T b) const { return binary_forward(op, a, b); }
};

}  // namespace math

// Kernels on tensors already broadcast to out's shape; out is contiguous.
namespace cpu {
void unary_forward(UnaryOp op, double c, const Tensor& x, const Tensor& out);
void unary_backward(UnaryOp op, double c, const Tensor& g, const Tensor& v, const Tensor& out);
void binary_forward(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out);
}  // namespace cpu
namespace cuda {
void unary_forward(UnaryOp op, double c, const Tensor& x, const Tensor& out);
void unary_backward(UnaryOp op, double c, const Tensor& g, const Tensor& v, const Tensor& out);
void binary_forward(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out);
}  // namespace cuda

// Device-generic launchers: `loop` is cpu::Loop or cuda::Loop.
template <class Loop>
void unary_forward_with(const Loop& loop, UnaryOp op, double c, const Tensor& x, const Tensor& out) {
  TG_DISPATCH_FLOAT(x.dtype(), T, [&] {
    loop.map(make_map_args<T, 1>(loop.op, out, {x}), math::UnaryForward<T>{op, static_cast<T>(c)});
  });
}

template <class Loop>
void unary_backward_with(const Loop& loop, UnaryOp op, double c, const Tensor& g, const Tensor& v,
                         const Tensor& out) {
  TG_DISPATCH_FLOAT(g.dtype(), T, [&] {
    loop.map(make_map_args<T, 2>(loop.op, out, {g, v}), math::UnaryBackward<T>{op, static_cast<T>(c)});
  });
}

template <class Loop>
void binary_forward_with(const Loop& loop, BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  TG_DISPATCH_FLOAT(a.dtype(), T, [&] {
    loop.map(make_map_args<T, 2>(loop.op, out, {a, b}), math::BinaryForward<T>{op});
  });
}

}  // namespace tg
