#include "attention_problem.h"

#include <cmath>
#include <tuple>

namespace tgtest {

using tg::fused::BackwardInputs;
using tg::fused::Gradients;

BackwardInputs make_backward_inputs(const Spec& s, tg::Tensor edit, tg::Tensor attn, tg::Tensor keep) {
  tg::NoGradGuard no_grad;
  const tg::TensorOptions cuda{tg::DType::Float32, tg::Device::CUDA};
  const int64_t D = s.C / s.H;
  auto small = [&](const tg::Shape& shape) { return tg::mul(tg::randn(shape, cuda), 0.02); };
  BackwardInputs in;
  in.grad_output = tg::randn({s.B, s.S, s.C}, cuda);
  in.hidden_states = tg::randn({s.B, s.S, s.C}, cuda);
  in.edit_region_mask = edit.defined() ? edit.cuda() : tg::dropout_mask({s.B, s.S}, 0.5, tg::default_generator().next(), cuda);
  in.qkv_weight = small({3 * s.C, s.C});
  in.qkv_bias = tg::zeros({3 * s.C}, cuda);
  in.out_weight = small({s.C, s.C});
  in.out_bias = tg::zeros({s.C}, cuda);
  in.edit_region_bias = small({s.H, s.M, s.M});
  in.within_edit_bias = small({s.H, 1, 1});
  in.cross_edit_bias = small({s.H, 1, 1});
  in.attention_mask = attn.defined() ? attn.cuda() : tg::ones({s.B, s.S}, cuda);
  in.dropout_mask =
      keep.defined() ? keep.cuda() : tg::dropout_mask({s.B, s.H, s.S, s.S}, s.p, tg::default_generator().next(), cuda);
  const tg::Tensor qkv = tg::linear(in.hidden_states, in.qkv_weight, in.qkv_bias, tg::MatmulPrecision::Highest)
                             .view({s.B, s.S, 3, s.H, D})
                             .permute({2, 0, 3, 1, 4});
  in.query = qkv.narrow(0, 0, 1).squeeze(0).contiguous();
  in.key = qkv.narrow(0, 1, 1).squeeze(0).contiguous();
  in.value = qkv.narrow(0, 2, 1).squeeze(0).contiguous();
  tg::Tensor scores = tg::mul(tg::matmul(in.query, in.key.transpose(-1, -2), tg::MatmulPrecision::Highest),
                              1 / std::sqrt(double(D)));
  scores = tg::add(scores, tg::edit_bias(in.edit_region_bias, in.within_edit_bias, in.cross_edit_bias, in.edit_region_mask));
  in.attention_scores = tg::masked_fill(scores, tg::add(tg::neg(in.attention_mask), 1.0).view({s.B, 1, 1, s.S}), -INFINITY);
  in.attention_probs = tg::softmax(in.attention_scores);
  in.attention_probs_dropped = s.p > 0 ? tg::dropout(in.attention_probs, {s.p, std::nullopt, in.dropout_mask})
                                       : in.attention_probs.clone();
  in.attention_output = tg::matmul(in.attention_probs_dropped, in.value, tg::MatmulPrecision::Highest)
                            .permute({0, 2, 1, 3})
                            .reshape({s.B, s.S, s.C});
  return in;
}

Gradients reference_backward(const BackwardInputs& in32, double scale, double p, tg::DType dtype) {
  tg::NoGradGuard no_grad;
  std::vector<tg::Tensor> t = inputs_of(in32);
  for (tg::Tensor& x : t) x = x.to(dtype);
  const auto& [dy, x, e, Wqkv, bqkv, Wo, bo, E, w_in, w_x, a, q, k, v, scores, P, Pd, o, m] =
      std::tie(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], t[10], t[11], t[12], t[13], t[14], t[15],
               t[16], t[17], t[18]);
  const auto hi = tg::MatmulPrecision::Highest;
  const int64_t B = x.size(0), S = x.size(1), C = x.size(2), H = E.size(0), M = E.size(1), D = C / H;
  Gradients g;
  g.out_bias = tg::sum(dy, {0, 1});
  g.out_weight = tg::matmul(dy.reshape({B * S, C}).transpose(0, 1), o.reshape({B * S, C}), hi);
  const tg::Tensor dO = tg::matmul(dy, Wo, hi).view({B, S, H, D}).permute({0, 2, 1, 3});
  const tg::Tensor dPd = tg::matmul(dO, v.transpose(-1, -2), hi), dv = tg::matmul(Pd.transpose(-1, -2), dO, hi);
  const tg::Tensor dP = p > 0 ? tg::mul(tg::mul(dPd, m), 1 / (1 - p)) : dPd;
  tg::Tensor dS = tg::mul(P, tg::sub(dP, tg::sum(tg::mul(dP, P), {3}, true)));
  dS = tg::masked_fill(dS, tg::add(tg::neg(a), 1.0).view({B, 1, 1, S}), 0.0);
  g.edit_region_bias = tg::zeros({H, M, M}, {dtype, x.device()});
  g.edit_region_bias.narrow(1, 0, S).narrow(2, 0, S).copy_(tg::sum(dS, {0}));
  const tg::Tensor ei = e.view({B, 1, S, 1}), ej = e.view({B, 1, 1, S});
  const tg::Tensor both = tg::mul(ei, ej), one = tg::sub(tg::add(ei, ej), tg::mul(both, 2.0));
  g.within_edit_bias = tg::sum(tg::mul(dS, both), {0, 2, 3}).view({H, 1, 1});
  g.cross_edit_bias = tg::sum(tg::mul(dS, one), {0, 2, 3}).view({H, 1, 1});
  const tg::Tensor dq = tg::mul(tg::matmul(dS, k, hi), scale), dk = tg::mul(tg::matmul(dS.transpose(-1, -2), q, hi), scale);
  const std::vector<tg::Tensor> parts{dq, dk, dv};
  tg::Tensor stacked = tg::zeros({B, S, 3, H, D}, {dtype, x.device()});
  for (int64_t i = 0; i < 3; ++i) stacked.narrow(2, i, 1).squeeze(2).copy_(parts[i].permute({0, 2, 1, 3}));
  const tg::Tensor dq_rows = stacked.view({B * S, 3 * C});
  g.qkv_bias = tg::sum(dq_rows, {0});
  g.qkv_weight = tg::matmul(dq_rows.transpose(0, 1), x.reshape({B * S, C}), hi);
  g.hidden_states = tg::matmul(dq_rows, Wqkv, hi).view({B, S, C});
  return g;
}

}  // namespace tgtest
