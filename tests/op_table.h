// The op table: one row per case of each op the library records (the list in
// autograd/op_list.h). A row names the op, the inputs it takes (symbolic
// shapes and how to draw them), how to call it and its CUDA parity tolerance.
// The same rows drive three things:
//   gradcheck/<op>  float64 on the CPU, tiny sizes, against central differences;
//   cuda/<op>       float32, the CUDA op against the CPU op on the same inputs;
//   bench_ops       float32 on CUDA at attention sizes (rows with kBench).
// Every op of the list gets a gradcheck/ and a cuda/ test case generated from
// the list itself; an op without a row fails them. docs/adding-an-op.md.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "tapegrad.h"

namespace tgtest {

enum Use : unsigned { kGradcheck = 1, kParity = 2, kBench = 4, kAllUses = 7 };

// What the symbolic dims of a shape stand for in each use.
struct Dims {
  int64_t B, H, S, C, D, M, N;
};
Dims dims_for(Use use);

// How an input is drawn (from the global generator).
struct Draw {
  enum Kind { Normal, Uniform, Bernoulli, Dyadic } kind = Normal;
  double a = 0, b = 1;  // Uniform: [a, b); Bernoulli: P(1) = a
};
inline Draw normal() { return {}; }
inline Draw uniform(double lo, double hi) { return {Draw::Uniform, lo, hi}; }
inline Draw bernoulli(double p) { return {Draw::Bernoulli, p, 0}; }
inline Draw dyadic() { return {Draw::Dyadic, 0, 0}; }  // multiples of 1/256 in [-2, 2)

struct Input {
  std::string shape;  // "B,H,S,S": dims by letter (optionally times a number, "3C"), or plain numbers
  Draw draw = {};
  bool requires_grad = true;
};

struct Tolerance {
  double atol, rtol;
};
inline constexpr Tolerance kElementwise{1e-6, 1e-5};
// A broadcast operand's gradient sums up to a few hundred float32 terms over
// the broadcast dims; the CPU and CUDA sum them in other orders, so a sum that
// cancels to near zero differs by ~sqrt(n) eps |term| ~ 1e-6, past kElementwise's atol.
inline constexpr Tolerance kBroadcast{1e-5, 1e-5};
inline constexpr Tolerance kReduction{1e-4, 1e-4};
inline constexpr Tolerance kGemm{1e-4, 1e-4};
// fp16 operands (TF32's 10-bit mantissa) against the CPU's fp32: each
// product is off by ~2^-11 of itself, a sum of K products of O(1) terms by
// ~2^-11 sqrt(K), several times that at the largest: ~2e-2 for the weight
// gradient's K = 111 tokens of O(1) inputs (the rows draw weights of ~0.06,
// so dx's K = 1000 sums stay below that). A wrong scale (a power of two),
// transpose or bias is off by O(1).
inline constexpr Tolerance kHalfGemm{3e-2, 1e-2};
// fp16 tiles through a whole attention layer at "high" (the projection, q
// k^T and Pd v, then the backward's five products, dS scaled by a bound):
// each product rounds its operands to TF32's mantissa, and the softmax
// amplifies the errors of the scores; measured 1.06 x kHalfGemm on dW at the
// parity dims. A wrong scale is off by a power of two, a transpose or a
// skipped tile by O(1).
inline constexpr Tolerance kHalfAttention{5e-2, 2e-2};

using V = std::vector<tg::Tensor>;

struct OpCase {
  tg::OpId op;
  std::string variant;  // what the row exercises
  std::vector<Input> inputs;
  std::function<tg::Tensor(const V& inputs, const Dims& dims)> run;
  Tolerance parity = kElementwise;
  unsigned uses = kAllUses;
  bool needs_cuda = false;       // the op itself moves between devices
  double gradcheck_eps = 1e-6;   // larger for ops through float32
};

const std::vector<OpCase>& op_cases();
std::vector<const OpCase*> cases_of(tg::OpId op, Use use);
tg::Shape resolve_shape(const std::string& shape, const Dims& dims);
// A case's inputs for a use, in `dtype` on the CPU.
V make_inputs(const OpCase& c, Use use, tg::DType dtype);
std::string case_name(const OpCase& c);

}  // namespace tgtest
