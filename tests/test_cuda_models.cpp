// The toy edit-diffusion model (models/edit_model.h) on CUDA against the CPU:
// the velocity and every parameter's gradient, with the attention core
// decomposed and fused; then the demo's train_step on the GPU lowering the loss.
#include <memory>

#include "cuda_helpers.h"

using namespace tgtest;
namespace toy = tg::toy;

namespace {

// Head dim 64, so the fused kernels take the attention on the GPU.
const toy::EditModelConfig kConfig{.hidden = 128, .heads = 2, .depth = 2};

// A model whose every parameter is random (a new one's adaLN and final layers
// are zeros, which would leave most gradients zero and the check toothless).
std::unique_ptr<toy::EditDiT> random_model(uint64_t seed, tg::AttentionImpl impl) {
  tg::manual_seed(seed);
  auto model = std::make_unique<toy::EditDiT>(
      toy::EditModelConfig{.hidden = kConfig.hidden, .heads = kConfig.heads, .depth = kConfig.depth, .attention = impl});
  tg::NoGradGuard no_grad;
  for (tg::Tensor& p : model->parameters()) p.copy_(tg::mul(tg::randn(p.shape()), 0.05));
  return model;
}

struct Inputs {
  tg::Tensor noisy, source, t, edit_mask, seed;
  std::vector<int64_t> colour;
};

Inputs random_inputs(int64_t B) {
  const toy::EditBatch batch = toy::make_edit_batch(11, 0, B);
  const tg::Tensor source = tg::nn::patchify(batch.source, toy::kPatchSize);
  return {tg::randn(source.shape()), source, tg::rand({B}), batch.edit_mask, tg::randn(source.shape()), batch.colour};
}

Inputs on_cuda(const Inputs& in) {
  return {in.noisy.cuda(), in.source.cuda(), in.t.cuda(), in.edit_mask.cuda(), in.seed.cuda(), in.colour};
}

tg::Tensor velocity(const toy::EditDiT& model, const Inputs& in) {
  return model.forward(in.noisy, in.source, in.t, in.colour, in.edit_mask);
}

}  // namespace

TEST_CASE("cuda/toy EditDiT: velocity and every parameter gradient vs CPU, decomposed and fused" *
          doctest::skip(kNoGpu)) {
  const PrecisionScope fp32("highest");
  tg::manual_seed(21);
  const Inputs cpu_in = random_inputs(3), gpu_in = on_cuda(cpu_in);
  const auto reference = random_model(5, tg::AttentionImpl::Decomposed);
  const tg::Tensor v_cpu = velocity(*reference, cpu_in);
  v_cpu.backward(cpu_in.seed);
  const auto expected = reference->named_parameters();
  for (const auto& [name, p] : expected) {
    CAPTURE(name);
    CHECK(max_abs_diff(p.grad(), tg::zeros_like(p)) > 0);  // every parameter's gradient is exercised
  }
  for (const tg::AttentionImpl impl : {tg::AttentionImpl::Decomposed, tg::AttentionImpl::Fused}) {
    CAPTURE(static_cast<int>(impl));
    const auto model = random_model(5, impl);
    model->to(tg::Device::CUDA);
    const tg::Tensor v_gpu = velocity(*model, gpu_in);
    REQUIRE(v_gpu.is_cuda());
    CHECK(parity_error(v_gpu, v_cpu, {1e-5, 1e-4}) <= 1.0);
    v_gpu.backward(gpu_in.seed);
    const auto got = model->named_parameters();
    REQUIRE(got.size() == expected.size());
    for (size_t i = 0; i < got.size(); ++i) {
      CAPTURE(got[i].first);
      REQUIRE(got[i].second.grad().defined());
      CHECK(parity_error(got[i].second.grad(), expected[i].second.grad(), {1e-5, 1e-3}) <= 1.0);
    }
  }
}

TEST_CASE("cuda/toy train_step: the loss falls on the GPU with the fused attention" * doctest::skip(kNoGpu)) {
  const PrecisionScope tf32("high");
  tg::manual_seed(3);
  const tg::TensorOptions opts{tg::DType::Float32, tg::Device::CUDA};
  toy::EditDiT model({.attention = tg::AttentionImpl::Fused}, opts);
  tg::optim::AdamW optimizer(model.parameters(), {.lr = 1e-3});
  std::vector<double> losses;
  for (int64_t step = 0; step < 60; ++step)
    losses.push_back(toy::train_step(model, optimizer, toy::make_edit_batch(1, step * 32, 32, opts)).loss);
  const double first = (losses[0] + losses[1] + losses[2]) / 3, last = (losses[57] + losses[58] + losses[59]) / 3;
  MESSAGE("mean loss of the first 3 steps " << first << ", of the last 3 " << last);
  for (const tg::Tensor& p : model.parameters()) REQUIRE(p.is_cuda());
  CHECK(last <= 0.6 * first);
}
