// The decomposed attention layer on CUDA against the CPU, and the caching
// allocator over a training loop.
#include "cuda_helpers.h"

using namespace tgtest;

namespace {

struct Batch {
  tg::Tensor x, e, a;
};

Batch make_batch(int64_t B, int64_t S, int64_t C) {
  Batch b{tg::randn({B, S, C}), tg::dropout_mask({B, S}, 0.5, {8, 8}), tg::ones({B, S})};
  b.a.narrow(1, S - 3, 2).fill_(0.0);  // two masked keys
  return b;
}

tg::RegionAttentionParams to_device(const tg::RegionAttentionParams& p, tg::Device d) {
  tg::RegionAttentionParams q = p;
  for (tg::Tensor* t : {&q.qkv_weight, &q.qkv_bias, &q.out_weight, &q.out_bias, &q.edit_region_bias, &q.within_edit_bias,
                        &q.cross_edit_bias})
    *t = t->detach().to(d).requires_grad_();
  return q;
}

}  // namespace

TEST_CASE("cuda/region_attention: decomposed layer, forward and every gradient vs CPU" * doctest::skip(kNoGpu)) {
  tg::manual_seed(7);
  const tg::RegionAttentionConfig cfg{128, 4, 80};
  const auto params = tg::RegionAttentionParams::init(cfg);
  const Batch batch = make_batch(2, 77, cfg.hidden);
  for (double p : {0.0, 0.1}) {
    CAPTURE(p);
    auto cpu = to_device(params, tg::Device::CPU), gpu = to_device(params, tg::Device::CUDA);
    const tg::PhiloxState rng{3, 1};
    const tg::Tensor x_cpu = batch.x.detach().clone().requires_grad_(), x_gpu = batch.x.cuda().requires_grad_();
    const tg::Tensor y_cpu = tg::region_attention_decomposed(x_cpu, batch.e, batch.a, cpu, {p, rng});
    const tg::Tensor y_gpu = tg::region_attention_decomposed(x_gpu, batch.e.cuda(), batch.a.cuda(), gpu, {p, rng});
    const Tolerance tol{2e-5, 1e-4};
    CHECK(parity_error(y_gpu, y_cpu, tol) <= 1.0);
    const tg::Tensor dy = tg::randn(y_cpu.shape());
    y_cpu.backward(dy);
    y_gpu.backward(dy.cuda());
    CHECK(parity_error(x_gpu.grad(), x_cpu.grad(), tol) <= 1.0);
    const auto pc = cpu.parameters(), pg = gpu.parameters();
    for (size_t i = 0; i < pc.size(); ++i) {
      CAPTURE(i);
      CHECK(parity_error(pg[i].grad(), pc[i].grad(), {1e-4, 1e-3}) <= 1.0);
    }
  }
}

TEST_CASE("cuda/memory: 100 training steps allocate no device memory after the first" *
          doctest::skip(kNoGpu || !tg::cuda::caching_enabled())) {
  tg::manual_seed(9);
  const tg::RegionAttentionConfig cfg{64, 4, 40};
  auto params = to_device(tg::RegionAttentionParams::init(cfg), tg::Device::CUDA);
  const Batch host = make_batch(2, 33, cfg.hidden);
  const Batch batch{host.x.cuda(), host.e.cuda(), host.a.cuda()};
  const tg::Tensor target = tg::randn({2, 33, cfg.hidden}).cuda();
  auto step = [&] {
    const tg::Tensor loss = tg::mse_loss(tg::region_attention_decomposed(batch.x, batch.e, batch.a, params, {0.1}), target);
    loss.backward();
    tg::NoGradGuard no_grad;
    for (tg::Tensor& p : params.parameters()) {
      p.add_(p.grad(), -0.05);
      p.zero_grad();
    }
    return loss.item();
  };
  const double first_loss = step();
  const size_t allocs_after_first = tg::cuda::memory_stats().device_allocs;
  double last_loss = first_loss;
  for (int i = 1; i < 100; ++i) last_loss = step();
  const tg::cuda::MemoryStats stats = tg::cuda::memory_stats();
  CHECK(stats.device_allocs == allocs_after_first);  // every later step found its blocks in the cache
  // What is still allocated is exactly what this test holds: the parameters
  // (their gradients were dropped), the batch and the target; nothing leaked.
  std::vector<tg::Tensor> held = params.parameters();
  for (const tg::Tensor& t : {batch.x, batch.e, batch.a, target}) held.push_back(t);
  size_t held_bytes = 0;
  for (const tg::Tensor& t : held) held_bytes += tg::cuda::allocation_size(t.numel() * sizeof(float));
  CHECK(stats.live_blocks == held.size());
  CHECK(stats.allocated == held_bytes);
  CHECK(last_loss < first_loss);  // and it trains
}
