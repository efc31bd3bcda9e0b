// The main demo: region-aware self-attention with edit bias as a graph of small
// ops. Runs forward and backward on the CPU (and on CUDA when a GPU is present),
// checks the gradient numerically on a tiny float64 instance, and prints a summary.
#include <cmath>
#include <iostream>

#include "tapegrad.h"

namespace {

struct Inputs {
  tg::Tensor x, edit_mask, attn_mask;
};

Inputs make_inputs(int64_t B, int64_t S, int64_t C, tg::TensorOptions opts) {
  Inputs in;
  in.x = tg::randn({B, S, C}, opts);
  in.edit_mask = tg::dropout_mask({B, S}, 0.5, tg::default_generator().next(), opts);  // Bernoulli(0.5)
  in.attn_mask = tg::ones({B, S}, opts);
  return in;
}

double run(const Inputs& in, const tg::RegionAttentionParams& p, double dropout_p) {
  const tg::Tensor y = tg::region_attention_decomposed(in.x, in.edit_mask, in.attn_mask, p, {dropout_p});
  const tg::Tensor loss = tg::mean(y * y);
  loss.backward();
  return loss.item();
}

}  // namespace

int main() {
  tg::manual_seed(42);
  const tg::RegionAttentionConfig cfg{64, 4, 32};
  const int64_t B = 2, S = 24;

  std::cout << "tapegrad: region-aware attention, B=" << B << " S=" << S << " C=" << cfg.hidden
            << " H=" << cfg.heads << " M=" << cfg.max_positions << "\n";
  auto params = tg::RegionAttentionParams::init(cfg);
  const Inputs in = make_inputs(B, S, cfg.hidden, {});
  const double loss = run(in, params, 0.1);
  std::cout << "cpu  loss " << loss << ", |dWqkv| " << std::sqrt(tg::sum(params.qkv_weight.grad() * params.qkv_weight.grad()).item())
            << ", |dE| " << std::sqrt(tg::sum(params.edit_region_bias.grad() * params.edit_region_bias.grad()).item())
            << ", dw_in[0] " << params.within_edit_bias.grad().at({0, 0, 0}) << "\n";

  // Numerical check of the whole layer's gradient on a tiny float64 instance.
  const tg::RegionAttentionConfig tiny{8, 2, 5};
  const auto p64 = tg::RegionAttentionParams::init(tiny, {tg::DType::Float64});
  const Inputs in64 = make_inputs(2, 4, tiny.hidden, {tg::DType::Float64});
  std::vector<tg::Tensor> leaves = p64.parameters();
  leaves.push_back(in64.x.detach().requires_grad_());
  const auto check = tg::gradcheck([&](const std::vector<tg::Tensor>& t) {
    tg::RegionAttentionParams p{t[0], t[1], t[2], t[3], t[4], t[5], t[6], tiny.heads};
    return tg::region_attention_decomposed(t[7], in64.edit_mask, in64.attn_mask, p);
  }, leaves);
  std::cout << "gradcheck (float64, " << check.elements_checked << " elements): " << (check.ok ? "ok" : "FAILED")
            << (check.ok ? "" : " " + check.report) << "\n";

  if (tg::cuda::is_available()) {
    for (tg::Tensor& t : params.parameters()) t.zero_grad();
    auto gpu = params;
    for (tg::Tensor* t : {&gpu.qkv_weight, &gpu.qkv_bias, &gpu.out_weight, &gpu.out_bias, &gpu.edit_region_bias,
                          &gpu.within_edit_bias, &gpu.cross_edit_bias})
      *t = t->cuda().detach().requires_grad_();
    const Inputs in_gpu{in.x.cuda(), in.edit_mask.cuda(), in.attn_mask.cuda()};
    std::cout << "cuda loss " << run(in_gpu, gpu, 0.0) << " (p = 0)\n";
  } else {
    std::cout << "cuda: no GPU here, skipped\n";
  }
  return check.ok ? 0 : 1;
}
