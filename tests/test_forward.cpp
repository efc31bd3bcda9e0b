// forward/<op>: forward values, and derivatives at chosen points, against
// values computed independently of this library: hand arithmetic, or
// mpmath at 40 digits (the references below; see each comment). gradcheck
// cannot see a bug shared by a forward and its backward (a wrong constant);
// these can.
#include <cmath>
#include <functional>
#include <iterator>
#include <limits>
#include <string>

#include "helpers.h"
#include "ops/elementwise_kernels.h"
#include "ops/matmul_kernels.h"
#include "ops/untracked.h"

using namespace tgtest;

namespace {

const double kInf = std::numeric_limits<double>::infinity();
const std::vector<double> kPoints = {-2.5, -1.0, -0.3, 0.0, 0.7, 1.3, 3.1};

// |got - want| <= 1e-12 |want| (+ 1e-300 for zeros), element by element.
void check_close(const std::vector<double>& got, const std::vector<double>& want, double rel = 1e-12) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(std::abs(got[i] - want[i]) <= rel * std::abs(want[i]) + 1e-300);
  }
}

// f(points) and f'(points), through the library's forward and backward.
void check_unary(tg::Tensor (*f)(const tg::Tensor&), const std::vector<double>& points, const std::vector<double>& value,
                 const std::vector<double>& derivative) {
  tg::Tensor x = tg::from_vector(points, {static_cast<int64_t>(points.size())}, {tg::DType::Float64}).requires_grad_();
  const tg::Tensor y = f(x);
  check_close(y.to_vector(), value);
  if (derivative.empty()) return;
  tg::sum(y).backward();
  check_close(x.grad().to_vector(), derivative);
}

}  // namespace

TEST_CASE("forward/exp, tanh, gelu, silu, sqrt, log at fixed points (mpmath references)") {
  SUBCASE("exp") {
    const std::vector<double> e = {0.082084998623898795170, 0.36787944117144232160, 0.74081822068171787429, 1.0,
                                   2.0137527074704764322,   3.6692966676192443834,  22.197951281441635376};
    check_unary(tg::exp, kPoints, e, e);
  }
  SUBCASE("tanh") {
    check_unary(tg::tanh, kPoints,
                {-0.98661429815143028888, -0.76159415595576488812, -0.29131261245159089566, 0.0,
                 0.60436777711716346812, 0.86172315931330637573, 0.99594935922190023644},
                {0.026592226683160619656, 0.41997434161402606939, 0.91513696182662920906, 1.0,
                 0.63473958998245862144, 0.25743319670309399925, 0.0080848738654863224531});
  }
  SUBCASE("gelu, tanh form with k0 = sqrt(2/pi), k1 = 0.044715") {
    check_unary(tg::gelu, kPoints,
                {-0.015084266089998582079, -0.15880800939172329522, -0.11462907645724074890, 0.0,
                 0.53057013470511670784, 1.1739290123173094486, 3.0973733897694503137},
                {-0.037951576212666182634, -0.082964083845782555140, 0.26770454836119818591, 0.5,
                 0.97635721865610394590, 1.1258780697840167133, 1.0087393960512661319});
  }
  SUBCASE("silu") {
    check_unary(tg::silu, kPoints,
                {-0.18964545005310887798, -0.26894142136999512075, -0.12766724495650229994, 0.0,
                 0.46773144051771623801, 1.0215854779553262410, 2.9663675096826331164},
                {-0.099401111341526841138, 0.072329488128513268211, 0.35221998968111725743, 0.5,
                 0.82338678347334242444, 1.0046228542523369215, 1.0847647055477578931});
  }
  SUBCASE("sqrt") {
    check_unary(tg::sqrt, {0.05, 0.3, 1.0, 2.5, 7.0},
                {0.22360679774997897585, 0.54772255750516610332, 1.0, 1.581138830084189666, 2.6457513110645905905},
                {2.2360679774997896343, 0.91287092917527687265, 0.5, 0.3162277660168379332, 0.18898223650461361361});
  }
  SUBCASE("log") {
    check_unary(tg::log, {0.05, 0.3, 1.0, 2.5, 7.0},
                {-2.9957322735539909379, -1.2039728043259360296, 0.0, 0.91629073187415506518, 1.9459101490553133051},
                {20.0, 1.0 / 0.3, 1.0, 0.4, 1.0 / 7.0});
  }
}

TEST_CASE("forward/relu, neg and the scalar ops, with derivatives at the kink") {
  check_unary(tg::relu, kPoints, {0, 0, 0, 0, 0.7, 1.3, 3.1}, {0, 0, 0, 0, 1, 1, 1});  // relu'(0) = 0, as in PyTorch
  check_unary(tg::neg, kPoints, {2.5, 1.0, 0.3, 0.0, -0.7, -1.3, -3.1}, std::vector<double>(7, -1.0));
  check_unary([](const tg::Tensor& x) { return tg::mul(x, 0.5); }, kPoints, {-1.25, -0.5, -0.15, 0, 0.35, 0.65, 1.55},
              std::vector<double>(7, 0.5));
  check_unary([](const tg::Tensor& x) { return tg::add(x, 2.0); }, kPoints, {-0.5, 1.0, 1.7, 2.0, 2.7, 3.3, 5.1},
              std::vector<double>(7, 1.0));
}

TEST_CASE("forward/binary ops with broadcasting") {
  const tg::Tensor a = tg::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  const tg::Tensor row = tg::from_vector({10, 20, 30}, {3});
  CHECK((a + row).to_vector() == std::vector<double>{11, 22, 33, 14, 25, 36});
  CHECK((a - row).to_vector() == std::vector<double>{-9, -18, -27, -6, -15, -24});
  CHECK((a * row).to_vector() == std::vector<double>{10, 40, 90, 40, 100, 180});
  check_close((tg::from_vector({1, 2, 3}, {3, 1}, {tg::DType::Float64}) / tg::from_vector({4, 8}, {1, 2}, {tg::DType::Float64})).to_vector(),
              {0.25, 0.125, 0.5, 0.25, 0.75, 0.375});
  CHECK((a * 2.0 + 1.0).to_vector() == std::vector<double>{3, 5, 7, 9, 11, 13});
}

// The CPU's maps walk runs along the innermost collapsed dim in blocks of
// 4096 elements (core/cpu_loops.h): every layout against a per-element
// reference, with rows that cross blocks (129 and 90 columns), in parallel
// (more than 2^14 elements) and not, an operand transposed (a gathered inner
// stride), broadcast along a middle and the inner dim (stride 0), a view
// with size-1 dims and an offset, and the binary ops at each op.
TEST_CASE("forward/elementwise maps over transposed, broadcast and offset operands equal a per-element loop") {
  tg::manual_seed(44);
  const tg::TensorOptions f64{tg::DType::Float64};
  const tg::Tensor x = tg::randn({129, 130}, f64), t = x.transpose(0, 1);  // t [130, 129], inner stride 130
  const tg::Tensor u = tg::randn({130, 129}, f64);
  const tg::Tensor mid = tg::randn({200, 1, 90}, f64), inner = tg::randn({200, 7, 1}, f64);
  const tg::Tensor view = tg::randn({3, 1, 41, 5}, f64).narrow(2, 1, 40).narrow(3, 2, 3);  // offset, strided rows
  // t's elements from x's storage, then t + u, t * u, t - u, t / u and t's copy, element by element.
  const std::vector<double> xv = x.to_vector(), uv = u.to_vector();
  std::vector<double> tv(xv.size()), sum(xv.size()), product(xv.size()), difference(xv.size()), quotient(xv.size());
  for (size_t i = 0; i < 130; ++i)
    for (size_t j = 0; j < 129; ++j) tv[i * 129 + j] = xv[j * 130 + i];
  for (size_t k = 0; k < tv.size(); ++k) {
    sum[k] = tv[k] + uv[k], product[k] = tv[k] * uv[k], difference[k] = tv[k] - uv[k], quotient[k] = tv[k] / uv[k];
  }
  CHECK(t.contiguous().to_vector() == tv);
  CHECK((t + u).to_vector() == sum);
  CHECK((t * u).to_vector() == product);
  CHECK((t - u).to_vector() == difference);
  CHECK((t / u).to_vector() == quotient);
  // Broadcast along the middle dim ([200,1,90] over 7) and the inner one ([200,7,1] over 90): 126000 elements.
  const tg::Tensor big = tg::randn({200, 7, 90}, f64);
  const std::vector<double> bv = big.to_vector(), mv = mid.to_vector(), iv = inner.to_vector();
  std::vector<double> want(bv.size());
  for (int64_t b = 0; b < 200; ++b)
    for (int64_t r = 0; r < 7; ++r)
      for (int64_t c = 0; c < 90; ++c) {
        const size_t k = static_cast<size_t>((b * 7 + r) * 90 + c);
        want[k] = bv[k] * mv[static_cast<size_t>(b * 90 + c)] + iv[static_cast<size_t>(b * 7 + r)];
      }
  CHECK((big * mid + inner).to_vector() == want);
  // A narrowed view with a size-1 dim: its copy element by element.
  const std::vector<double> whole = view.contiguous().to_vector();
  std::vector<double> by_index;
  for (int64_t a = 0; a < 3; ++a)
    for (int64_t r = 0; r < 40; ++r)
      for (int64_t c = 0; c < 3; ++c) by_index.push_back(view.narrow(0, a, 1).narrow(2, r, 1).narrow(3, c, 1).item());
  CHECK(whole == by_index);
}

// A unary op over contiguous operands runs on the CPU in lanes of Eigen
// arrays (ops/elementwise.cpp: Eigen's vectorized tanh and exp), over others
// element by element. Both, forward and backward in float32, against the same
// op in float64 on the same (float32) inputs, over 131 x 137 elements (in
// parallel blocks, the last not a whole number of lanes) holding NaN,
// infinities, signed zeros, tiny and large values; the strided case's
// gradient arrives strided too. Against the float64 result rounded to
// float32: NaN where it is NaN, the same infinities (float32's overflow
// included), a forward zero's sign, else within 2^-20 of the size of the
// formula's terms (where they cancel in float32, as 1 - y^2 in tanh's
// derivative, 1 - s in silu's and gelu's two terms of opposite sign below
// x = 0 do, more than the float64 value's size), plus 1e-37. gelu's
// allowance is its terms' size (and what its sigmoids' exps add), not more:
// written through sigmoid(2u) it has no 1 + tanh u to lose digits in (the
// tanh form fails here at x ~ -5 by a factor of ~5e4).
TEST_CASE("forward/unary ops in float32 in lanes and element by element against float64, NaN and infinities kept") {
  tg::manual_seed(45);
  const int64_t rows = 131, cols = 137;
  REQUIRE(rows * cols > (1 << 14));  // cpu::kParallelGrain: the blocks run in parallel
  std::vector<double> values = tg::mul(tg::randn({rows * cols}, {tg::DType::Float64}), 3.0).to_vector();
  const double specials[] = {std::nan(""), kInf, -kInf, 0.0, -0.0, 1e-30, -1e-30, 40.0, -40.0, 100.0, -100.0, 1e-3,
                             1e20, -1e20};
  for (size_t k = 0; k < std::size(specials); ++k) {
    values[k] = specials[k];
    values[values.size() - 1 - k] = specials[k];  // in the tail, past the last whole lanes
  }
  for (double& v : values) v = static_cast<float>(v);
  std::vector<double> transposed(values.size());  // the same matrix stored column by column
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) transposed[c * rows + r] = values[r * cols + c];
  const tg::Tensor seed = tg::randn({rows, cols}).to(tg::DType::Float64);  // float32 values
  const std::vector<double> seeds = seed.to_vector();
  const tg::TensorOptions f32{tg::DType::Float32};
  const auto leaf = [](const tg::Tensor& t) { return t.detach().requires_grad_(); };
  // The float64 reference strided too, so that it runs element by element (libm's functions).
  const tg::Tensor x64 = leaf(tg::from_vector(transposed, {cols, rows}, {tg::DType::Float64}).transpose(0, 1));
  const tg::Tensor contiguous = leaf(tg::from_vector(values, {rows, cols}, f32));
  const tg::Tensor strided = leaf(tg::from_vector(transposed, {cols, rows}, f32).transpose(0, 1));
  REQUIRE(!strided.is_contiguous());
  // y's backward with the seed's gradient strided, as element by element takes it.
  const auto backward_strided = [](const tg::Tensor& y, const tg::Tensor& s) {
    y.transpose(0, 1).backward(s.transpose(0, 1).contiguous());
  };
  using Terms = double (*)(double x);  // the size of a formula's terms at x, past its value's
  const Terms none = [](double) { return 0.0; }, one = [](double) { return 1.0; };
  const Terms x1 = [](double x) { return 1 + std::abs(x); };
  // gelu: x p and p + 2 x p q u' (ops/elementwise_kernels.h), p = sigmoid(2u)
  // and q = sigmoid(-2u). e^(+-2u) turns 2u's float32 rounding into a
  // relative error |2u| times as large, which reaches p as |2u| q and q as
  // |2u| p; and p flushes to 0 below ~2^-128 (where e^-2u overflows, so q is
  // 1), an absolute error the terms carry as q 2^-108 (the check scales them
  // by 2^-20).
  struct Gelu {  // at x, in float64
    double u, p, q, du;
    explicit Gelu(double x)
        : u(tg::math::gelu_u<double>(x)), p(1 / (1 + std::exp(-2 * u))), q(1 / (1 + std::exp(2 * u))),
          du(tg::math::kGeluK0 * (1 + 3 * tg::math::kGeluK1 * x * x)) {}
  };
  const Terms gelu_forward = [](double x) {
    const Gelu g(x);
    return std::abs(x * g.p) * (1 + std::abs(2 * g.u) * g.q) + std::abs(x) * g.q * 0x1p-108;
  };
  const Terms gelu_derivative = [](double x) {
    const Gelu g(x);
    return g.p * (1 + std::abs(2 * g.u) * g.q) + std::abs(2 * x * g.p * g.q * g.du) * (1 + std::abs(2 * g.u)) +
           (1 + 2 * std::abs(x) * g.du) * g.q * 0x1p-108;
  };
  struct Case {
    const char* name;
    tg::Tensor (*op)(const tg::Tensor&);
    Terms forward, derivative;
  };
  const Case cases[] = {{"neg", [](const tg::Tensor& x) { return tg::neg(x); }, none, none},
                        {"mul", [](const tg::Tensor& x) { return tg::mul(x, 2.5); }, none, none},
                        {"add", [](const tg::Tensor& x) { return tg::add(x, -1.5); }, none, none},
                        {"exp", [](const tg::Tensor& x) { return tg::exp(x); }, none, none},
                        {"log", [](const tg::Tensor& x) { return tg::log(x); }, none, none},
                        {"sqrt", [](const tg::Tensor& x) { return tg::sqrt(x); }, none, none},
                        {"tanh", [](const tg::Tensor& x) { return tg::tanh(x); }, none, one},
                        {"relu", [](const tg::Tensor& x) { return tg::relu(x); }, none, none},
                        {"gelu", [](const tg::Tensor& x) { return tg::gelu(x); }, gelu_forward, gelu_derivative},
                        {"silu", [](const tg::Tensor& x) { return tg::silu(x); }, none, x1}};
  // got against want element by element; terms(i): the size of the terms at element i.
  const auto check_against = [&](const tg::Tensor& got, const tg::Tensor& want, const std::function<double(size_t)>& terms,
                                 bool signed_zeros) {
    const auto g = got.to_vector();
    std::vector<double> w = want.to_vector();
    for (double& v : w) v = static_cast<float>(v);  // past float32's range: infinite
    for (size_t i = 0; i < w.size(); ++i) {
      CAPTURE(i);
      CAPTURE(values[i]);
      CAPTURE(w[i]);
      CAPTURE(g[i]);
      if (std::isnan(w[i]) || std::isinf(w[i])) {
        CHECK((std::isnan(w[i]) ? std::isnan(g[i]) : g[i] == w[i]));
        continue;
      }
      if (signed_zeros && w[i] == 0 && g[i] == 0) CHECK(std::signbit(g[i]) == std::signbit(w[i]));
      CHECK(std::abs(g[i] - w[i]) <= 0x1p-20 * std::max(std::abs(w[i]), terms(i)) + 1e-37);
    }
  };
  for (const Case& c : cases) {
    const std::string name = c.name;
    CAPTURE(name);
    for (tg::Tensor x : {x64, contiguous, strided}) x.zero_grad();
    const tg::Tensor y64 = c.op(x64);
    backward_strided(y64, seed);
    for (const tg::Tensor& x : {contiguous, strided}) {
      const bool lanes = x.is_contiguous();
      CAPTURE(lanes);
      const tg::Tensor y = c.op(x);
      check_against(y, y64, [&](size_t i) { return c.forward(values[i]); }, true);
      const tg::Tensor seed32 = seed.to(tg::DType::Float32);
      if (lanes) y.backward(seed32);
      else backward_strided(y, seed32);
      check_against(x.grad(), x64.grad(), [&](size_t i) { return std::abs(seeds[i]) * c.derivative(values[i]); }, false);
    }
  }
}

// The untracked in-place add behind linear_fp16's bias where the GEMM's
// epilogue does not take it: b broadcast over dst's rows, dst both an input
// and the output.
TEST_CASE("forward/add_into adds a broadcast operand in place") {
  const tg::Tensor dst = tg::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}), b = tg::from_vector({10, 20, 30}, {3});
  tg::add_into(dst, b);
  CHECK(dst.to_vector() == std::vector<double>{11, 22, 33, 14, 25, 36});
  CHECK_THROWS_WITH(tg::add_into(dst.transpose(0, 1), tg::ones({2})), doctest::Contains("add_into: dst [3,2] must be contiguous"));
  CHECK_THROWS_WITH(tg::add_into(dst, tg::ones({2})), doctest::Contains("add_into: cannot expand shape [2] to [2,3]"));
  CHECK_THROWS_WITH(tg::add_into(tg::Tensor(), b), doctest::Contains("add_into: argument 'dst' is an undefined tensor"));
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

TEST_CASE("forward/fp16 GEMM operands: CUDA only, a clear error elsewhere") {
  CHECK_THROWS_WITH(tg::to_fp16({tg::ones({2, 2})}), doctest::Contains("CUDA only"));
  CHECK_THROWS_WITH(tg::to_fp16({}), "to_fp16: takes 1 to 4 matrices, got 0");
  CHECK_THROWS_WITH(tg::fp16_group({}), "fp16_group: takes 1 to 4 matrices, got 0");
  CHECK_THROWS_WITH(tg::to_fp16({tg::ones({2, 2}).transpose(0, 1).contiguous(), tg::ones({2, 3}).transpose(0, 1)}),
                    doctest::Contains("to_fp16: matrix 1 must be contiguous, 2-D, float32 and on cpu like matrix 0; got float32 [3,2] with strides [1,3]"));
  // In two steps (the group allocated first): the group must be the matrices'.
  const tg::Fp16Group group = tg::fp16_group({tg::ones({2, 2})});
  CHECK_THROWS_WITH(tg::convert_to_fp16({tg::ones({2, 3})}, group),
                    doctest::Contains("convert_to_fp16: matrix 0 [2,3] on cpu into slot 0 of a group made for [2, 2] on cpu"));
  CHECK_THROWS_WITH(tg::convert_to_fp16({tg::ones({1, 4})}, group),
                    doctest::Contains("convert_to_fp16: matrix 0 [1,4] on cpu into slot 0 of a group made for [2, 2] on cpu"));
  // ... and each matrix as to_fp16 takes it.
  CHECK_THROWS_WITH(tg::convert_to_fp16({tg::ones({2, 2}).transpose(0, 1)}, group),
                    doctest::Contains("convert_to_fp16: matrix 0 must be contiguous, 2-D, float32 and on cpu like matrix 0; got float32 [2,2] with strides [1,2]"));
  CHECK_THROWS_WITH(tg::convert_to_fp16({tg::ones({2, 2}, {tg::DType::Float64})}, group),
                    doctest::Contains("convert_to_fp16: matrix 0 must be contiguous, 2-D, float32"));
  CHECK_THROWS_WITH(tg::convert_to_fp16({tg::ones({2, 2}), tg::ones({2, 2})}, group),
                    doctest::Contains("convert_to_fp16: 2 matrices from slot 0 into a group of 1"));
  // A part of a group (first_slot) must lie inside it, and each matrix fit its slot.
  CHECK_THROWS_WITH(tg::convert_to_fp16({tg::ones({2, 2})}, group, 1),
                    doctest::Contains("convert_to_fp16: 1 matrices from slot 1 into a group of 1"));
  CHECK_THROWS_WITH(tg::convert_to_fp16({tg::ones({2, 2})}, group, -1),
                    doctest::Contains("convert_to_fp16: 1 matrices from slot -1 into a group of 1"));
  const tg::Fp16Group pair = tg::fp16_group({tg::ones({2, 2}), tg::ones({3, 5})});
  CHECK_THROWS_WITH(tg::convert_to_fp16({tg::ones({2, 2})}, pair, 1),
                    doctest::Contains("convert_to_fp16: matrix 0 [2,2] on cpu into slot 1 of a group made for [3, 5] on cpu"));
  CHECK_THROWS_WITH(tg::convert_to_fp16({tg::ones({2, 2})}, group), doctest::Contains("CUDA only"));
}

// The split GEMM's stretches of k (ops/matmul.cpp): the model reproduces
// nine of the H200 times it was fitted to (b508663's bench/split_gemm,
// bench/results/split_gemm_v27-h200.txt, within 6%), picks the splits
// measured faster in session 35 (dx at 1152 tokens 3 stretches, 65.6 ->
// 52.0 us; dWqkv at 24736 tokens 2, 721 -> 658 us: bench/NOTES.md version
// 28), and on any shape leaves no stretch empty
// (the kernel's launch check), stays within 8 waves and picks the least
// modelled time, the fewest stretches on a tie.
TEST_CASE("forward/split_gemm_stretches: the modelled fastest split of k, none empty, at most 8 waves") {
  constexpr int64_t kSms = 132, C = 1024;
  struct Measured {
    int64_t rows, cols, depth, stretches;
    double us;
  };
  // do, dx, dWo and dWqkv at 373, 1152 and 24736 tokens with b508663's stretches.
  for (const Measured& m : {Measured{373, C, C, 2, 18.1}, {373, C, 3 * C, 4, 24.1}, {C, C, 373, 1, 12.2},
                            {3 * C, C, 373, 1, 22.8}, {1152, C, 3 * C, 2, 65.7}, {C, C, 1152, 1, 24.4},
                            {24736, C, 3 * C, 1, 690.6}, {C, C, 24736, 13, 267.9}, {3 * C, C, 24736, 5, 736.3}}) {
    CAPTURE(m.rows);
    CAPTURE(m.depth);
    CHECK(std::abs(tg::split_gemm_model_us(m.rows, m.cols, m.depth, m.stretches, kSms) / m.us - 1) < 0.06);
  }
  CHECK(tg::split_gemm_stretches(1152, C, 3 * C, kSms) == 3);
  CHECK(tg::split_gemm_stretches(3 * C, C, 24736, kSms) == 2);
  CHECK(tg::split_gemm_stretches(C, C, 373, kSms) == 1);
  CHECK(tg::split_gemm_stretches(24736, C, 3 * C, kSms) == 1);
  tg::manual_seed(7);
  const tg::Tensor draws = tg::rand({400, 4});
  for (int64_t i = 0; i < draws.size(0); ++i) {
    const auto draw = [&](int j, double lo, double hi) {
      return static_cast<int64_t>(std::exp(std::log(lo) + draws.at({i, j}) * (std::log(hi) - std::log(lo))));
    };
    const int64_t rows = draw(0, 1, 40000), cols = 128 * draw(1, 1, 40), depth = draw(2, 1, 40000);
    const int64_t sms = draw(3, 1, 200);
    CAPTURE(rows);
    CAPTURE(cols);
    CAPTURE(depth);
    CAPTURE(sms);
    const int64_t s = tg::split_gemm_stretches(rows, cols, depth, sms);
    const int64_t tiles = tg::split_gemm_tiles(rows, cols), chunks = tg::split_gemm_chunks(depth);
    CHECK(s >= 1);
    CHECK((s - 1) * ((chunks + s - 1) / s) < chunks);
    CHECK((s == 1 || tiles * s <= 8 * sms));
    const double chosen = tg::split_gemm_model_us(rows, cols, depth, s, sms);
    const int64_t most = std::min(chunks, std::max<int64_t>(1, 8 * sms / tiles));
    for (int64_t other = 1; other <= most; ++other) {  // every other split within 8 waves: no faster
      const double us = tg::split_gemm_model_us(rows, cols, depth, other, sms);
      CHECK((other < s ? us > chosen : us >= chosen));
    }
  }
  CHECK_THROWS_WITH(tg::split_gemm_stretches(0, C, C, kSms),
                    "split_gemm_stretches: c [0, 1024] over depth 1024 on 132 SMs: each must be positive");
  CHECK_THROWS_WITH(tg::split_gemm_model_us(C, C, C, 0, kSms),
                    "split_gemm_model_us: c [1024, 1024] over depth 1024 in 0 stretches on 132 SMs: each must be positive");
  CHECK_THROWS_WITH(tg::split_gemm_model_us(C, C, C, 1, 0),
                    "split_gemm_model_us: c [1024, 1024] over depth 1024 in 1 stretches on 0 SMs: each must be positive");
}

// A cuda::Fork for CPU work (Fork(false)) runs the side work in place.
TEST_CASE("forward/a fork that is off runs its work in place") {
  const tg::Tensor t = tg::zeros({3});
  tg::cuda::Fork beside(false);
  beside.run([&] { tg::fill_into(t, 2.0); });
  CHECK(t.to_vector() == std::vector<double>{2, 2, 2});
  beside.join();
}

TEST_CASE("forward/linear") {
  const tg::Tensor x = tg::from_vector({1, 2}, {1, 2});
  const tg::Tensor w = tg::from_vector({1, 0, 0, 1, 1, 1}, {3, 2});
  const tg::Tensor b = tg::from_vector({10, 20, 30}, {3});
  CHECK(tg::linear(x, w, b).to_vector() == std::vector<double>{11, 22, 33});
}

TEST_CASE("forward/sum and mean against hand-computed values") {
  const tg::Tensor a = tg::arange(24, {tg::DType::Float64}).view({2, 3, 4});  // a[i,j,k] = 12 i + 4 j + k
  CHECK(tg::sum(a).item() == 276);
  CHECK(tg::sum(a, {1}).shape() == tg::Shape{2, 4});
  CHECK(tg::sum(a, {1}).at({1, 2}) == 14 + 18 + 22);
  CHECK(tg::sum(a, {0, 2}, true).shape() == tg::Shape{1, 3, 1});
  CHECK(tg::sum(a, {0, 2}, true).at({0, 1, 0}) == (4 + 5 + 6 + 7) + (16 + 17 + 18 + 19));
  CHECK(tg::mean(a, {2}).at({0, 0}) == 1.5);
  CHECK(tg::sum(a.transpose(0, 2), {0}).at({1, 0}) == 4 + 5 + 6 + 7);  // a[0,1,:], read through a transpose
  CHECK(tg::sum_to(a, {3, 1}).to_vector() == std::vector<double>{(0 + 1 + 2 + 3) + (12 + 13 + 14 + 15),
                                                                  (4 + 5 + 6 + 7) + (16 + 17 + 18 + 19),
                                                                  (8 + 9 + 10 + 11) + (20 + 21 + 22 + 23)});
  const tg::Tensor tall = tg::arange(130 * 40, {tg::DType::Float64}).view({130, 40});  // column-sum path: 3 chunks
  CHECK(tg::sum(tall, {0}).at({7}) == 130 * 7 + 40.0 * (129 * 130 / 2));
  // the column-sum path with kept dims of more than one axis, and kept as ones
  const tg::Tensor deep = tg::arange(50 * 4 * 10, {tg::DType::Float64}).view({50, 4, 10});  // 40 i + 10 j + k
  const tg::Tensor kept = tg::sum(deep, {0}, true);
  CHECK(kept.shape() == tg::Shape{1, 4, 10});
  CHECK(kept.at({0, 2, 3}) == 50 * 23 + 40.0 * (49 * 50 / 2));
  CHECK(tg::sum(deep, {0}).at({3, 9}) == 50 * 39 + 40.0 * (49 * 50 / 2));
}

TEST_CASE("forward/softmax") {
  const tg::Tensor x = tg::from_vector({0, std::log(3.0), -kInf, -kInf}, {2, 2}, {tg::DType::Float64});
  const std::vector<double> y = tg::softmax(x).to_vector();
  check_close({y[0], y[1]}, {0.25, 0.75}, 1e-15);
  CHECK(y[2] == 0.0);  // fully masked row: zeros, not NaN
  CHECK(y[3] == 0.0);
}

TEST_CASE("forward/softmax backward through an all -inf row and through an additive -inf bias is finite and 0 there") {
  SUBCASE("a leaf holding an all -inf row") {
    tg::Tensor x = tg::from_vector({-kInf, -kInf, -kInf, 1, 2, 3}, {2, 3}, {tg::DType::Float64}).requires_grad_();
    tg::softmax(x).backward(tg::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, {tg::DType::Float64}));
    const std::vector<double> g = x.grad().to_vector();
    CHECK(g[0] == 0.0);
    CHECK(g[1] == 0.0);
    CHECK(g[2] == 0.0);
    for (double v : g) CHECK(std::isfinite(v));
  }
  SUBCASE("x + bias with -inf entries, gradient to both") {
    tg::Tensor x = tg::from_vector({0.5, -1, 2, 0.3, 0.1, -0.2}, {2, 3}, {tg::DType::Float64}).requires_grad_();
    tg::Tensor bias = tg::from_vector({0, -kInf, 0, -kInf, -kInf, -kInf}, {2, 3}, {tg::DType::Float64}).requires_grad_();
    tg::softmax(tg::add(x, bias)).backward(tg::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, {tg::DType::Float64}));
    for (const tg::Tensor& g : {x.grad(), bias.grad()}) {
      const std::vector<double> v = g.to_vector();
      for (double e : v) CHECK(std::isfinite(e));
      CHECK(v[1] == 0.0);  // a masked key
      CHECK(v[3] == 0.0);  // the fully masked row
      CHECK(v[4] == 0.0);
      CHECK(v[5] == 0.0);
    }
    // Row 0 over keys {0, 2}: y = softmax(0.5, 2), dx_j = y_j (g_j - sum g y).
    const double y0 = 1 / (1 + std::exp(1.5)), y2 = 1 - y0, dot = 1 * y0 + 3 * y2;
    check_close({x.grad().at({0, 0}), x.grad().at({0, 2})}, {y0 * (1 - dot), y2 * (3 - dot)}, 1e-14);
  }
}

TEST_CASE("forward/masked_fill: value where the mask is nonzero, whatever the mask's dtype") {
  const tg::Tensor mask64 = tg::from_vector({1e-50, 1, 0}, {3}, {tg::DType::Float64});  // 1e-50 is 0 as a float
  CHECK(tg::masked_fill(tg::zeros({3}), mask64, 9).to_vector() == std::vector<double>{9, 9, 0});
  const tg::Tensor x64 = tg::zeros({3}, {tg::DType::Float64});
  CHECK(tg::masked_fill(x64, tg::from_vector({1e-40, 0, -2}, {3}), 9).to_vector() == std::vector<double>{9, 0, 9});
  tg::Tensor x = tg::ones({3}).requires_grad_();
  tg::sum(tg::masked_fill(x, mask64, 9)).backward();  // no gradient where filled
  CHECK(x.grad().to_vector() == std::vector<double>{0, 0, 1});
}

TEST_CASE("forward/dropout keeps exactly the elements whose Philox uniform is >= p, scaled by 1/(1-p)") {
  const tg::PhiloxState rng{3, 9};
  // Rows not a whole number of Philox blocks (8 columns): each row starts a new
  // one. 37 columns go element by element, 44 as quads (the second quad of a
  // row's last block is missing).
  for (const int64_t cols : {37, 44}) {
    CAPTURE(cols);
    const int64_t rows = 12;
    const tg::Tensor x = tg::randn({3, rows / 3, cols}, {tg::DType::Float64});
    const std::vector<double> y = tg::dropout(x, {0.25, rng}).to_vector(), xv = x.to_vector();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        // The rule, evaluated here from the generator: block r * ceil(cols/8) + c/8, lane (c % 8) / 2,
        // its low 16 bits for an even c, its high 16 for an odd one; the uniform is those bits / 2^16.
        const uint32_t lane = tg::philox_block(rng, r * ((cols + 7) / 8) + c / 8).v[(c % 8) / 2];
        const uint32_t bits = c % 2 ? lane >> 16 : lane & 0xffffu;
        const double keep = static_cast<double>(bits) / 65536.0 >= 0.25 ? 1.0 : 0.0;
        CHECK(y[r * cols + c] == xv[r * cols + c] * keep * (1.0 / 0.75));
      }
  }
}

// p = 0 is the identity, with an explicit mask too (checked, not applied), as
// the spec's dP = dPd at p = 0; at p > 0 an explicit mask replaces the draw.
TEST_CASE("forward/dropout with an explicit mask: applied at p > 0, checked but not applied at p = 0") {
  const tg::Tensor x = tg::from_vector({1, 2, 3}, {3}, {tg::DType::Float64});
  const tg::Tensor mask = tg::from_vector({0, 1, 0}, {3}, {tg::DType::Float64});
  CHECK(tg::dropout(x, {0.0, std::nullopt, mask}).to_vector() == std::vector<double>{1, 2, 3});
  CHECK(tg::dropout(x, {0.5, std::nullopt, mask}).to_vector() == std::vector<double>{0, 4, 0});
  CHECK(contains(error_of([&] { tg::dropout(x, {0.0, std::nullopt, tg::full({3}, 0.5, {tg::DType::Float64})}); }),
                 "dropout: mask [3] must hold only 0 and 1"));
  // A given mask draws nothing, so p may pass the drawn masks' 1 - 2^-16 (below 1 as a float).
  CHECK(tg::dropout(x, {1.0 - 0x1p-21, std::nullopt, mask}).to_vector() == std::vector<double>{0, 0x1p22, 0});
  CHECK(error_of([&] { tg::dropout(x, {1.0, std::nullopt, mask}); }) == "dropout: p must be in [0, 1) as a float, got 1");
}

// At the largest p drawn masks take, 1 - 2^-16, the 16-bit draws keep 2^-16
// of the elements, which 1 / (1 - p) scales back: the mean stays near x's
// (past it they would keep more than 1 - p: check_dropout_p refuses).
TEST_CASE("forward/dropout at p = 1 - 2^-16 keeps 2^-16 of the elements") {
  const tg::Tensor kept =
      tg::dropout(tg::ones({1 << 22}, {tg::DType::Float64}), {1.0 - 0x1p-16, tg::PhiloxState{123, 0}});
  const std::vector<double> v = kept.to_vector();
  CHECK(*std::max_element(v.begin(), v.end()) == 0x1p16);
  CHECK(std::abs(tg::mean(kept).item() - 1.0) < 0.5);  // 64 kept elements expected, 2^16 each
}

TEST_CASE("forward/dropout masks: rate, lanes and neighbours within 5 sigma of Bernoulli(1 - p)") {
  const double p = 0.1, q = 1 - p;
  const int64_t n = 400000;
  const std::vector<double> m = tg::dropout_mask({n}, p, {21, 7}, {tg::DType::Float64}).to_vector();
  double kept = 0, pairs = 0, lane[8] = {};
  for (int64_t i = 0; i < n; ++i) {
    CHECK((m[i] == 0.0 || m[i] == 1.0));
    kept += m[i];
    lane[i % 8] += m[i];
    if (i + 1 < n) pairs += m[i] * m[i + 1];
  }
  auto within = [](double count, double trials, double prob) {
    return std::abs(count - trials * prob) <= 5 * std::sqrt(trials * prob * (1 - prob));
  };
  CHECK(within(kept, n, q));
  for (double l : lane) CHECK(within(l, n / 8, q));  // each 16-bit half of each Philox lane on its own
  CHECK(within(pairs, n - 1, q * q));                // neighbours independent
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

TEST_CASE("forward/layer_norm") {
  const tg::Tensor x = tg::from_vector({1, 2, 3, 4}, {1, 4}, {tg::DType::Float64});
  const std::vector<double> y = tg::layer_norm(x, tg::Tensor(), tg::Tensor(), 1e-12).to_vector();
  const double sd = std::sqrt(1.25 + 1e-12);
  check_close(y, {-1.5 / sd, -0.5 / sd, 0.5 / sd, 1.5 / sd});
}

TEST_CASE("forward/mse_loss, clone and cast") {
  CHECK(tg::mse_loss(tg::from_vector({1, 2}, {2}), tg::from_vector({3, 2}, {2})).item() == 2.0);
  CHECK(tg::clone(tg::from_vector({1.5, -2}, {2})).to_vector() == std::vector<double>{1.5, -2});
  tg::Tensor x = tg::from_vector({1.25, -2.5, 3}, {3}, {tg::DType::Float64}).requires_grad_();
  tg::sum(x.to(tg::DType::Float32).to(tg::DType::Float64) * 2.0).backward();
  CHECK(x.grad().dtype() == tg::DType::Float64);
  CHECK(x.grad().to_vector() == std::vector<double>{2, 2, 2});
}

TEST_CASE("gradcheck/a NaN or Inf on either side fails") {
  tg::Tensor at_minus_one = tg::from_vector({-1.0}, {1}, {tg::DType::Float64}).requires_grad_();
  const tg::GradcheckResult r = tg::gradcheck([](const std::vector<tg::Tensor>& t) { return tg::log(t[0]); }, {at_minus_one});
  CHECK_FALSE(r.ok);
  CHECK(contains(r.report, "nan"));
}

TEST_CASE("forward/layer_norm at the default eps on a nearly constant row") {
  const std::vector<double> x = {1, 1 + 1e-3, 1 - 1e-3, 1};  // variance 5e-7, small against eps = 1e-5
  const std::vector<double> y = tg::layer_norm(tg::from_vector(x, {1, 4}, {tg::DType::Float64})).to_vector();
  const double inv = 1 / std::sqrt(5e-7 + 1e-5);
  check_close(y, {0, 1e-3 * inv, -1e-3 * inv, 0}, 1e-9);
}
