// Elementwise ops with NumPy broadcasting. Gradient rules (y = output, g = dL/dy);
// each formula is written once, in ops/elementwise_kernels.h, and used by both
// the CPU loop (on contiguous operands over lanes of Eigen arrays) and the
// CUDA kernel:
//
//   op          forward                      gradient                                 saves
//   add(a, b)   a + b                        a <- sum_to(g)        b <- sum_to(g)      nothing
//   sub(a, b)   a - b                        a <- sum_to(g)        b <- sum_to(-g)     nothing
//   mul(a, b)   a * b                        a <- sum_to(g * b)    b <- sum_to(g * a)  b for a, a for b
//   div(a, b)   a / b                        a <- sum_to(g / b)    b <- sum_to(-g * y / b)   b; y for b
//   neg(x)      -x                           x <- -g                                  nothing
//   mul(x, c)   c x                          x <- c g                                 nothing
//   add(x, c)   x + c                        x <- g                                   nothing
//   exp(x)      e^x                          x <- g y                                 y
//   log(x)      ln x                         x <- g / x                               x
//   sqrt(x)     x^(1/2)                      x <- g / (2 y)                           y
//   tanh(x)     tanh x                       x <- g (1 - y^2)                         y
//   relu(x)     max(x, 0) (NaN stays NaN)    x <- g [x > 0]                           x
//   gelu(x)     x/2 (1 + tanh u) = x p, u = k0 (x + k1 x^3), p = sigmoid(2u), q = sigmoid(-2u)
//                                            x <- g (p + 2 x p q k0 (1 + 3 k1 x^2))   x
//   silu(x)     x s, s = sigmoid(x)          x <- g s (1 + x (1 - s))                 x
#pragma once
#include "core/tensor.h"

namespace tg {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& x, double c);
Tensor mul(const Tensor& x, double c);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
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

}  // namespace tg
