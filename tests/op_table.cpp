#include "op_table.h"

#include <cmath>
#include <limits>
#include <sstream>

namespace tgtest {

namespace {

const double kInf = std::numeric_limits<double>::infinity();
constexpr unsigned kCheckOnly = kGradcheck | kParity;

// Rows of the four binary ops: the bench shape, then broadcasting and strides.
std::vector<OpCase> binary_cases(tg::OpId op, tg::Tensor (*f)(const tg::Tensor&, const tg::Tensor&), Draw b_draw) {
  auto call = [f](const V& t, const Dims&) { return f(t[0], t[1]); };
  return {
      {op, "[B,H,S,S] pair", {{"B,H,S,S"}, {"B,H,S,S", b_draw}}, call},
      {op, "a row broadcast", {{"B,S,C"}, {"C", b_draw}}, call, kBroadcast, kCheckOnly},
      {op, "column x row", {{"S,1"}, {"1,C", b_draw}}, call, kBroadcast, kCheckOnly},
      {op, "one element x matrix", {{"1"}, {"S,C", b_draw}}, call, kBroadcast, kCheckOnly},
      {op, "rank-3 x rank-2 broadcast", {{"B,1,S"}, {"C,1", b_draw}}, call, kBroadcast, kCheckOnly},
      {op, "transposed operand", {{"S,C"}, {"C,S", b_draw}},
       [f](const V& t, const Dims&) { return f(t[0].transpose(0, 1), t[1]); }, kElementwise, kCheckOnly},
  };
}

// Rows of a unary map: the bench shape, a 0-d tensor, a permuted input, odd sizes.
std::vector<OpCase> unary_cases(tg::OpId op, tg::Tensor (*f)(const tg::Tensor&), Draw x) {
  auto call = [f](const V& t, const Dims&) { return f(t[0]); };
  return {
      {op, "[B,S,4C]", {{"B,S,4C", x}}, call},
      {op, "0-d", {{"", x}}, call, kElementwise, kCheckOnly},
      {op, "permuted input", {{"B,S,C", x}}, [f](const V& t, const Dims&) { return f(t[0].permute({2, 0, 1})); },
       kElementwise, kCheckOnly},
      {op, "odd length", {{"3,4097", x}}, call, kElementwise, kParity},
  };
}

template <class... Lists>
std::vector<OpCase> concat(Lists... lists) {
  std::vector<OpCase> all;
  (all.insert(all.end(), lists.begin(), lists.end()), ...);
  return all;
}

// The projection of a permuted qkv, as the attention layer makes q and k: the
// batched product of views whose batch dims do not merge into one stride.
tg::Tensor qk_of_permuted_projection(const V& t, const Dims& d) {
  const tg::Tensor qkv = t[0].view({d.B, d.S, 3, d.H, d.D}).permute({2, 0, 3, 1, 4});
  const tg::Tensor q = qkv.narrow(0, 0, 1).squeeze(0), k = qkv.narrow(0, 1, 1).squeeze(0);
  return tg::matmul(q, k.transpose(-1, -2));
}

// fused_qkv_attention with masked keys and p = 0.1 at `precision`. Weights
// of ~0.06 (as linear's rows) keep q and k near unit scale, like
// fused_attention's rows: with 3x larger weights the scores are 9x larger
// and the softmax so sharp that even the CPU's float32 gradients stray from
// float64's by 2.4x kGemm's tolerance.
OpCase fused_qkv_masked_row(std::string variant, tg::MatmulPrecision precision, Tolerance tolerance, unsigned uses) {
  const auto mask = [](double p_one) { return Input{"B,S", bernoulli(p_one), false}; };
  return {tg::OpId::fused_qkv_attention, std::move(variant),
          {{"B,S,C"}, {"3C,C", uniform(-0.1, 0.1)}, {"3C"}, mask(0.5), mask(0.85), {"H,M,M", uniform(-0.5, 0.5)},
           {"H,1,1"}, {"H,1,1"}},
          [precision](const V& t, const Dims& d) {
            return tg::fused_qkv_attention(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], d.H,
                                           {0.1, tg::PhiloxState{5, 9}}, precision);
          },
          tolerance, uses};
}

// fused_attention_layer (the core between both projections) with masked
// keys and p = 0.1 at `precision`; the out-projection's weights as the qkv
// projection's.
OpCase fused_layer_masked_row(std::string variant, tg::MatmulPrecision precision, Tolerance tolerance,
                              unsigned uses) {
  const auto mask = [](double p_one) { return Input{"B,S", bernoulli(p_one), false}; };
  return {tg::OpId::fused_attention_layer, std::move(variant),
          {{"B,S,C"}, {"3C,C", uniform(-0.1, 0.1)}, {"3C"}, mask(0.5), mask(0.85), {"H,M,M", uniform(-0.5, 0.5)},
           {"H,1,1"}, {"H,1,1"}, {"C,C", uniform(-0.1, 0.1)}, {"C"}},
          [precision](const V& t, const Dims& d) {
            return tg::fused_attention_layer(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], d.H,
                                             {0.1, tg::PhiloxState{5, 9}}, precision);
          },
          tolerance, uses};
}

std::vector<OpCase> build_cases() {
  using tg::OpId;
  auto no_grad = [](std::string s, Draw d = {}) { return Input{std::move(s), d, false}; };
  return concat(
      binary_cases(OpId::add, tg::add, normal()), binary_cases(OpId::sub, tg::sub, normal()),
      binary_cases(OpId::mul, tg::mul, normal()), binary_cases(OpId::div, tg::div, uniform(0.5, 2.0)),
      std::vector<OpCase>{
          {OpId::mul, "the same tensor twice", {{"S,C"}}, [](const V& t, const Dims&) { return tg::mul(t[0], t[0]); },
           kElementwise, kCheckOnly},
          {OpId::add_scalar, "[B,S,4C]", {{"B,S,4C"}}, [](const V& t, const Dims&) { return tg::add(t[0], -2.5); }},
          {OpId::mul_scalar, "[B,S,4C]", {{"B,S,4C"}}, [](const V& t, const Dims&) { return tg::mul(t[0], 0.37); }},
      },
      unary_cases(OpId::neg, tg::neg, normal()), unary_cases(OpId::exp, tg::exp, uniform(-2, 2)),
      unary_cases(OpId::log, tg::log, uniform(0.2, 3)), unary_cases(OpId::sqrt, tg::sqrt, uniform(0.2, 3)),
      unary_cases(OpId::tanh, tg::tanh, uniform(-2, 2)),
      unary_cases(OpId::relu, tg::relu, uniform(0.1, 2)), unary_cases(OpId::gelu, tg::gelu, uniform(-3, 3)),
      unary_cases(OpId::silu, tg::silu, uniform(-3, 3)),
      std::vector<OpCase>{
          {OpId::relu, "negative inputs", {{"S,C", uniform(-2, -0.1)}},
           [](const V& t, const Dims&) { return tg::relu(t[0]); }, kElementwise, kCheckOnly},
          // ---- reductions
          {OpId::sum, "last dim of [B,H,S,S]", {{"B,H,S,S"}}, [](const V& t, const Dims&) { return tg::sum(t[0], {3}); },
           kReduction},
          {OpId::sum, "over tokens [B,S,C] -> [C]", {{"B,S,C"}},
           [](const V& t, const Dims&) { return tg::sum(t[0], {0, 1}); }, kReduction},
          {OpId::sum, "mean over tokens", {{"B,S,C"}}, [](const V& t, const Dims&) { return tg::mean(t[0], {0, 1}); },
           kReduction},
          {OpId::sum, "every element", {{"S,C"}}, [](const V& t, const Dims&) { return tg::sum(t[0]); }, kReduction,
           kCheckOnly},
          {OpId::sum, "middle dims, kept", {{"B,S,C"}}, [](const V& t, const Dims&) { return tg::sum(t[0], {0, 2}, true); },
           kReduction, kCheckOnly},
          {OpId::sum, "a transposed input", {{"C,S"}}, [](const V& t, const Dims&) { return tg::sum(t[0].transpose(0, 1), {-1}); },
           kReduction, kCheckOnly},
          {OpId::sum, "long rows split across blocks", {{"3,100000"}}, [](const V& t, const Dims&) { return tg::sum(t[0], {1}); },
           kReduction, kParity},
          {OpId::sum, "mean of everything", {{"S,C"}}, [](const V& t, const Dims&) { return tg::mean(t[0]); }, kReduction,
           kCheckOnly},
          // ---- views
          {OpId::view, "flatten", {{"B,S,C"}}, [](const V& t, const Dims&) { return t[0].view({-1}); }, kElementwise,
           kCheckOnly},
          {OpId::view, "reshape of a transposed input", {{"S,C"}},
           [](const V& t, const Dims&) { return t[0].transpose(0, 1).reshape({-1}); }, kElementwise, kCheckOnly},
          {OpId::permute, "[B,S,C] -> [C,B,S]", {{"B,S,C"}},
           [](const V& t, const Dims&) { return tg::mul(t[0].permute({2, 0, 1}), 2.0); }, kElementwise, kCheckOnly},
          {OpId::transpose, "outer dims", {{"B,1,C"}}, [](const V& t, const Dims&) { return t[0].transpose(-1, 0).contiguous(); },
           kElementwise, kCheckOnly},
          {OpId::narrow, "[B,S,3C] -> [B,S,C]", {{"B,S,3C"}},
           [](const V& t, const Dims& d) { return t[0].narrow(2, d.C, d.C); }},
          {OpId::narrow, "a leading slice", {{"S"}}, [](const V& t, const Dims&) { return t[0].narrow(0, 0, 1); },
           kElementwise, kCheckOnly},
          {OpId::expand, "column to [B,S,C]", {{"S,1"}},
           [](const V& t, const Dims& d) { return t[0].expand({d.B, d.S, d.C}).contiguous(); }, kReduction, kCheckOnly},
          {OpId::unsqueeze, "middle dim", {{"S,C"}}, [](const V& t, const Dims&) { return t[0].unsqueeze(1); },
           kElementwise, kCheckOnly},
          {OpId::squeeze, "of a transposed view", {{"C,1,S"}},
           [](const V& t, const Dims&) { return t[0].transpose(0, 2).squeeze(1).contiguous(); }, kElementwise, kCheckOnly},
          {OpId::contiguous, "heads [B,S,H,D] -> [B,H,S,D]", {{"B,S,C"}},
           [](const V& t, const Dims& d) { return t[0].view({d.B, d.S, d.H, d.D}).permute({0, 2, 1, 3}).contiguous(); }},
          // ---- copies
          {OpId::clone, "[B,S,C]", {{"B,S,C"}}, [](const V& t, const Dims&) { return tg::clone(t[0]); }},
          {OpId::cast, "through the other float type", {{"S,C", dyadic()}},
           [](const V& t, const Dims&) {
             const tg::DType other = t[0].dtype() == tg::DType::Float64 ? tg::DType::Float32 : tg::DType::Float64;
             return t[0].to(other).to(t[0].dtype());
           },
           kElementwise, kCheckOnly, false, 1.0 / 4096},  // x +- eps exact in float32: the differences are exact
          {OpId::to_device, "to the other device and back", {{"S,C"}},
           [](const V& t, const Dims&) {
             const tg::Device other = t[0].is_cuda() ? tg::Device::CPU : tg::Device::CUDA;
             return tg::mul(t[0].to(other), 3.0).to(t[0].device());
           },
           kElementwise, kCheckOnly, true},
          // ---- GEMMs
          {OpId::matmul, "q k^T [B,H,S,D]", {{"B,H,S,D"}, {"B,H,S,D"}},
           [](const V& t, const Dims&) { return tg::matmul(t[0], t[1].transpose(-1, -2)); }, kGemm},
          {OpId::matmul, "P v [B,H,S,S] x [B,H,S,D]", {{"B,H,S,S"}, {"B,H,S,D"}},
           [](const V& t, const Dims&) { return tg::matmul(t[0], t[1]); }, kGemm},
          {OpId::matmul, "views of a permuted projection (batch dims that do not merge)", {{"B,S,3C"}},
           qk_of_permuted_projection, kGemm},
          {OpId::matmul, "2-d", {{"S,C"}, {"C,N"}}, [](const V& t, const Dims&) { return tg::matmul(t[0], t[1]); }, kGemm,
           kCheckOnly},
          {OpId::matmul, "broadcast batch", {{"B,1,S,D"}, {"H,D,S"}},
           [](const V& t, const Dims&) { return tg::matmul(t[0], t[1]); }, kGemm, kCheckOnly},
          {OpId::matmul, "strided batch", {{"B,S,H,D"}, {"B,H,D,S"}},
           [](const V& t, const Dims&) { return tg::matmul(t[0].permute({0, 2, 1, 3}), t[1]); }, kGemm, kCheckOnly},
          {OpId::matmul, "size-1 dims", {{"1,D"}, {"D,1"}}, [](const V& t, const Dims&) { return tg::matmul(t[0], t[1]); },
           kGemm, kCheckOnly},
          {OpId::linear, "qkv projection [B,S,C] x [3C,C]", {{"B,S,C"}, {"3C,C", uniform(-0.1, 0.1)}, {"3C"}},
           [](const V& t, const Dims&) { return tg::linear(t[0], t[1], t[2]); }, kGemm},
          {OpId::linear, "no bias, one token", {{"1,C"}, {"N,C"}}, [](const V& t, const Dims&) { return tg::linear(t[0], t[1]); },
           kGemm, kCheckOnly},
          {OpId::linear, "non-contiguous x", {{"C,S"}, {"N,C"}, {"N"}},
           [](const V& t, const Dims&) { return tg::linear(t[0].transpose(0, 1), t[1], t[2]); }, kGemm, kCheckOnly},
          {OpId::linear_fp16, "qkv projection [B,S,C] x [3C,C]", {{"B,S,C"}, {"3C,C", uniform(-0.1, 0.1)}, {"3C"}},
           [](const V& t, const Dims&) { return tg::linear_fp16(t[0], t[1], t[2]); }, kHalfGemm},
          {OpId::linear_fp16, "no bias, one token", {{"1,C"}, {"N,C", uniform(-0.1, 0.1)}},
           [](const V& t, const Dims&) { return tg::linear_fp16(t[0], t[1]); }, kHalfGemm, kCheckOnly},
          {OpId::linear_fp16, "one token with a bias", {{"1,C"}, {"N,C", uniform(-0.1, 0.1)}, {"N"}},
           [](const V& t, const Dims&) { return tg::linear_fp16(t[0], t[1], t[2]); }, kHalfGemm, kCheckOnly},
          {OpId::linear_fp16, "a bias off a 16-byte boundary (added after the GEMM)",
           {{"S,C"}, {"N,C", uniform(-0.1, 0.1)}, {"2,N"}},
           [](const V& t, const Dims& d) { return tg::linear_fp16(t[0], t[1], t[2].reshape({-1}).narrow(0, 1, d.N)); },
           kHalfGemm, kCheckOnly},
          {OpId::linear_fp16, "non-contiguous x and weight", {{"C,S"}, {"C,N", uniform(-0.1, 0.1)}, {"N"}},
           [](const V& t, const Dims&) { return tg::linear_fp16(t[0].transpose(0, 1), t[1].transpose(0, 1), t[2]); },
           kHalfGemm, kCheckOnly},
          // ---- attention pieces
          {OpId::softmax, "[B,H,S,S]", {{"B,H,S,S"}}, [](const V& t, const Dims&) { return tg::softmax(t[0]); }},
          {OpId::softmax, "cuDNN on CUDA", {{"B,H,S,S"}},
           [](const V& t, const Dims&) {
             return tg::softmax(t[0], t[0].is_cuda() ? tg::SoftmaxImpl::Cudnn : tg::SoftmaxImpl::Native);
           },
           kElementwise, kParity | kBench},
          {OpId::softmax, "masked keys and a fully masked row", {{"B,S"}, no_grad("B,S", bernoulli(0.4))},
           [](const V& t, const Dims&) {
             tg::Tensor mask = t[1].clone();
             mask.narrow(0, 0, 1).fill_(1.0);  // row 0: every key masked
             return tg::softmax(tg::masked_fill(t[0], mask, -kInf));
           },
           kElementwise, kCheckOnly},
          {OpId::softmax, "rows of 1", {{"1,1"}}, [](const V& t, const Dims&) { return tg::softmax(t[0]); }, kElementwise,
           kParity},
          {OpId::softmax, "rows of 31", {{"5,31"}}, [](const V& t, const Dims&) { return tg::softmax(t[0]); }, kElementwise,
           kParity},
          {OpId::softmax, "rows of 1000 (in registers)", {{"3,7,1000"}}, [](const V& t, const Dims&) { return tg::softmax(t[0]); },
           kElementwise, kParity},
          {OpId::softmax, "rows of 2049 (streamed)", {{"2,4,2049"}}, [](const V& t, const Dims&) { return tg::softmax(t[0]); },
           kElementwise, kParity},
          {OpId::masked_fill, "keys of [B,H,S,S]", {{"B,H,S,S"}, no_grad("B,1,1,S", bernoulli(0.1))},
           [](const V& t, const Dims&) { return tg::masked_fill(t[0], t[1], -5.0); }},
          {OpId::masked_fill, "a row broadcast", {{"S,C"}, no_grad("1,C", bernoulli(0.5))},
           [](const V& t, const Dims&) { return tg::masked_fill(t[0], t[1], 3.0); }, kElementwise, kCheckOnly},
          {OpId::dropout, "Philox p = 0.1 on [B,H,S,S]", {{"B,H,S,S"}},
           [](const V& t, const Dims&) { return tg::dropout(t[0], {0.1, tg::PhiloxState{11, 5}}); }},
          {OpId::dropout, "explicit mask p = 0.3", {{"S,C"}, no_grad("S,C", bernoulli(0.7))},
           [](const V& t, const Dims&) { return tg::dropout(t[0], {0.3, std::nullopt, t[1]}); }, kElementwise, kCheckOnly},
          {OpId::edit_bias, "[B,H,S,S] from [H,M,M]",
           {{"H,M,M"}, {"H,1,1"}, {"H,1,1"}, no_grad("B,S", bernoulli(0.5))},
           [](const V& t, const Dims&) { return tg::edit_bias(t[0], t[1], t[2], t[3]); }, kReduction},
          {OpId::edit_bias, "S = M = 8 (the quad path)", {{"3,8,8"}, {"3,1,1"}, {"3,1,1"}, no_grad("2,8", bernoulli(0.5))},
           [](const V& t, const Dims&) { return tg::edit_bias(t[0], t[1], t[2], t[3]); }, kReduction, kCheckOnly},
          {OpId::edit_bias, "S = 7, M = 9 (tails)", {{"2,9,9"}, {"2,1,1"}, {"2,1,1"}, no_grad("3,7", bernoulli(0.5))},
           [](const V& t, const Dims&) { return tg::edit_bias(t[0], t[1], t[2], t[3]); }, kReduction, kCheckOnly},
          {OpId::layer_norm, "[B,S,C] with weight and bias", {{"B,S,C"}, {"C"}, {"C"}},
           [](const V& t, const Dims&) { return tg::layer_norm(t[0], t[1], t[2]); }, kReduction},
          {OpId::layer_norm, "no affine", {{"B,S,C"}}, [](const V& t, const Dims&) { return tg::layer_norm(t[0]); },
           kReduction, kCheckOnly},
          {OpId::mse_loss, "[B,S,C]", {{"B,S,C"}, {"B,S,C"}},
           [](const V& t, const Dims&) { return tg::mse_loss(t[0], t[1]); }, kReduction},
          // ---- the fused attention core (masked keys; dropout p = 0.1 from a fixed draw)
          {OpId::fused_attention, "masked keys, p = 0.1",
           {{"B,S,3C"}, no_grad("B,S", bernoulli(0.5)), no_grad("B,S", bernoulli(0.85)), {"H,M,M", uniform(-0.5, 0.5)},
            {"H,1,1"}, {"H,1,1"}},
           [](const V& t, const Dims& d) {
             return tg::fused_attention(t[0], t[1], t[2], t[3], t[4], t[5], d.H, {0.1, tg::PhiloxState{7, 3}});
           },
           kGemm},
          {OpId::fused_attention, "p = 0, a fully masked batch",
           {{"B,S,3C"}, no_grad("B,S", bernoulli(0.5)), no_grad("B,S", bernoulli(1.0)), {"H,M,M"}, {"H,1,1"}, {"H,1,1"}},
           [](const V& t, const Dims& d) {
             tg::Tensor a = t[2].clone();
             a.narrow(0, 0, 1).fill_(0.0);
             return tg::fused_attention(t[0], t[1], a, t[3], t[4], t[5], d.H);
           },
           kGemm, kCheckOnly},
          fused_qkv_masked_row("projection and core, masked keys, p = 0.1", tg::MatmulPrecision::Default, kGemm,
                               kAllUses),
          {OpId::fused_qkv_attention, "no bias, p = 0, a fully masked batch",
           {{"B,S,C"}, {"3C,C", uniform(-0.1, 0.1)}, no_grad("B,S", bernoulli(0.5)), no_grad("B,S", bernoulli(1.0)),
            {"H,M,M"}, {"H,1,1"}, {"H,1,1"}},
           [](const V& t, const Dims& d) {
             tg::Tensor a = t[3].clone();
             a.narrow(0, 0, 1).fill_(0.0);
             return tg::fused_qkv_attention(t[0], t[1], tg::Tensor(), t[2], a, t[4], t[5], t[6], d.H);
           },
           kGemm, kCheckOnly},
          fused_qkv_masked_row("at \"high\": fp16 key gradients joined into one fp16 dqkv on CUDA",
                               tg::MatmulPrecision::High, kHalfAttention, kParity),
          fused_layer_masked_row("both projections and the core, masked keys, p = 0.1",
                                 tg::MatmulPrecision::Default, kGemm, kAllUses),
          fused_layer_masked_row("at \"high\": one node, the out-projection reading the forward kernel's fp16 o",
                                 tg::MatmulPrecision::High, kHalfAttention, kParity),
          {OpId::fused_attention_layer, "at \"high\": no biases, p = 0, a fully masked batch",
           {{"B,S,C"}, {"3C,C", uniform(-0.1, 0.1)}, no_grad("B,S", bernoulli(0.5)), no_grad("B,S", bernoulli(1.0)),
            {"H,M,M"}, {"H,1,1"}, {"H,1,1"}, {"C,C", uniform(-0.1, 0.1)}},
           [](const V& t, const Dims& d) {
             tg::Tensor a = t[3].clone();
             a.narrow(0, 0, 1).fill_(0.0);
             return tg::fused_attention_layer(t[0], t[1], tg::Tensor(), t[2], a, t[4], t[5], t[6], t[7],
                                              tg::Tensor(), d.H, {}, tg::MatmulPrecision::High);
           },
           kHalfAttention, kCheckOnly},
      });
}

}  // namespace

Dims dims_for(Use use) {
  switch (use) {
    case kGradcheck: return {2, 2, 5, 4, 2, 7, 6};
    case kParity: return {3, 4, 37, 256, 64, 45, 1000};  // D = 64: the fused CUDA kernels' head dim
    case kBench: return {8, 16, 512, 1024, 64, 1024, 1024};
    default: return {};
  }
}

tg::Shape resolve_shape(const std::string& shape, const Dims& d) {
  tg::Shape out;
  std::stringstream ss(shape);
  std::string part;
  while (std::getline(ss, part, ',')) {
    size_t digits = 0;
    while (digits < part.size() && std::isdigit(static_cast<unsigned char>(part[digits]))) ++digits;
    const int64_t factor = digits ? std::stoll(part.substr(0, digits)) : 1;
    const std::string dim = part.substr(digits);
    const int64_t size = dim.empty() ? 1 : dim == "B" ? d.B : dim == "H" ? d.H : dim == "S" ? d.S : dim == "C" ? d.C
                       : dim == "D" ? d.D : dim == "M" ? d.M : dim == "N" ? d.N : -1;
    TG_CHECK(size >= 0, "op table: unknown dim '", dim, "' in shape '", shape, "'");
    out.push_back(factor * size);
  }
  return out;
}

V make_inputs(const OpCase& c, Use use, tg::DType dtype) {
  const Dims d = dims_for(use);
  V out;
  for (const Input& in : c.inputs) {
    const tg::Shape s = resolve_shape(in.shape, d);
    tg::Tensor t;
    switch (in.draw.kind) {
      case Draw::Normal: t = tg::randn(s, {dtype}); break;
      case Draw::Uniform: t = tg::add(tg::mul(tg::rand(s, {dtype}), in.draw.b - in.draw.a), in.draw.a); break;
      case Draw::Bernoulli: t = tg::dropout_mask(s, 1.0 - in.draw.a, tg::default_generator().next(), {dtype}); break;
      case Draw::Dyadic: {  // k / 256 for k in [-512, 512): exact in float32
        std::vector<double> v = tg::rand(s, {tg::DType::Float64}).to_vector();
        for (double& x : v) x = std::floor(x * 1024 - 512) / 256;
        t = tg::from_vector(v, s, {dtype});
        break;
      }
    }
    out.push_back(t.requires_grad_(in.requires_grad));
  }
  return out;
}

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = build_cases();
  return cases;
}

std::vector<const OpCase*> cases_of(tg::OpId op, Use use) {
  std::vector<const OpCase*> out;
  for (const OpCase& c : op_cases())
    if (c.op == op && (c.uses & use)) out.push_back(&c);
  return out;
}

std::string case_name(const OpCase& c) { return std::string(tg::op_name(c.op)) + " (" + c.variant + ")"; }

}  // namespace tgtest
