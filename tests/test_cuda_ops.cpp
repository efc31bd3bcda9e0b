// cuda/<op>: every op's CUDA forward and backward against the CPU op on random
// data: several shapes, broadcasting, sizes that are not multiples of the block
// size, non-contiguous inputs. Every device allocation is poisoned with NaN
// (tests/main_cuda.cpp), so an output element a kernel did not write fails.
#include <limits>

#include "cuda_helpers.h"
#ifdef TG_CUDA
#include "core/cuda_context.h"
#endif

using namespace tgtest;
using V = std::vector<tg::Tensor>;

namespace {
constexpr Tolerance kElementwise{1e-6, 1e-5};
constexpr Tolerance kReduction{1e-4, 1e-4};
constexpr Tolerance kGemm{1e-4, 1e-4};

void parity_binary(tg::Tensor (*op)(const tg::Tensor&, const tg::Tensor&), bool positive_b) {
  const std::vector<std::pair<tg::Shape, tg::Shape>> shapes = {
      {{1000}, {1000}}, {{3, 257}, {257}}, {{5, 1, 33}, {7, 1}}, {{1}, {4097}}, {{8, 16, 64}, {8, 1, 64}}};
  for (const auto& [sa, sb] : shapes) {
    CAPTURE(tg::to_string(sa));
    CAPTURE(tg::to_string(sb));
    expect_parity([op](const V& t) { return op(t[0], t[1]); },
                  {randn32(sa), positive_b ? uniform32(sb, 0.5, 2) : randn32(sb)}, kElementwise);
  }
  expect_parity([op](const V& t) { return op(t[0].transpose(0, 1), t[1]); },  // non-contiguous
                {randn32({33, 17}), positive_b ? uniform32({17, 33}, 0.5, 2) : randn32({17, 33})}, kElementwise);
}

void parity_unary(tg::Tensor (*op)(const tg::Tensor&), double lo, double hi) {
  for (const tg::Shape& s : {tg::Shape{1}, tg::Shape{1000}, tg::Shape{3, 4097}, tg::Shape{64, 1024}}) {
    CAPTURE(tg::to_string(s));
    expect_parity([op](const V& t) { return op(t[0]); }, {uniform32(s, lo, hi)}, kElementwise);
  }
  expect_parity([op](const V& t) { return op(t[0].permute({2, 0, 1})); }, {uniform32({5, 6, 7}, lo, hi)}, kElementwise);
}
}  // namespace

TEST_CASE("cuda/add" * doctest::skip(kNoGpu)) { parity_binary(tg::add, false); }
TEST_CASE("cuda/sub" * doctest::skip(kNoGpu)) { parity_binary(tg::sub, false); }
TEST_CASE("cuda/mul" * doctest::skip(kNoGpu)) {
  parity_binary(tg::mul, false);
  expect_parity([](const V& t) { return tg::mul(t[0], 0.37); }, {randn32({999})}, kElementwise);
  expect_parity([](const V& t) { return tg::add(t[0], -2.5); }, {randn32({999})}, kElementwise);
}
TEST_CASE("cuda/div" * doctest::skip(kNoGpu)) { parity_binary(tg::div, true); }
TEST_CASE("cuda/exp" * doctest::skip(kNoGpu)) { parity_unary(tg::exp, -3, 3); }
TEST_CASE("cuda/log" * doctest::skip(kNoGpu)) { parity_unary(tg::log, 0.1, 4); }
TEST_CASE("cuda/tanh" * doctest::skip(kNoGpu)) { parity_unary(tg::tanh, -3, 3); }
TEST_CASE("cuda/relu" * doctest::skip(kNoGpu)) { parity_unary(tg::relu, -3, 3); }
TEST_CASE("cuda/gelu" * doctest::skip(kNoGpu)) { parity_unary(tg::gelu, -4, 4); }
TEST_CASE("cuda/silu" * doctest::skip(kNoGpu)) { parity_unary(tg::silu, -4, 4); }

TEST_CASE("cuda/matmul" * doctest::skip(kNoGpu)) {
  expect_parity([](const V& t) { return tg::matmul(t[0], t[1]); }, {randn32({33, 65}), randn32({65, 17})}, kGemm);
  expect_parity([](const V& t) { return tg::matmul(t[0], t[1]); }, {randn32({3, 5, 31, 64}), randn32({3, 5, 64, 29})}, kGemm);
  expect_parity([](const V& t) { return tg::matmul(t[0], t[1]); }, {randn32({2, 1, 7, 9}), randn32({4, 9, 3})}, kGemm);
  expect_parity([](const V& t) { return tg::matmul(t[0], t[1].transpose(-1, -2)); },  // q k^T
                {randn32({2, 4, 37, 16}), randn32({2, 4, 37, 16})}, kGemm);
  expect_parity([](const V& t) { return tg::matmul(t[0].permute({0, 2, 1, 3}), t[1]); },  // strided batch
                {randn32({2, 13, 3, 8}), randn32({2, 3, 8, 5})}, kGemm);
  expect_parity([](const V& t) { return tg::matmul(t[0], t[1]); }, {randn32({1, 64}), randn32({64, 1})}, kGemm);
}

TEST_CASE("cuda/matmul precision: TF32 is close to fp32, fp32 matches the CPU" * doctest::skip(kNoGpu)) {
  const tg::Tensor a = tg::randn({256, 512}), b = tg::randn({512, 128});
  const tg::Tensor cpu = tg::matmul(a, b);
  const tg::Tensor highest = tg::matmul(a.cuda(), b.cuda(), tg::MatmulPrecision::Highest);
  const tg::Tensor high = tg::matmul(a.cuda(), b.cuda(), tg::MatmulPrecision::High);
  CHECK(parity_error(highest, cpu, kGemm) <= 1.0);
  const double tf32_err = max_abs_diff(high, cpu), fp32_err = max_abs_diff(highest, cpu);
  CHECK(tf32_err < 0.5);        // TF32: 10-bit mantissa products over k = 512
  CHECK(tf32_err > fp32_err);   // ... and visibly less exact than fp32
  tg::set_float32_matmul_precision("high");
  CHECK(max_abs_diff(tg::matmul(a.cuda(), b.cuda()), high) == 0.0);  // the global default follows
  tg::set_float32_matmul_precision("highest");
  CHECK(max_abs_diff(tg::matmul(a.cuda(), b.cuda()), highest) == 0.0);
}

TEST_CASE("cuda/linear" * doctest::skip(kNoGpu)) {
  expect_parity([](const V& t) { return tg::linear(t[0], t[1], t[2]); }, {randn32({2, 37, 64}), randn32({96, 64}), randn32({96})}, kGemm);
  expect_parity([](const V& t) { return tg::linear(t[0], t[1]); }, {randn32({5, 33}), randn32({7, 33})}, kGemm);
  expect_parity([](const V& t) { return tg::linear(t[0].transpose(0, 1), t[1], t[2]); },
                {randn32({16, 9}), randn32({4, 16}), randn32({4})}, kGemm);
}

TEST_CASE("cuda/sum" * doctest::skip(kNoGpu)) {
  expect_parity([](const V& t) { return tg::sum(t[0]); }, {randn32({4097})}, kReduction);
  expect_parity([](const V& t) { return tg::sum(t[0], {1}); }, {randn32({7, 1000, 3})}, kReduction);
  expect_parity([](const V& t) { return tg::sum(t[0], {0, 2}, true); }, {randn32({33, 5, 65})}, kReduction);
  expect_parity([](const V& t) { return tg::sum(t[0].transpose(0, 1), {-1}); }, {randn32({300, 7})}, kReduction);
  expect_parity([](const V& t) { return tg::sum(t[0], {0, 1}); }, {randn32({3, 70, 40})}, kReduction);  // column sums
  expect_parity([](const V& t) { return tg::sum(t[0], {1}); }, {randn32({3, 100000})}, kReduction);     // split rows
}

TEST_CASE("cuda/mean" * doctest::skip(kNoGpu)) {
  expect_parity([](const V& t) { return tg::mean(t[0]); }, {randn32({3, 333})}, kReduction);
  expect_parity([](const V& t) { return tg::mean(t[0], {0}); }, {randn32({513, 9})}, kReduction);
}

TEST_CASE("cuda/reshape" * doctest::skip(kNoGpu)) {
  expect_parity([](const V& t) { return t[0].transpose(0, 1).reshape({-1, 5}); }, {randn32({10, 7})}, kElementwise);
}
TEST_CASE("cuda/permute" * doctest::skip(kNoGpu)) {
  expect_parity([](const V& t) { return tg::mul(t[0].permute({2, 0, 1}), 2.0); }, {randn32({3, 5, 7})}, kElementwise);
}
TEST_CASE("cuda/transpose" * doctest::skip(kNoGpu)) {
  expect_parity([](const V& t) { return t[0].transpose(0, 2).contiguous(); }, {randn32({3, 5, 7})}, kElementwise);
}
TEST_CASE("cuda/narrow" * doctest::skip(kNoGpu)) {
  expect_parity([](const V& t) { return t[0].narrow(1, 2, 3).contiguous(); }, {randn32({4, 9, 5})}, kElementwise);
}
TEST_CASE("cuda/expand" * doctest::skip(kNoGpu)) {
  expect_parity([](const V& t) { return t[0].expand({6, 3, 5}).contiguous(); }, {randn32({3, 1})}, kReduction);
}

TEST_CASE("cuda/softmax" * doctest::skip(kNoGpu)) {
  for (const tg::Shape& s : {tg::Shape{1, 1}, tg::Shape{5, 31}, tg::Shape{3, 7, 1000}, tg::Shape{2, 4, 2049}}) {
    CAPTURE(tg::to_string(s));
    expect_parity([](const V& t) { return tg::softmax(t[0]); }, {randn32(s)}, kElementwise);
  }
  SUBCASE("masked keys and a fully masked row give zeros") {
    tg::Tensor mask = tg::dropout_mask({6, 37}, 0.5, {5, 5});  // 1 = masked
    mask.narrow(0, 2, 1).fill_(1.0);                          // row 2: every key masked
    expect_parity([mask](const V& t) { return tg::softmax(tg::masked_fill(t[0], mask.to(t[0].device()), -INFINITY)); },
                  {randn32({6, 37})}, kElementwise);
  }
}

TEST_CASE("cuda/softmax cuDNN agrees with the hand-written kernel" * doctest::skip(kNoGpu)) {
  for (const tg::Shape& s : {tg::Shape{5, 31}, tg::Shape{3, 7, 1000}}) {
    const tg::Tensor x = tg::randn(s).cuda().requires_grad_();
    const tg::Tensor x2 = x.detach().clone().requires_grad_();
    const tg::Tensor y = tg::softmax(x, tg::SoftmaxImpl::Native), y2 = tg::softmax(x2, tg::SoftmaxImpl::Cudnn);
    CHECK(parity_error(y2, y, kElementwise) <= 1.0);
    const tg::Tensor g = tg::randn(s).cuda();
    y.backward(g);
    y2.backward(g);
    CHECK(parity_error(x2.grad(), x.grad(), kElementwise) <= 1.0);
  }
}

TEST_CASE("cuda/masked_fill" * doctest::skip(kNoGpu)) {
  const tg::Tensor mask = tg::dropout_mask({3, 1, 129}, 0.3, {1, 2});
  expect_parity([mask](const V& t) { return tg::masked_fill(t[0], mask.to(t[0].device()), -7.0); }, {randn32({3, 5, 129})},
                kElementwise);
}

TEST_CASE("cuda/dropout: the mask is bit-identical to the CPU's" * doctest::skip(kNoGpu)) {
  const tg::PhiloxState rng{1234, 17};
  for (const tg::Shape& s : {tg::Shape{1}, tg::Shape{1001}, tg::Shape{8, 16, 33, 33}}) {
    const tg::Tensor cpu = tg::dropout_mask(s, 0.1, rng);
    const tg::Tensor gpu = tg::dropout_mask(s, 0.1, rng, {tg::DType::Float32, tg::Device::CUDA});
    CHECK(max_abs_diff(gpu, cpu) == 0.0);
  }
  expect_parity([rng](const V& t) { return tg::dropout(t[0], {0.1, rng}); }, {randn32({7, 1000})}, kElementwise);
  const tg::Tensor m = tg::dropout_mask({5, 77}, 0.25, rng);
  expect_parity([m](const V& t) { return tg::dropout(t[0], {0.25, std::nullopt, m.to(t[0].device())}); }, {randn32({5, 77})},
                kElementwise);
}

TEST_CASE("cuda/edit_bias" * doctest::skip(kNoGpu)) {
  for (const auto& [B, S, H, M] : std::vector<std::array<int64_t, 4>>{{2, 7, 3, 9}, {3, 37, 4, 64}, {1, 300, 2, 300}}) {
    CAPTURE(S);
    const tg::Tensor e = tg::dropout_mask({B, S}, 0.5, {3, static_cast<uint64_t>(S)});
    expect_parity([e](const V& t) { return tg::edit_bias(t[0], t[1], t[2], e.to(t[0].device())); },
                  {randn32({H, M, M}), randn32({H, 1, 1}), randn32({H, 1, 1})}, kReduction);
  }
}

TEST_CASE("cuda/layer_norm" * doctest::skip(kNoGpu)) {
  expect_parity([](const V& t) { return tg::layer_norm(t[0], t[1], t[2]); }, {randn32({37, 1000}), randn32({1000}), randn32({1000})},
                kReduction);
  expect_parity([](const V& t) { return tg::layer_norm(t[0]); }, {randn32({2, 5, 33})}, kReduction);
}

TEST_CASE("cuda/mse_loss" * doctest::skip(kNoGpu)) {
  expect_parity([](const V& t) { return tg::mse_loss(t[0], t[1]); }, {randn32({3, 1001}), randn32({3, 1001})}, kReduction);
}

TEST_CASE("cuda/copy, cast and device moves" * doctest::skip(kNoGpu)) {
  const tg::Tensor x = tg::randn({5, 7});
  const tg::Tensor g = x.cuda();
  CHECK(g.is_cuda());
  CHECK(max_abs_diff(g.cpu(), x) == 0.0);
  CHECK(max_abs_diff(g.transpose(0, 1).contiguous().cpu(), x.transpose(0, 1).contiguous()) == 0.0);
  CHECK(max_abs_diff(g.to(tg::DType::Float64).cpu(), x.to(tg::DType::Float64)) == 0.0);
  tg::Tensor target = tg::zeros({7, 5}, {tg::DType::Float32, tg::Device::CUDA});
  target.copy_(x.transpose(0, 1));  // strided host -> contiguous device
  CHECK(max_abs_diff(target.cpu(), x.transpose(0, 1).contiguous()) == 0.0);
  tg::Tensor host = tg::zeros({5, 7}).transpose(0, 1);
  host.copy_(g.transpose(0, 1));    // device -> strided host view
  CHECK(max_abs_diff(host, x.transpose(0, 1)) == 0.0);
  expect_parity([](const V& t) { return t[0].to(tg::DType::Float64); }, {randn32({9})}, kElementwise);
  // Gradients flow back across a device move.
  tg::Tensor leaf = tg::randn({3}).requires_grad_();
  tg::sum(tg::mul(leaf.cuda(), 2.0)).backward();
  CHECK(!leaf.grad().is_cuda());
  CHECK(leaf.grad().to_vector() == std::vector<double>{2, 2, 2});
}

TEST_CASE("cuda/float64 kernels" * doctest::skip(kNoGpu)) {
  const tg::Tensor x = tg::randn({33, 65}, {tg::DType::Float64});
  const tg::Tensor w = tg::randn({17, 65}, {tg::DType::Float64});
  const tg::Tensor y = tg::softmax(tg::linear(x, w));
  const tg::Tensor yg = tg::softmax(tg::linear(x.cuda(), w.cuda()));
  CHECK(max_abs_diff(yg, y) < 1e-12);
}

TEST_CASE("cuda/errors: mixing devices names the op and both tensors" * doctest::skip(kNoGpu)) {
  const tg::Tensor a = tg::zeros({2, 3}), b = tg::zeros({2, 3}).cuda();
  CHECK(error_of([&] { tg::add(a, b); }) == "add: tensors are on different devices (cpu [2,3] vs cuda [2,3])");
  CHECK(error_of([&] { tg::matmul(a, b.transpose(0, 1)); }) == "matmul: tensors are on different devices (cpu [2,3] vs cuda [3,2])");
  CHECK(contains(error_of([&] { tg::softmax(a, tg::SoftmaxImpl::Cudnn); }), "softmax: the cuDNN implementation needs a CUDA tensor"));
  CHECK(contains(error_of([&] { tg::gradcheck([](const V& t) { return t[0]; }, {tg::zeros({2}, {tg::DType::Float64}).cuda()}); }),
                 "must be a float64 CPU tensor"));
}

TEST_CASE("cuda/sync debug mode reports a faulting op by name" * doctest::skip(kNoGpu)) {
  tg::cuda::set_sync_debug(true);
  const tg::Tensor y = tg::exp(tg::randn({1000}).cuda());  // runs and synchronises after each kernel
  tg::cuda::set_sync_debug(false);
  CHECK(std::isfinite(tg::sum(y).item()));
#ifdef TG_CUDA
  // A failing CUDA call is a tg::Error naming the op and the call.
  CHECK(contains(error_of([] { tg::cuda::check(cudaErrorInvalidValue, "my_op", "cudaMemcpy(...)"); }),
                 "my_op: CUDA call cudaMemcpy(...) failed: cudaErrorInvalidValue"));
#endif
}
