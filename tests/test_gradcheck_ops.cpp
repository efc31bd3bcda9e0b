// gradcheck/<op>: every op's backward against central differences in float64,
// on random non-zero inputs and several shapes (broadcasting, size-1 dims).
// forward/<op>: forward values against hand-computed or independent values.
#include <limits>

#include "helpers.h"

using namespace tgtest;
using V = std::vector<tg::Tensor>;

namespace {
const double kInf = std::numeric_limits<double>::infinity();

// gradcheck of a binary op over pairs of shapes that broadcast.
void gradcheck_binary(tg::Tensor (*op)(const tg::Tensor&, const tg::Tensor&), bool positive_b) {
  const std::vector<std::pair<tg::Shape, tg::Shape>> shapes = {
      {{3, 4}, {3, 4}}, {{2, 3, 4}, {4}}, {{3, 1}, {1, 5}}, {{1}, {2, 3}}, {{2, 1, 3}, {4, 1}}};
  for (const auto& [sa, sb] : shapes) {
    CAPTURE(tg::to_string(sa));
    CAPTURE(tg::to_string(sb));
    const tg::Tensor b = positive_b ? uniform64(sb, 0.5, 2.0) : randn64(sb);
    expect_gradcheck([op](const V& t) { return op(t[0], t[1]); }, {randn64(sa), b});
  }
}

void gradcheck_unary(tg::Tensor (*op)(const tg::Tensor&), double lo, double hi) {
  for (const tg::Shape& s : {tg::Shape{7}, tg::Shape{2, 1, 5}, tg::Shape{}}) {
    expect_gradcheck([op](const V& t) { return op(t[0]); }, {uniform64(s, lo, hi)});
  }
}
}  // namespace

// ---- GEMMs

TEST_CASE("gradcheck/matmul") {
  SUBCASE("2-d") { expect_gradcheck([](const V& t) { return tg::matmul(t[0], t[1]); }, {randn64({3, 4}), randn64({4, 5})}); }
  SUBCASE("batched") {
    expect_gradcheck([](const V& t) { return tg::matmul(t[0], t[1]); }, {randn64({2, 3, 4}), randn64({2, 4, 2})});
  }
  SUBCASE("broadcast batch") {
    expect_gradcheck([](const V& t) { return tg::matmul(t[0], t[1]); }, {randn64({2, 1, 3, 4}), randn64({3, 4, 2})});
  }
  SUBCASE("transposed operand") {
    expect_gradcheck([](const V& t) { return tg::matmul(t[0].transpose(0, 1), t[1]); }, {randn64({4, 3}), randn64({4, 1})});
  }
  SUBCASE("size-1 dims") { expect_gradcheck([](const V& t) { return tg::matmul(t[0], t[1]); }, {randn64({1, 4}), randn64({4, 1})}); }
}

TEST_CASE("forward/matmul") {
  const tg::Tensor a = tg::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  const tg::Tensor b = tg::from_vector({7, 8, 9, 10, 11, 12}, {3, 2});
  CHECK(tg::matmul(a, b).to_vector() == std::vector<double>{58, 64, 139, 154});
  CHECK(tg::matmul(b.transpose(0, 1), a.transpose(0, 1)).to_vector() == std::vector<double>{58, 139, 64, 154});
  const tg::Tensor batched = tg::matmul(a.expand({3, 2, 3}), b);
  CHECK(batched.shape() == tg::Shape{3, 2, 2});
  CHECK(batched.at({2, 1, 1}) == 154);
}

TEST_CASE("gradcheck/linear") {
  SUBCASE("with bias") {
    expect_gradcheck([](const V& t) { return tg::linear(t[0], t[1], t[2]); }, {randn64({2, 3, 4}), randn64({5, 4}), randn64({5})});
  }
  SUBCASE("no bias, one token") {
    expect_gradcheck([](const V& t) { return tg::linear(t[0], t[1]); }, {randn64({1, 4}), randn64({2, 4})});
  }
  SUBCASE("non-contiguous x") {
    expect_gradcheck([](const V& t) { return tg::linear(t[0].transpose(0, 1), t[1], t[2]); },
                     {randn64({4, 3}), randn64({2, 4}), randn64({2})});
  }
}

TEST_CASE("forward/linear") {
  const tg::Tensor x = tg::from_vector({1, 2}, {1, 2});
  const tg::Tensor w = tg::from_vector({1, 0, 0, 1, 1, 1}, {3, 2});
  const tg::Tensor b = tg::from_vector({10, 20, 30}, {3});
  CHECK(tg::linear(x, w, b).to_vector() == std::vector<double>{11, 22, 33});
}

// ---- elementwise

TEST_CASE("gradcheck/add") { gradcheck_binary(tg::add, false); }
TEST_CASE("gradcheck/sub") { gradcheck_binary(tg::sub, false); }
TEST_CASE("gradcheck/mul") {
  gradcheck_binary(tg::mul, false);
  expect_gradcheck([](const V& t) { return tg::mul(t[0], -1.5); }, {randn64({3})});
  expect_gradcheck([](const V& t) { return tg::mul(t[0], t[0]); }, {randn64({2, 2})});  // same tensor twice
}
TEST_CASE("gradcheck/div") { gradcheck_binary(tg::div, true); }
TEST_CASE("gradcheck/exp") { gradcheck_unary(tg::exp, -2, 2); }
TEST_CASE("gradcheck/log") { gradcheck_unary(tg::log, 0.2, 3); }
TEST_CASE("gradcheck/tanh") { gradcheck_unary(tg::tanh, -2, 2); }
TEST_CASE("gradcheck/relu") {
  gradcheck_unary(tg::relu, 0.1, 2);
  gradcheck_unary(tg::relu, -2, -0.1);
  expect_gradcheck([](const V& t) { return tg::relu(t[0]); }, {tg::from_vector({-1.5, 0.7, -0.2, 2.0}, {4}, {tg::DType::Float64, tg::Device::CPU, true})});
}
TEST_CASE("gradcheck/gelu") { gradcheck_unary(tg::gelu, -3, 3); }
TEST_CASE("gradcheck/silu") { gradcheck_unary(tg::silu, -3, 3); }

TEST_CASE("forward/elementwise") {
  const tg::Tensor x = tg::from_vector({-1, 0, 2}, {3}, {tg::DType::Float64});
  CHECK(tg::relu(x).to_vector() == std::vector<double>{0, 0, 2});
  CHECK(tg::exp(x).at({2}) == doctest::Approx(std::exp(2.0)));
  CHECK(tg::tanh(x).at({0}) == doctest::Approx(std::tanh(-1.0)));
  CHECK(tg::silu(x).at({2}) == doctest::Approx(2.0 / (1.0 + std::exp(-2.0))));
  // gelu (tanh form) at 1: 0.5 (1 + tanh(sqrt(2/pi) (1 + 0.044715)))
  CHECK(tg::gelu(x).at({2}) == doctest::Approx(0.5 * 2 * (1 + std::tanh(0.7978845608028654 * (2 + 0.044715 * 8)))));
  CHECK(tg::log(tg::exp(x)).to_vector()[2] == doctest::Approx(2));
  const tg::Tensor a = tg::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  const tg::Tensor row = tg::from_vector({10, 20, 30}, {3});
  CHECK((a + row).to_vector() == std::vector<double>{11, 22, 33, 14, 25, 36});
  CHECK((a - row).at({1, 2}) == -24);
  CHECK((a * row).at({1, 0}) == 40);
  CHECK((a / row).at({0, 1}) == doctest::Approx(0.1));
  CHECK((a * 2.0 + 1.0).to_vector() == std::vector<double>{3, 5, 7, 9, 11, 13});
}

// ---- reductions

TEST_CASE("gradcheck/sum") {
  expect_gradcheck([](const V& t) { return tg::sum(t[0]); }, {randn64({2, 3})});
  expect_gradcheck([](const V& t) { return tg::sum(t[0], {1}); }, {randn64({2, 3, 4})});
  expect_gradcheck([](const V& t) { return tg::sum(t[0], {0, 2}, true); }, {randn64({2, 3, 4})});
  expect_gradcheck([](const V& t) { return tg::sum(t[0], {-1}); }, {randn64({3, 1})});
  expect_gradcheck([](const V& t) { return tg::sum(t[0], {0}); }, {randn64({5, 40})});  // the column-sum path
}

TEST_CASE("gradcheck/mean") {
  expect_gradcheck([](const V& t) { return tg::mean(t[0]); }, {randn64({2, 3})});
  expect_gradcheck([](const V& t) { return tg::mean(t[0], {0}, true); }, {randn64({4, 1, 2})});
}

TEST_CASE("forward/sum and mean") {
  const tg::Tensor a = tg::arange(24, {tg::DType::Float64}).view({2, 3, 4});
  CHECK(tg::sum(a).item() == 276);
  CHECK(tg::sum(a, {1}).shape() == tg::Shape{2, 4});
  CHECK(tg::sum(a, {1}).at({1, 2}) == 14 + 18 + 22);
  CHECK(tg::sum(a, {0, 2}, true).shape() == tg::Shape{1, 3, 1});
  CHECK(tg::sum(a, {0, 2}, true).at({0, 1, 0}) == (4 + 5 + 6 + 7) + (16 + 17 + 18 + 19));
  CHECK(tg::mean(a, {2}).at({0, 0}) == 1.5);
  CHECK(tg::sum(a.transpose(0, 2), {0}).at({1, 0}) == tg::sum(a, {2}).at({0, 1}));
  CHECK(tg::sum_to(a, {3, 1}).at({2, 0}) == tg::sum(a.narrow(1, 2, 1)).item());
  const tg::Tensor tall = tg::arange(130 * 40, {tg::DType::Float64}).view({130, 40});  // column-sum path: 3 chunks
  CHECK(tg::sum(tall, {0}).at({7}) == 130 * 7 + 40.0 * (129 * 130 / 2));
}

// ---- views

TEST_CASE("gradcheck/reshape") {
  expect_gradcheck([](const V& t) { return t[0].reshape({3, 2}); }, {randn64({2, 3})});
  expect_gradcheck([](const V& t) { return t[0].transpose(0, 1).reshape({-1}); }, {randn64({2, 3})});
}
TEST_CASE("gradcheck/permute") {
  expect_gradcheck([](const V& t) { return t[0].permute({2, 0, 1}); }, {randn64({2, 3, 4})});
}
TEST_CASE("gradcheck/transpose") {
  expect_gradcheck([](const V& t) { return t[0].transpose(-1, 0); }, {randn64({2, 1, 4})});
}
TEST_CASE("gradcheck/narrow") {
  expect_gradcheck([](const V& t) { return t[0].narrow(1, 1, 2); }, {randn64({2, 4, 3})});
  expect_gradcheck([](const V& t) { return t[0].narrow(0, 0, 1); }, {randn64({3})});
}
TEST_CASE("gradcheck/unsqueeze and squeeze") {
  expect_gradcheck([](const V& t) { return t[0].unsqueeze(1); }, {randn64({2, 3})});
  expect_gradcheck([](const V& t) { return t[0].transpose(0, 2).squeeze(1); }, {randn64({3, 1, 2})});
}

TEST_CASE("gradcheck/expand") {
  expect_gradcheck([](const V& t) { return t[0].expand({2, 3, 4}); }, {randn64({3, 1})});
}

// ---- attention pieces

TEST_CASE("gradcheck/softmax") {
  expect_gradcheck([](const V& t) { return tg::softmax(t[0]); }, {randn64({3, 5})});
  expect_gradcheck([](const V& t) { return tg::softmax(t[0]); }, {randn64({2, 2, 1})});
  SUBCASE("masked keys and a fully masked row") {
    tg::Tensor mask = tg::from_vector({0, 1, 0, 0, 1, 1, 1, 1, 0, 0, 0, 1}, {3, 4}, {tg::DType::Float64});
    expect_gradcheck([mask](const V& t) { return tg::softmax(tg::masked_fill(t[0], mask, -kInf)); }, {randn64({3, 4})});
  }
}

TEST_CASE("forward/softmax") {
  const tg::Tensor x = tg::from_vector({0, std::log(3.0), -kInf, -kInf}, {2, 2}, {tg::DType::Float64});
  const std::vector<double> y = tg::softmax(x).to_vector();
  CHECK(y[0] == doctest::Approx(0.25));
  CHECK(y[1] == doctest::Approx(0.75));
  CHECK(y[2] == 0.0);  // fully masked row: zeros, not NaN
  CHECK(y[3] == 0.0);
}

TEST_CASE("gradcheck/masked_fill") {
  const tg::Tensor mask = tg::from_vector({1, 0, 0, 1}, {1, 4}, {tg::DType::Float64});
  expect_gradcheck([mask](const V& t) { return tg::masked_fill(t[0], mask, 3.0); }, {randn64({3, 4})});
  CHECK(tg::masked_fill(tg::zeros({2, 2}), tg::from_vector({0, 1}, {2}), 5).to_vector() == std::vector<double>{0, 5, 0, 5});
}

TEST_CASE("gradcheck/dropout") {
  const tg::PhiloxState rng{11, 5};
  SUBCASE("Philox mask") {
    expect_gradcheck([rng](const V& t) { return tg::dropout(t[0], {0.3, rng}); }, {randn64({4, 6})});
  }
  SUBCASE("explicit mask") {
    const tg::Tensor m = tg::dropout_mask({4, 6}, 0.3, rng, {tg::DType::Float64});
    expect_gradcheck([m](const V& t) { return tg::dropout(t[0], {0.3, std::nullopt, m}); }, {randn64({4, 6})});
  }
  SUBCASE("p = 0 is the identity") {
    const tg::Tensor x = randn64({3});
    CHECK(tg::dropout(x, {0.0}).same_storage(x));
  }
}

TEST_CASE("forward/dropout applies keep / (1 - p) and matches its mask") {
  const tg::PhiloxState rng{3, 9};
  const tg::Tensor x = tg::ones({64}, {tg::DType::Float64});
  const tg::Tensor y = tg::dropout(x, {0.25, rng});
  const tg::Tensor m = tg::dropout_mask({64}, 0.25, rng, {tg::DType::Float64});
  CHECK(max_abs_diff(y, m * (1.0 / 0.75)) == 0.0);
  const tg::Tensor y2 = tg::dropout(x, {0.25, std::nullopt, m});
  CHECK(max_abs_diff(y, y2) == 0.0);
}

TEST_CASE("gradcheck/edit_bias") {
  const tg::Tensor e = tg::from_vector({1, 0, 1, 1, 0, 0, 0, 1}, {2, 4}, {tg::DType::Float64});
  expect_gradcheck([e](const V& t) { return tg::edit_bias(t[0], t[1], t[2], e); },
                   {randn64({3, 6, 6}), randn64({3, 1, 1}), randn64({3, 1, 1})});
  SUBCASE("S == M") {
    expect_gradcheck([e](const V& t) { return tg::edit_bias(t[0], t[1], t[2], e); },
                     {randn64({2, 4, 4}), randn64({2, 1, 1}), randn64({2, 1, 1})});
  }
}

TEST_CASE("forward/edit_bias and its gradient outside the corner") {
  const tg::Tensor E = tg::arange(2 * 3 * 3, {tg::DType::Float64}).view({2, 3, 3}).detach().requires_grad_();
  const tg::Tensor win = tg::from_vector({10, 20}, {2, 1, 1}, {tg::DType::Float64, tg::Device::CPU, true});
  const tg::Tensor wx = tg::from_vector({100, 200}, {2, 1, 1}, {tg::DType::Float64, tg::Device::CPU, true});
  const tg::Tensor e = tg::from_vector({1, 0}, {1, 2}, {tg::DType::Float64});
  const tg::Tensor out = tg::edit_bias(E, win, wx, e);
  CHECK(out.shape() == tg::Shape{1, 2, 2, 2});
  CHECK(out.at({0, 0, 0, 0}) == 0 + 10);        // both inside
  CHECK(out.at({0, 0, 0, 1}) == 1 + 100);       // one inside
  CHECK(out.at({0, 1, 1, 0}) == 9 + 3 + 200);   // h=1, i=1, j=0: E[1,1,0] = 12
  CHECK(out.at({0, 1, 1, 1}) == 9 + 4);         // both outside
  tg::sum(out).backward();
  CHECK(E.grad().at({0, 2, 2}) == 0.0);  // outside the S x S corner
  CHECK(E.grad().at({1, 1, 1}) == 1.0);
  CHECK(win.grad().at({0, 0, 0}) == 1.0);
  CHECK(wx.grad().at({1, 0, 0}) == 2.0);
}

TEST_CASE("gradcheck/layer_norm") {
  expect_gradcheck([](const V& t) { return tg::layer_norm(t[0], t[1], t[2]); }, {randn64({3, 5}), randn64({5}), randn64({5})});
  expect_gradcheck([](const V& t) { return tg::layer_norm(t[0]); }, {randn64({2, 2, 4})});
}

TEST_CASE("forward/layer_norm") {
  const tg::Tensor x = tg::from_vector({1, 2, 3, 4}, {1, 4}, {tg::DType::Float64});
  const std::vector<double> y = tg::layer_norm(x, tg::Tensor(), tg::Tensor(), 1e-12).to_vector();
  const double sd = std::sqrt(1.25);
  CHECK(y[0] == doctest::Approx(-1.5 / sd));
  CHECK(y[3] == doctest::Approx(1.5 / sd));
}

TEST_CASE("gradcheck/mse_loss") {
  expect_gradcheck([](const V& t) { return tg::mse_loss(t[0], t[1]); }, {randn64({3, 4}), randn64({3, 4})});
  CHECK(tg::mse_loss(tg::from_vector({1, 2}, {2}), tg::from_vector({3, 2}, {2})).item() == 2.0);
}

TEST_CASE("gradcheck/cast and clone") {
  expect_gradcheck([](const V& t) { return tg::clone(t[0]) * t[0]; }, {randn64({3})});
  // Through float32 finite differences lose precision; check the gradient's value instead.
  tg::Tensor x = uniform64({3}, 1, 2);
  tg::sum(x.to(tg::DType::Float32).to(tg::DType::Float64) * 2.0).backward();
  CHECK(x.grad().dtype() == tg::DType::Float64);
  CHECK(x.grad().to_vector() == std::vector<double>{2, 2, 2});
}
