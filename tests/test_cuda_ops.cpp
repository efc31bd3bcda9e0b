// cuda/<op>: every row of the op table (tests/op_table.cpp): the CUDA forward
// and backward against the CPU op on the same random inputs (never zeros).
// Every device allocation is poisoned with NaN (tests/main_cuda.cpp), so an
// output element a kernel did not write fails. One test case per op of
// autograd/op_list.h, generated from the list. Then the cases the table
// cannot express: precision modes, bit-identical masks, device moves, the
// sync-debug mode that blames a faulting kernel.
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <tuple>

#include "cuda_helpers.h"
#include "op_table.h"
#include "ops/binary_mask.h"
#include "ops/binary_mask_kernels.h"
#include "ops/elementwise_kernels.h"
#include "ops/foreach.h"
#include "ops/matmul_kernels.h"
#include "ops/reduce_kernels.h"
#include "ops/untracked.h"

using namespace tgtest;

namespace {

void run_parity(tg::OpId op) {
  const std::vector<const OpCase*> cases = cases_of(op, kParity);
  REQUIRE_MESSAGE(!cases.empty(), "op '" << tg::op_name(op) << "' has no CUDA parity row in tests/op_table.cpp");
  const Dims dims = dims_for(kParity);
  tg::manual_seed(static_cast<uint64_t>(op) + 1);  // the inputs do not depend on which tests ran before
  for (const OpCase* c : cases) {
    CAPTURE(case_name(*c));
    expect_parity([&](const V& t) { return c->run(t, dims); }, make_inputs(*c, kParity, tg::DType::Float32),
                  {c->parity.atol, c->parity.rtol});
  }
}

// The output of running this test binary again with `args` (the fault probe
// runs in a child: a faulting kernel poisons its CUDA context for good).
std::string run_self(const std::string& args, int& status) {
  char self[4096] = {};
  REQUIRE(readlink("/proc/self/exe", self, sizeof self - 1) > 0);  // this binary, not the shell popen starts
  const std::string cmd = std::string(self) + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  REQUIRE(pipe);
  std::string out;
  char buf[256];
  while (fgets(buf, sizeof buf, pipe)) out += buf;
  status = pclose(pipe);
  return out;
}

// Which elements of an n-element matrix to_fp16's sample reads.
std::vector<bool> sampled_elements(int64_t n) {
  std::vector<bool> sampled(size_t(n), false);
  for (int64_t k = 0; k < tg::kFp16Samples; ++k) sampled[size_t(tg::fp16_sample_index(k, n))] = true;
  return sampled;
}

// 1e-3 N(0, 1) values of a rows x cols matrix, but for one 1e4 where the
// sample does not look: the first conversion overflows it, so to_fp16
// converts again at the scale of the true max.
std::vector<double> with_unsampled_max(int64_t rows, int64_t cols) {
  const std::vector<bool> sampled = sampled_elements(rows * cols);
  std::vector<double> values = tg::mul(tg::randn({rows, cols}), 1e-3).to_vector();
  size_t unseen = 0;
  while (sampled[unseen]) ++unseen;
  values[unseen] = 1e4;
  return values;
}

}  // namespace

#define TG_PARITY_TEST(name) \
  TEST_CASE("cuda/" #name * doctest::skip(kNoGpu)) { run_parity(tg::OpId::name); }
TG_OP_LIST(TG_PARITY_TEST)
#undef TG_PARITY_TEST

TEST_CASE("gradcheck/ops that move between devices, on CUDA" * doctest::skip(kNoGpu)) {
  const Dims dims = dims_for(kGradcheck);
  int checked = 0;
  for (const OpCase& c : op_cases()) {
    if (!c.needs_cuda || !(c.uses & kGradcheck)) continue;
    CAPTURE(case_name(c));
    const tg::GradcheckResult r =
        tg::gradcheck([&](const V& t) { return c.run(t, dims); }, make_inputs(c, kGradcheck, tg::DType::Float64), c.gradcheck_eps);
    INFO("worst element: " << r.report);
    CHECK(r.ok);
    ++checked;
  }
  CHECK(checked > 0);
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

// fp16 operands carry TF32's mantissa: on a weight gradient's shape (k =
// tokens, both operands k-strided) the same error against fp64 as a TF32
// GEMM within 2x, and far from fp32's, also for inputs far outside fp16's
// range (scaled on the device).
TEST_CASE("cuda/gemm_fp16: TF32's accuracy at any magnitude, every transpose, two matrices per group" *
          doctest::skip(kNoGpu)) {
  for (const auto& [magnitude, b_magnitude] : std::vector<std::pair<double, double>>{{1.0, 1.0}, {1e-9, 1.0}, {1e9, 1.0},
                                                                                      {1e-17, 1e-17}}) {
    CAPTURE(magnitude);
    CAPTURE(b_magnitude);
    const tg::Tensor a = tg::mul(tg::randn({2048, 256}), magnitude), b = tg::mul(tg::randn({2048, 384}), b_magnitude);
    const tg::Tensor exact = tg::matmul(a.to(tg::DType::Float64).transpose(0, 1), b.to(tg::DType::Float64));
    const tg::Tensor ag = a.cuda(), bg = b.cuda();
    const auto error_of = [&](const tg::Tensor& c) {
      return max_abs_diff(c.cpu().to(tg::DType::Float64), exact) / (magnitude * b_magnitude);
    };
    const tg::TensorOptions cuda32{tg::DType::Float32, tg::Device::CUDA};
    const tg::Tensor fp32 = tg::empty({256, 384}, cuda32), tf32 = tg::empty({256, 384}, cuda32),
                     fp16 = tg::full({256, 384}, std::nan(""), cuda32);
    tg::gemm_into("test", ag.transpose(0, 1), bg, fp32, 0.0, tg::MatmulPrecision::Highest);
    tg::gemm_into("test", ag.transpose(0, 1), bg, tf32, 0.0, tg::MatmulPrecision::High);
    tg::gemm_fp16_into(tg::to_fp16({bg, ag}), 1, true, 0, false, fp16);
    CHECK(error_of(fp16) < 2 * error_of(tf32));
    CHECK(error_of(fp16) > 20 * error_of(fp32));
  }
  // An Inf spoils its own row of the product only, not the scale of the other
  // elements (at 1e-6 they are fp16 subnormals unless scaled: ~3e-7 off, not ~7e-9).
  {
    std::vector<double> values = tg::mul(tg::randn({64, 32}), 1e-6).to_vector();
    values[5 * 32 + 7] = INFINITY;
    const tg::Tensor a = tg::from_vector(values, {64, 32}, {tg::DType::Float32}), b = tg::randn({32, 16});
    const tg::Tensor c = tg::empty({64, 16}, {tg::DType::Float32, tg::Device::CUDA});
    tg::gemm_fp16_into(tg::to_fp16({a.cuda(), b.cuda()}), 0, false, 1, false, c);
    const tg::Tensor got = c.cpu(), expected = tg::matmul(a, b);
    for (int64_t j = 0; j < 16; ++j) CHECK(!std::isfinite(got.at({5, j})));
    CHECK(max_abs_diff(got.narrow(0, 0, 5), expected.narrow(0, 0, 5)) < 5e-8);
    CHECK(max_abs_diff(got.narrow(0, 6, 58), expected.narrow(0, 6, 58)) < 5e-8);
  }
  // Every transpose combination against the fp32 GEMM, odd element counts, a misaligned start.
  const tg::Tensor x = tg::randn({33, 17}).cuda(), y = tg::randn({17, 9}).cuda();
  const tg::Tensor xt = x.transpose(0, 1).contiguous();
  tg::Tensor yt = tg::randn({1 + 9 * 17}).cuda().narrow(0, 1, 9 * 17);
  yt.copy_(y.transpose(0, 1).contiguous().view({9 * 17}));
  const tg::Tensor expected = tg::matmul(x, y).cpu();
  const tg::Fp16Group group = tg::to_fp16({x, y, xt, yt.view({9, 17})});
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      CAPTURE(ta);
      CAPTURE(tb);
      const tg::Tensor c = tg::full({33, 9}, std::nan(""), {tg::DType::Float32, tg::Device::CUDA});
      tg::gemm_fp16_into(group, ta ? 2 : 0, ta, tb ? 3 : 1, tb, c);
      CHECK(max_abs_diff(c.cpu(), expected) < 2e-2);
    }
  CHECK_THROWS_WITH(tg::gemm_fp16_into(group, 0, false, 0, false, tg::empty({33, 17}, {tg::DType::Float32, tg::Device::CUDA})),
                    doctest::Contains("does not give c"));
  CHECK_THROWS_WITH(tg::gemm_fp16_into(group, 0, false, 4, false, tg::empty({33, 9}, {tg::DType::Float32, tg::Device::CUDA})),
                    doctest::Contains("matrices 0 and 4 of a group of 4"));
}

// A bias in the fp16 GEMM: in cuBLASLt's epilogue (a bias on a 16-byte
// boundary, a group without low parts: try_gemm_fp16_bias takes the 300 x
// 200 x 96 product at every transpose) and by the pass after it (a bias 4
// bytes off one; a split group; m or k of 1) c is the product plus the bias
// on every row, every element written (c poisoned, 16 bytes into its
// buffer), against the product without a bias plus the bias in float64;
// shapes with n, m or k of 1 and odd m. k = 0 gives the bias alone; a bias of
// the wrong size is named.
TEST_CASE("cuda/gemm_fp16: a bias added to every row, in the epilogue or after it" * doctest::skip(kNoGpu)) {
  const tg::TensorOptions cuda32{tg::DType::Float32, tg::Device::CUDA};
  const auto f64 = [](const tg::Tensor& t) { return t.cpu().to(tg::DType::Float64); };
  using Sizes = std::tuple<int64_t, int64_t, int64_t>;  // c [n, m], depth k
  for (const auto& [n, m, k] : {Sizes{300, 200, 96}, Sizes{33, 9, 17}, Sizes{1, 5, 3}, Sizes{7, 1, 3}, Sizes{5, 7, 1}})
    for (const bool ta : {false, true})
      for (const bool tb : {false, true}) {
        const tg::Tensor a = tg::randn(ta ? tg::Shape{k, n} : tg::Shape{n, k}).cuda();
        const tg::Tensor b = tg::randn(tb ? tg::Shape{m, k} : tg::Shape{k, m}).cuda();
        const tg::Tensor stored = tg::randn({m + 4}).cuda();
        for (const int64_t shift : {4, 1})  // 16 bytes into a fresh tensor (16-byte aligned), 4 bytes
          for (const bool split : {false, true}) {
            CAPTURE(n);
            CAPTURE(m);
            CAPTURE(k);
            CAPTURE(ta);
            CAPTURE(tb);
            CAPTURE(shift);
            CAPTURE(split);
            const tg::Tensor bias = stored.narrow(0, shift, m);
            const tg::Fp16Group group = split ? tg::to_fp16_split({a, b}) : tg::to_fp16({a, b});
            const tg::Tensor plain = tg::full({n, m}, std::nan(""), cuda32);
            tg::gemm_fp16_into(group, 0, ta, 1, tb, plain);
            tg::Tensor c = tg::full({n * m + 4}, std::nan(""), cuda32).narrow(0, 4, n * m).view({n, m});
            tg::gemm_fp16_into(group, 0, ta, 1, tb, c, tg::Tensor(), bias);
            const tg::Tensor expected = tg::add(f64(plain), f64(bias));
            CHECK(max_abs_diff(f64(c), expected) < 2e-5 * double(k));  // fp32 sums of |a b| ~ 1 in any order
            CHECK(max_abs_diff(f64(tg::gemm_fp16(group, 0, ta, 1, tb, bias)), expected) < 2e-5 * double(k));
#ifdef TG_CUDA
            if (n == 300 || split || shift == 1 || m == 1 || k == 1) {
              c.fill_(std::nan(""));
              const bool took = tg::GemmKernels<tg::Device::CUDA>::try_gemm_fp16_bias(group, 0, ta, 1, tb, bias, c);
              CHECK(took == (!split && shift == 4 && m > 1 && k > 1));
              if (took) CHECK(max_abs_diff(f64(c), expected) < 2e-5 * double(k));
            }
#endif
          }
      }
  const tg::Fp16Group empty_k = tg::to_fp16({tg::empty({5, 0}, cuda32), tg::empty({3, 0}, cuda32)});
  const tg::Tensor bias3 = tg::randn({3}).cuda();
  CHECK(max_abs_diff(tg::gemm_fp16(empty_k, 0, false, 1, true, bias3).cpu(), bias3.cpu().expand({5, 3})) == 0);
  const tg::Tensor x = tg::randn({4, 6}).cuda(), w = tg::randn({5, 6}).cuda();
  CHECK_THROWS_WITH(tg::gemm_fp16(tg::to_fp16({x, w}), 0, false, 1, true, tg::ones({6}, cuda32)),
                    doctest::Contains("gemm_fp16: the bias must be float32 [5] on cuda for c [4,5]; got float32 [6]"));
}

namespace {

// The elements of an fp16 copy (two per float32 of its storage), as doubles.
std::vector<double> fp16_elements(const tg::Fp16Matrix& m) {
  const tg::Tensor host = m.values.cpu();
  const auto* bits = reinterpret_cast<const uint16_t*>(host.data<float>());
  std::vector<double> out(static_cast<size_t>(m.rows * m.cols));
  for (size_t i = 0; i < out.size(); ++i) {
    const int sign = bits[i] >> 15 ? -1 : 1, exponent = (bits[i] >> 10) & 31, mantissa = bits[i] & 1023;
    if (exponent == 31) out[i] = mantissa ? std::nan("") : sign * INFINITY;
    else out[i] = sign * std::ldexp(exponent ? 1024 + mantissa : mantissa, (exponent ? exponent : 1) - 25);
  }
  return out;
}

// The first row of x [n, ...] that no sampled element of y [n, m] falls in
// (linear_to_fp16's sample: fp16_sample_index over y).
int64_t unsampled_row(int64_t n, int64_t m) {
  std::vector<bool> sampled(static_cast<size_t>(n));
  for (int64_t k = 0; k < tg::kFp16Samples; ++k) sampled[size_t(tg::fp16_sample_index(k, n * m) / m)] = true;
  const int64_t row = std::find(sampled.begin(), sampled.end(), false) - sampled.begin();
  REQUIRE(row < n);
  return row;
}

}  // namespace

// regroup_fp16: one kernel writes a group's scalars from matrices converted
// apart, each source kind's scale read as the header states: kStorage the
// source group's own slot (its inverse scale and bound scale), kBound that
// group's bound scale shifted (stored at that scale: the inverse is its
// reciprocal), kExponent 2^e for an int32 e. Every pair's alpha (and its
// low-part alpha), each bound scale, beta and one against the host's
// values, exactly: all are powers of two and their products.
TEST_CASE("cuda/regroup_fp16: the scalars of matrices converted apart" * doctest::skip(kNoGpu)) {
  tg::manual_seed(61);
  const tg::Fp16Group a =
      tg::to_fp16({tg::mul(tg::randn({4, 6}), 300.0).cuda(), tg::mul(tg::randn({5, 6}), 1e-3).cuda()});
  const std::vector<double> a_scalars = a.scalars.cpu().to_vector();
  const int exponent = 5;  // an int32 stored in a float slot: its bits are the denormal 5 * 2^-149
  const tg::Tensor exponents = tg::from_vector({0.0, double(std::bit_cast<float>(exponent))}, {2}).cuda();
  using S = tg::Fp16ScaleSource;
  const tg::Fp16Group g = tg::regroup_fp16({{a.matrices[0], a.scalars, 0},
                                            {a.matrices[1], a.scalars, 1, S::kBound, 3},
                                            {a.matrices[1], exponents, 1, S::kExponent}});
  REQUIRE(g.matrices.size() == 3);
  CHECK(g.matrices[1].values.raw_data() == a.matrices[1].values.raw_data());
  const auto a_scalar = [&](int slot) { return float(a_scalars[size_t(slot)]); };
  const float bound1 = tg::fp16_scale_from_bound(a_scalar(tg::kFp16BoundScales + 1), 3);
  const std::vector<float> inverse{std::sqrt(a_scalar(0)), 1.f / bound1, std::ldexp(1.f, -exponent)};
  const std::vector<float> bound{a_scalar(tg::kFp16BoundScales + 0), bound1, std::ldexp(1.f, exponent)};
  const std::vector<double> got = g.scalars.cpu().to_vector();
  for (int i = 0; i < 3; ++i) {
    CAPTURE(i);
    CHECK(got[size_t(tg::kFp16BoundScales + i)] == bound[size_t(i)]);
    for (int j = 0; j < 3; ++j) {
      CAPTURE(j);
      const size_t pair = size_t(i * tg::kMaxFp16Group + j);
      CHECK(got[pair] == inverse[size_t(i)] * inverse[size_t(j)]);
      CHECK(got[tg::kFp16LowAlphas + pair] == inverse[size_t(i)] * inverse[size_t(j)] / tg::kFp16LowFactor);
    }
  }
  CHECK(got[tg::kFp16Beta] == 0.0);
  CHECK(got[tg::kFp16One] == 1.0);
  CHECK(inverse[0] != inverse[1]);  // the three kinds give three different scales here
  CHECK(inverse[1] != inverse[2]);
}

// linear_to_fp16: the GEMM writes y = x W^T + b as fp16 at 2^e: every
// element (the allocator's NaN poison under it) within fp16's roundings of
// the float64 product (of x, W, the bias and y); y's max at the kept scale
// in to_fp16's window [2^8, 2^14), the bound scale and alphas as to_fp16
// writes them. The four ways to the kept scale: the sample's scale kept;
// the bound's (an outlier of x in a row the sample misses, along a column
// W barely uses), y rescaled up; the sample's with y's max past the window
// (an outlier the bound allows), y rescaled down; and the bound's scale kept
// where the sample's would have overflowed fp16. y of at most 1024
// elements: the sample is all of it. The shapes the epilogue does not take
// (m or k of 1) go through the float product and to_fp16 (the GEMM's alpha
// slot is never written there: the allocator's NaN); zeros; a bias of the
// wrong size. Each case also in linear_to_fp16's three steps
// (start_linear_to_fp16, then the amax and the finish): y at its first
// scale and scalars that describe it in between, the same y at the end.
TEST_CASE("cuda/linear_to_fp16: the GEMM writes y's fp16 copy at to_fp16's scales" * doctest::skip(kNoGpu)) {
  tg::manual_seed(53);
  struct Case {
    const char* name;
    tg::Tensor x, w, b;
    int epilogue;  // 1: the fp16 GEMM runs, 0: the float product and to_fp16, -1: cuBLASLt's choice (odd rows)
    int rescaled;  // log2(kept / first)'s sign, where the fp16 GEMM ran
  };
  std::vector<Case> cases = {
      {"random, a bias", tg::randn({300, 96}), tg::mul(tg::randn({200, 96}), 0.1), tg::randn({200}), 1, 0},
      {"k % 8 != 0, no bias", tg::randn({257, 37}), tg::randn({34, 37}), tg::Tensor(), -1, 0},
      {"m of 1", tg::randn({50, 16}), tg::randn({1, 16}), tg::randn({1}), 0, 0},
      {"k of 1", tg::randn({50, 1}), tg::randn({24, 1}), tg::randn({24}), 0, 0},
      {"x of zeros, a bias", tg::zeros({10, 8}), tg::randn({16, 8}), tg::randn({16}), 1, 0},
      {"zeros", tg::zeros({10, 8}), tg::zeros({16, 8}), tg::Tensor(), 1, 0}};
  {
    std::vector<double> x = tg::mul(tg::randn({4096, 256}), 0.01).to_vector();
    x[size_t(unsampled_row(4096, 64) * 256 + 5)] = 1e4;
    std::vector<double> w = tg::mul(tg::randn({64, 256}), 0.05).to_vector();
    for (int64_t j = 0; j < 64; ++j) w[size_t(j * 256 + 5)] *= 1e-3;  // the outlier's row: |y| ~ 2, the bound ~ 1e4
    cases.push_back({"an outlier outside the sample", tg::from_vector(x, {4096, 256}), tg::from_vector(w, {64, 256}),
                     tg::Tensor(), 1, 1});
  }
  {
    std::vector<double> x(4096 * 2, 0.975);
    const int64_t r = unsampled_row(4096, 64);
    x[size_t(2 * r)] = x[size_t(2 * r + 1)] = 50;  // y = 1.95, and 100 in row r: the bound, 100
    cases.push_back(
        {"an outlier the bound allows", tg::from_vector(x, {4096, 2}), tg::ones({64, 2}), tg::Tensor(), 1, -1});
    // 1000 in row r: 256000 at the sample's scale 2^8, past fp16's range; the bound, ~1004: 2^4, y's max 16000
    x[size_t(2 * r)] = x[size_t(2 * r + 1)] = 500;
    cases.push_back({"an outlier only the bound keeps finite", tg::from_vector(x, {4096, 2}), tg::ones({64, 2}),
                     tg::Tensor(), 1, 0});
  }
  {
    // y's largest element alone, where the amax pass reads it: y is 0 but in
    // its last column, 1.95 there, and 1000 at (r, m - 1) of a row r of (500,
    // 500). Missed, the kept scale would come from the 1.95s, 2^5 times the
    // bound's: 1000 past fp16's range. With 4096 x 64 elements, (r, 63) is the
    // last of its 16-byte load's eight; with 4097 x 62 (and r the last row),
    // the last element, 6 past the last whole 16 bytes.
    const auto alone = [](int64_t n, int64_t m, int64_t r) {
      std::vector<double> x(size_t(n * 2), 0.975), w(size_t(m * 2), 1.0);
      x[size_t(2 * r)] = x[size_t(2 * r + 1)] = 500;
      for (int64_t j = 0; j + 1 < m; ++j) w[size_t(2 * j + 1)] = -1;
      return std::pair{tg::from_vector(x, {n, 2}), tg::from_vector(w, {m, 2})};
    };
    const auto [x8, w8] = alone(4096, 64, unsampled_row(4096, 64));
    cases.push_back({"the largest element alone, the last of its 16 bytes", x8, w8, tg::Tensor(), 1, 0});
    const auto [x_tail, w_tail] = alone(4097, 62, 4096);
    cases.push_back({"the largest element alone and last, past the last whole 16 bytes", x_tail, w_tail, tg::Tensor(),
                     -1, 0});
  }
  for (const Case& c : cases) {
    CAPTURE(std::string(c.name));
    const tg::Fp16Group y = tg::linear_to_fp16(c.x.cuda(), c.w.cuda(), c.b.defined() ? c.b.cuda() : c.b);
    REQUIRE(y.matrices.size() == 1);
    const int64_t n = c.x.size(0), m = c.w.size(0), k = c.x.size(1);
    REQUIRE((y.matrices[0].rows == n && y.matrices[0].cols == m));
    const std::vector<double> v = fp16_elements(y.matrices[0]), sc = y.scalars.cpu().to_vector();
    const std::vector<double> x = c.x.to_vector(), w = c.w.to_vector();
    const std::vector<double> b = c.b.defined() ? c.b.to_vector() : std::vector<double>(size_t(m), 0.0);
    // The elements stored at scale s off the float64 product by more than fp16's roundings, and their max.
    const auto off_and_max = [&](const std::vector<double>& stored, double s) {
      int64_t off = 0;
      double stored_max = 0;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < m; ++j) {
          double exact = b[size_t(j)], size = std::abs(b[size_t(j)]);
          for (int64_t t = 0; t < k; ++t) {
            exact += x[size_t(i * k + t)] * w[size_t(j * k + t)];
            size += std::abs(x[size_t(i * k + t)] * w[size_t(j * k + t)]);
          }
          const double got = stored[size_t(i * m + j)];
          off += !(std::abs(got / s - exact) <= 0x1p-9 * size + 0x1p-24 / s);
          stored_max = std::max(stored_max, std::abs(got));
        }
      return std::pair{off, stored_max};
    };
    const double s = 1 / std::sqrt(sc[0]);  // alpha(0, 0) = 1 / s^2
    const auto [off, stored_max] = off_and_max(v, s);
    CHECK(off == 0);
    CHECK(std::log2(s) == std::round(std::log2(s)));
    CHECK(sc[tg::kFp16Beta] == 0.0);
    CHECK(sc[tg::kFp16One] == 1.0);
    const double first = sc[tg::kFp16Scratch + tg::kMaxFp16Group], alpha = sc[tg::kFp16Scratch + tg::kMaxFp16Group + 1];
    const bool epilogue = !std::isnan(alpha);
    if (c.epilogue >= 0) CHECK(epilogue == bool(c.epilogue));
    else MESSAGE(std::string(c.name) << ": cuBLASLt " << std::string(epilogue ? "took" : "refused") << " the fp16 GEMM");
    if (epilogue) CHECK((s > first) - (s < first) == c.rescaled);
    // The three steps apart: after the start, y at the first scale with
    // scalars that say so (the bound scale first / 4: |y| first <= 2^15);
    // after the amax and the finish, linear_to_fp16's y and scalars.
    const tg::Fp16Product steps = tg::start_linear_to_fp16(c.x.cuda(), c.w.cuda(), c.b.defined() ? c.b.cuda() : c.b);
    CHECK(steps.pending == epilogue);
    if (steps.pending) {
      const std::vector<double> at_first = steps.y.scalars.cpu().to_vector();
      const auto [first_off, first_max] = off_and_max(fp16_elements(steps.y.matrices[0]), first);
      CHECK(first_off == 0);
      CHECK(first_max <= 0x1p15);
      CHECK(at_first[0] == 1 / (first * first));
      CHECK(at_first[tg::kFp16BoundScales] == first / 4);
    }
    tg::find_fp16_product_amax(steps);
    tg::finish_fp16_product(steps);
    CHECK(fp16_elements(steps.y.matrices[0]) == v);
    const std::vector<double> finished = steps.y.scalars.cpu().to_vector();
    CHECK(finished[0] == sc[0]);
    CHECK(finished[tg::kFp16BoundScales] == sc[tg::kFp16BoundScales]);
    if (stored_max == 0) {
      CHECK(s == 1.0);
      continue;
    }
    CHECK(stored_max >= 0x1p8);
    CHECK(stored_max < 0x1p14);
    const double bound_scale = sc[tg::kFp16BoundScales];
    CHECK(stored_max / s * bound_scale >= 0x1p13);
    CHECK(stored_max / s * bound_scale < 0x1p14);
  }
  const tg::TensorOptions cuda32{tg::DType::Float32, tg::Device::CUDA};
  CHECK_THROWS_WITH(tg::linear_to_fp16(tg::randn({4, 6}).cuda(), tg::randn({5, 6}).cuda(), tg::ones({6}, cuda32)),
                    doctest::Contains("linear_to_fp16: the column bias of x W^T [4,5] must be a contiguous float32 [5] "
                                      "on cuda; got float32 [6] on cuda"));
}

#ifdef TG_CUDA
namespace tgtest {
// c = a b^T, 64 x 64 x k; layouts: 0 no swizzle, 1 A with the 128-byte swizzle, 2 B, 3 both,
// 4 A from registers (B without swizzle), 5 A from registers (B swizzled); B MN-major (imm-trans-b):
// 6 MnMajor, 7 the same with A from registers, 8 MnMajorOfRows, 9 the same with A from registers;
// with the 128-byte swizzle, MnMajor128B: 10 B MN-major, 11 A MN-major (imm-trans-a)
void wgmma_product(const float* a, const float* b, int k, int layouts, float* c);
}  // namespace tgtest

// wgmma (core/wgmma.cuh) on its own: a 64 x 64 x k product of values that
// are multiples of 1/8 in [-2, 2] (exact in fp16, and every partial sum
// exact in fp32), so it must equal the float64 product exactly; c poisoned
// with NaN, and the accumulators start as NaN, which the first product must
// overwrite. Each operand without swizzle or with the 128-byte swizzle, the
// two also mixed (a K order wrong in one layout cannot cancel against the
// same error in the other), A from registers (mma.sync's A fragment), B
// MN-major in both arrangements of core/wgmma.cuh, and either operand
// MN-major with the 128-byte swizzle (as the TMA lays out a [k][mn] box).
// A wrong descriptor offset, layout, register map or accumulator map puts
// values in the wrong place or sums the wrong ones.
TEST_CASE("cuda/wgmma: a 64 x 64 product of exact values, every k step" *
          doctest::skip(kNoGpu || !tgtest::wgmma_supported())) {
  std::mt19937 gen(49);
  std::uniform_int_distribution<int> eighths(-16, 16);
  for (const auto& [layouts, k] : std::vector<std::pair<int, int>>{{0, 16}, {0, 64}, {0, 128}, {1, 64}, {2, 128},
                                                                   {3, 64}, {3, 128}, {4, 64}, {5, 128},
                                                                   {6, 64}, {7, 128}, {8, 64}, {9, 128},
                                                                   {10, 64}, {11, 128}}) {
    CAPTURE(layouts);
    CAPTURE(k);
    std::vector<double> av(64 * k), bv(64 * k);
    for (double& v : av) v = eighths(gen) / 8.0;
    for (double& v : bv) v = eighths(gen) / 8.0;
    const tg::TensorOptions f32{tg::DType::Float32};
    const tg::Tensor a = tg::from_vector(av, {64, k}, f32).cuda(), b = tg::from_vector(bv, {64, k}, f32).cuda();
    const tg::Tensor c = tg::full({64, 64}, std::nan(""), {tg::DType::Float32, tg::Device::CUDA});
    tgtest::wgmma_product(a.data<float>(), b.data<float>(), k, layouts, c.data<float>());
    const std::vector<double> cv = c.cpu().to_vector();
    int64_t wrong = 0;
    for (int i = 0; i < 64; ++i)
      for (int j = 0; j < 64; ++j) {
        double want = 0;
        for (int x = 0; x < k; ++x) want += av[i * k + x] * bv[j * k + x];
        wrong += cv[i * 64 + j] != want;
      }
    CHECK(wrong == 0);
  }
}

namespace tgtest {
// c = a b (64 x k by k x 64) by mma::Fp16x3 (tests/mma_probe.cu) and mma::Fp16x3Warpgroup (tests/wgmma_probe.cu).
void split_product(int form, const float* a, const float* b, int k, float* c);
void split_product_warpgroup(int form, const float* a, const float* b, int k, float* c);
void fragment_row_sums(const double* v, double* out);
}  // namespace tgtest

// The split fp16 products ("highest" in the benchmark interface's kernels) on
// their own: mma::Fp16x3 (mma.sync) and, on compute capability 9.0,
// mma::Fp16x3Warpgroup (wgmma). A 64 x 4096 by 4096 x 64 product added into
// running accumulators in 64 chunks of k = 64, as the kernels add every query
// tile into dK and dV, for each form of operand A (staged, from accumulators,
// from a float tile; with the warpgroup products the first two also with B as
// mma::SwizzledRows, the interface's Q and dO tiles), on positive data (every
// partial sum grows: the case where truncating the tensor cores' accumulation
// biases the result most) and signed data; output poisoned with NaN. Each
// product must be within 2x of a sequential fp32 FMA loop's error against
// float64: both policies keep the running sum out of the tensor cores (a fresh
// accumulator per 16-wide step, or per 64-wide product, added by rounded FP32
// instructions). Adding hi hi straight into the running sum instead put it 12x
// over fp32's on the H200 (bench/NOTES.md version 23); a lost or doubled 2^-11,
// a swapped part or a misplaced low part, at fp16's precision or worse.
TEST_CASE("cuda/mma_split: split fp16 products near fp32 over a long k, every operand form" * doctest::skip(kNoGpu)) {
  constexpr int k = 4096, n = 64;
  std::mt19937 gen(50);
  const char* const forms[] = {"both staged", "A from accumulators", "A from a float tile",
                               "both staged, B swizzled", "A from accumulators, B swizzled"};
  struct Policy {
    const char* name;
    void (*product)(int, const float*, const float*, int, float*);
    bool runs;
    int forms;  // the warpgroup products also take B as mma::SwizzledRows (forms 3 and 4)
  };
  const Policy policies[] = {{"Fp16x3", tgtest::split_product, true, 3},
                             {"Fp16x3Warpgroup", tgtest::split_product_warpgroup, tgtest::wgmma_supported(), 5}};
  for (const bool positive : {true, false}) {
    std::uniform_real_distribution<double> dist(positive ? 0.0 : -1.0, 1.0);
    std::vector<double> av(size_t(n) * k), bv(size_t(k) * n);
    for (double& v : av) v = static_cast<float>(dist(gen));
    for (double& v : bv) v = static_cast<float>(dist(gen));
    double largest = 0, fp32_error = 0;
    std::vector<double> ref(size_t(n) * n);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        double exact = 0;
        float sequential = 0.f;
        for (int x = 0; x < k; ++x) {
          exact += av[size_t(i) * k + x] * bv[size_t(x) * n + j];
          sequential = std::fmaf(float(av[size_t(i) * k + x]), float(bv[size_t(x) * n + j]), sequential);
        }
        ref[size_t(i) * n + j] = exact;
        largest = std::max(largest, std::abs(exact));
        fp32_error = std::max(fp32_error, std::abs(sequential - exact));
      }
    const tg::TensorOptions f32{tg::DType::Float32};
    const tg::Tensor a = tg::from_vector(av, {n, k}, f32).cuda(), b = tg::from_vector(bv, {k, n}, f32).cuda();
    for (const Policy& policy : policies) {
      if (!policy.runs) continue;
      for (int form = 0; form < policy.forms; ++form) {
        CAPTURE(positive);
        CAPTURE(std::string(policy.name));
        CAPTURE(std::string(forms[form]));
        const tg::Tensor c = tg::full({n, n}, std::nan(""), {tg::DType::Float32, tg::Device::CUDA});
        policy.product(form, a.data<float>(), b.data<float>(), k, c.data<float>());
        const std::vector<double> cv = c.cpu().to_vector();
        double error = 0;
        for (size_t e = 0; e < cv.size(); ++e)
          error = std::isfinite(cv[e]) ? std::max(error, std::abs(cv[e] - ref[e])) : INFINITY;
        const std::string what = std::string(policy.name) + ", " + forms[form] + (positive ? ", positive" : ", signed");
        MESSAGE(what << ": error / fp32 loop's " << error / fp32_error << " (fp32 loop's " << fp32_error / largest
                     << " of the largest)");
        CHECK(error <= 2 * fp32_error);
      }
    }
  }
}

// mma::sum_over_fragment_rows: lane l's eight values l + i / 8 (exact in
// double); lane l must end with value l / 4 summed over the eight lanes
// that share l % 4.
TEST_CASE("cuda/mma_split: eight sums over a fragment's rows, one per lane" * doctest::skip(kNoGpu)) {
  std::vector<double> v(32 * 8);
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 8; ++i) v[size_t(lane) * 8 + i] = lane + i / 8.0;
  const tg::TensorOptions f64{tg::DType::Float64};
  const tg::Tensor in = tg::from_vector(v, {32 * 8}, f64).cuda();
  const tg::Tensor out = tg::full({32}, std::nan(""), {tg::DType::Float64, tg::Device::CUDA});
  tgtest::fragment_row_sums(in.data<double>(), out.data<double>());
  const std::vector<double> got = out.cpu().to_vector();
  for (int lane = 0; lane < 32; ++lane) {
    double want = 0;
    for (int other = lane % 4; other < 32; other += 4) want += v[size_t(other) * 8 + lane / 4];
    CAPTURE(lane);
    CHECK(got[size_t(lane)] == want);
  }
}
#endif

// to_fp16_split's two parts rebuild each element to 22 bits: x times an
// identity (exact in fp16, and each output a single product) gives hi + 2^-11
// lo unscaled, within 2^-21 |x| of x (to_fp16's hi alone: 2^-12), at any
// magnitude; an Inf leaves its row of the product non-finite and every other
// row as it was (the scales ignore non-finite values); the hi parts and the
// scalars to_fp16 writes are to_fp16's, bit for bit.
TEST_CASE("cuda/to_fp16_split: hi + 2^-11 lo is x to 22 bits" * doctest::skip(kNoGpu)) {
  tg::manual_seed(47);
  for (const double magnitude : {1.0, 1e-9, 1e9}) {
    CAPTURE(magnitude);
    std::vector<double> identity(67 * 67, 0.0);
    for (int64_t i = 0; i < 67; ++i) identity[i * 67 + i] = 1.0;
    const tg::Tensor x = tg::mul(tg::randn({130, 67}), magnitude).cuda();
    const tg::Tensor eye = tg::from_vector(identity, {67, 67}, {tg::DType::Float32}).cuda();
    const tg::TensorOptions cuda32{tg::DType::Float32, tg::Device::CUDA};
    const tg::Tensor split = tg::full({130, 67}, std::nan(""), cuda32), plain = tg::full({130, 67}, std::nan(""), cuda32);
    const tg::Fp16Group group = tg::to_fp16_split({x, eye});
    tg::gemm_fp16_into(group, 0, false, 1, false, split);
    tg::gemm_fp16_into(tg::to_fp16({x, eye}), 0, false, 1, false, plain);
    const std::vector<double> xv = x.cpu().to_vector(), sv = split.cpu().to_vector(), pv = plain.cpu().to_vector();
    double split_err = 0, plain_err = 0;
    for (size_t i = 0; i < xv.size(); ++i) {
      split_err = std::max(split_err, std::abs(sv[i] - xv[i]) / std::abs(xv[i]));
      plain_err = std::max(plain_err, std::abs(pv[i] - xv[i]) / std::abs(xv[i]));
    }
    CHECK(split_err <= 0x1p-21);
    CHECK(plain_err > 0x1p-14);
    std::vector<double> with_inf = xv;  // fp32 gives NaN (Inf times 0) and one -Inf in row 5; the split NaN
    with_inf[5 * 67 + 7] = -INFINITY;
    const tg::Tensor c = tg::full({130, 67}, 0.0, cuda32);  // poison: finite in row 5, wrong elsewhere
    tg::gemm_fp16_into(tg::to_fp16_split({tg::from_vector(with_inf, {130, 67}, {tg::DType::Float32}).cuda(), eye}), 0,
                       false, 1, false, c);
    const std::vector<double> cv = c.cpu().to_vector();
    int64_t finite_in_row5 = 0, changed_elsewhere = 0;
    for (size_t i = 0; i < cv.size(); ++i) {
      if (i / 67 == 5) finite_in_row5 += std::isfinite(cv[i]);
      else changed_elsewhere += cv[i] != sv[i];
    }
    CHECK(finite_in_row5 == 0);
    CHECK(changed_elsewhere == 0);
    const tg::Fp16Group whole = tg::to_fp16({x, eye});
    for (int i = 0; i < 2; ++i) CHECK(max_abs_diff(group.matrices[i].values, whole.matrices[i].values, true) == 0);
    CHECK(max_abs_diff(group.scalars.narrow(0, 0, tg::kFp16Scratch), whole.scalars.narrow(0, 0, tg::kFp16Scratch), true) == 0);
  }
}

// A split group's products have fp32's accuracy: on a weight gradient's
// shape (k = tokens, 6 to 19 hi hi slices, both operands k-strided) and with
// every transpose, the error against fp64 within 4x of cuBLAS's fp32 GEMM
// (measured 2.5x and 3.8x at k = 2952, 2.2x and 2.4x at k = 9608, on an
// H200; the truncating tensor-core
// accumulation grows with the slice: slices of 1024 with the cross terms
// sliced too gave 4.4-5x at k = 5000; a wrong slice, unscaled or missing
// low parts are over 100x off), and far below one fp16 product's (over
// 400x).
TEST_CASE("cuda/gemm_fp16: a split group gives fp32's accuracy over a long k, every transpose" *
          doctest::skip(kNoGpu)) {
  tg::manual_seed(48);
  // Slices of 512 batched 8 at a time, the last slice of each k short or not:
  // 6 (5 + a short one), 19 (8, 8, 2 + a short one), 8 (all full, one batch),
  // 9 (8, then 1 full alone), 9 (8, then a short one alone). The beta = 1
  // loop (outputs over kFp16BatchedSliceElements) is too large for a float64
  // reference here: cuda/gemm_fp16x3_warpgroup holds it to the warpgroup
  // kernel's result on compute capability 9.0; elsewhere the fused/
  // "highest" tests at 773/32 and 293/32 run it (dx).
  const int64_t slice = tg::kFp16SplitSlice;
  for (const int64_t k : {4 * slice + 904, 17 * slice + 904, 8 * slice, 9 * slice, 8 * slice + 392})
  for (const double magnitude : {1.0, 1e-9}) {
    CAPTURE(k);
    CAPTURE(magnitude);
    const tg::Tensor a = tg::mul(tg::randn({k, 96}), magnitude), b = tg::randn({k, 80});
    const tg::Tensor exact = tg::matmul(a.to(tg::DType::Float64).transpose(0, 1), b.to(tg::DType::Float64));
    const tg::Tensor ag = a.cuda(), bg = b.cuda(), at = ag.transpose(0, 1).contiguous(), bt = bg.transpose(0, 1).contiguous();
    const auto error_of = [&](const tg::Tensor& c) { return max_abs_diff(c.cpu().to(tg::DType::Float64), exact) / magnitude; };
    const tg::TensorOptions cuda32{tg::DType::Float32, tg::Device::CUDA};
    const tg::Tensor fp32 = tg::empty({96, 80}, cuda32), fp16 = tg::full({96, 80}, std::nan(""), cuda32);
    tg::gemm_into("test", ag.transpose(0, 1), bg, fp32, 0.0, tg::MatmulPrecision::Highest);
    tg::gemm_fp16_into(tg::to_fp16({ag, bg}), 0, true, 1, false, fp16);
    const tg::Fp16Group group = tg::to_fp16_split({ag, bg, at, bt});
    for (const bool ta : {false, true})
      for (const bool tb : {false, true}) {
        CAPTURE(ta);
        CAPTURE(tb);
        const tg::Tensor c = tg::full({96, 80}, std::nan(""), cuda32);
        tg::gemm_fp16_into(group, ta ? 0 : 2, ta, tb ? 3 : 1, tb, c);
        MESSAGE("split / fp32 error: " << error_of(c) / error_of(fp32) << ", fp16 / split: " << error_of(fp16) / error_of(c));
        CHECK(error_of(c) <= 4 * error_of(fp32));
        CHECK(error_of(c) * 100 < error_of(fp16));
      }
  }
}

// The warpgroup split GEMM (ops/matmul_warpgroup.cu; gemm_fp16 runs it on
// compute capability 9.0 for a split group's products, k split into the
// stretches of split_gemm_stretches): every transpose, partial last row
// tiles, k of one chunk, of many, not a multiple of 64 (the TMA's zeros
// past it), split into 13 stretches (on the H200's 132 SMs), with A
// untransposed into 2 and into 5 (dx at 373 tokens) and into 8 (B
// transposed, the last stretch's last chunk short), or whole, fewer rows
// than one tile and an odd number of column tiles; two magnitudes. On 132
// SMs each case's stretches are checked, so that none of these stops
// being covered when the split's rule changes. The 8200 x 1024 case has more than
// kFp16BatchedSliceElements outputs: cuBLAS's side runs its beta = 1 slice
// loop. Its error against fp64 (on
// the rows of the first, a middle and the last tile) within 2x of cuBLAS's
// fp32 GEMM's, and 100x below one fp16 product's; every element (the output
// poisoned with NaN) within 2^-16 of the largest of cuBLAS's split products
// (enable_warpgroup_gemm(false)), which it must not equal bit for bit (else
// the kernel did not run): a cross term lost or mis-scaled is 2^-11 off.
TEST_CASE("cuda/gemm_fp16x3_warpgroup: the split GEMM kernel near fp32, every transpose, every element written" *
          doctest::skip(kNoGpu || !tgtest::wgmma_supported())) {
  tg::manual_seed(52);
  struct Case {
    bool ta, tb;
    int64_t rows, cols, depth, stretches;  // on 132 SMs
  };
  const Case cases[] = {{false, false, 40 * 128 + 77, 1024, 64, 1},  {false, false, 40 * 128 + 77, 1024, 1024, 1},
                        {false, false, 40 * 128 + 77, 1024, 3072, 2}, {false, true, 40 * 128 + 77, 1024, 1024, 1},
                        {true, false, 3 * 128 + 8, 256, 4133, 13},   {true, true, 3 * 128 + 8, 256, 4136, 13},
                        {true, false, 1024, 1024, 2000, 2},          {false, false, 8200, 1024, 1024, 1},
                        {false, false, 100, 384, 64, 1},             {false, false, 373, 1024, 3072, 5},
                        {false, true, 200, 1024, 1000, 8}};
  static_assert(8200 * 1024 > tg::kFp16BatchedSliceElements);
  for (const Case& t : cases)
  for (const double magnitude : {1.0, 1e-9}) {
    CAPTURE(t.ta);
    CAPTURE(t.tb);
    CAPTURE(t.rows);
    CAPTURE(t.depth);
    CAPTURE(magnitude);
    if (tgtest::sm_count() == 132)
      CHECK(tg::split_gemm_stretches(t.rows, t.cols, t.depth, 132) == t.stretches);
    // Stored as gemm_fp16 reads them: A [rows, depth] or [depth, rows], B [depth, cols] or [cols, depth].
    const tg::Tensor a = tg::mul(t.ta ? tg::randn({t.depth, t.rows}) : tg::randn({t.rows, t.depth}), magnitude);
    const tg::Tensor b = t.tb ? tg::randn({t.cols, t.depth}) : tg::randn({t.depth, t.cols});
    const auto op = [](const tg::Tensor& x, bool transposed) { return transposed ? x.transpose(0, 1) : x; };
    const tg::TensorOptions cuda32{tg::DType::Float32, tg::Device::CUDA};
    const tg::Tensor ag = a.cuda(), bg = b.cuda();
    const tg::Fp16Group split = tg::to_fp16_split({ag, bg});
    const tg::Tensor c = tg::full({t.rows, t.cols}, std::nan(""), cuda32);
    const tg::Tensor cublas = tg::full({t.rows, t.cols}, std::nan(""), cuda32);
    tg::gemm_fp16_into(split, 0, t.ta, 1, t.tb, c);
    {
      const CublasSplitProducts off;
      tg::gemm_fp16_into(split, 0, t.ta, 1, t.tb, cublas);
    }
    const tg::Tensor fp32 = tg::empty({t.rows, t.cols}, cuda32), fp16 = tg::full({t.rows, t.cols}, std::nan(""), cuda32);
    tg::gemm_into("test", op(ag, t.ta), op(bg, t.tb), fp32, 0.0, tg::MatmulPrecision::Highest);
    tg::gemm_fp16_into(tg::to_fp16({ag, bg}), 0, t.ta, 1, t.tb, fp16);
    const int64_t last = (t.rows - 1) / 128 * 128;
    const int64_t middle = last / 256 * 128;
    const std::vector<std::pair<int64_t, int64_t>> checked = {
        {0, std::min<int64_t>(128, t.rows)}, {middle, std::min<int64_t>(128, t.rows - middle)}, {last, t.rows - last}};
    const tg::Tensor a64 = op(a, t.ta).to(tg::DType::Float64), b64 = op(b, t.tb).to(tg::DType::Float64);
    double err = 0, fp32_err = 0, cublas_err = 0, fp16_err = 0;
    for (const auto& [first, count] : checked) {
      const tg::Tensor exact = tg::matmul(a64.narrow(0, first, count), b64);
      const auto error_of = [&](const tg::Tensor& x) {
        return max_abs_diff(x.narrow(0, first, count).cpu().to(tg::DType::Float64), exact) / magnitude;
      };
      err = std::max(err, error_of(c)), fp32_err = std::max(fp32_err, error_of(fp32));
      cublas_err = std::max(cublas_err, error_of(cublas)), fp16_err = std::max(fp16_err, error_of(fp16));
    }
    MESSAGE("kernel / fp32 error: " << err / fp32_err << ", cuBLAS split / fp32: " << cublas_err / fp32_err);
    CHECK(err <= 2 * fp32_err);
    CHECK(err * 100 < fp16_err);
    const double largest = max_abs_diff(cublas, tg::zeros_like(cublas)), apart = max_abs_diff(c, cublas);
    CHECK(apart <= 0x1p-16 * largest);  // NaN (an element not written) fails it too
    CHECK(apart > 0);
  }
}

// gemm_fp16_into with a workspace allocated before a cuda::Fork, run in its
// side work (which allocates nothing), gives what it gives allocating its
// own, bit for bit: a split product of few tiles over a long k, on the
// warpgroup kernel (k in stretches, the partials in the workspace; where it
// runs) and on cuBLAS's k slices (batched into the workspace). Without a
// workspace the side work's allocation is the error, and one too small is
// an error naming both sizes.
TEST_CASE("cuda/gemm_fp16: a workspace allocated before a fork, used in its side work" * doctest::skip(kNoGpu)) {
  tg::manual_seed(53);
  const tg::TensorOptions cuda32{tg::DType::Float32, tg::Device::CUDA};
  const tg::Tensor a = tg::randn({4133, 392}).cuda(), b = tg::randn({4133, 256}).cuda();
  const tg::Fp16Group split = tg::to_fp16_split({a, b});
  for (const bool warpgroup : {true, false}) {
    CAPTURE(warpgroup);
    std::optional<CublasSplitProducts> off;
    if (!warpgroup) off.emplace();
    const tg::Tensor alone = tg::full({392, 256}, std::nan(""), cuda32), side = tg::full({392, 256}, std::nan(""), cuda32);
    const int64_t floats = tg::gemm_fp16_workspace(split, 0, true, 1, false, alone);
    // The kernel where split_gemm_splits runs it (the product fits it): its
    // stretches after the first; else cuBLAS's 9 slices of 512, 8 at a time.
    const bool kernel = warpgroup && tgtest::on_sm90();
    const int64_t expected =
        kernel ? (tg::split_gemm_stretches(392, 256, 4133, tgtest::sm_count()) - 1) * 392 * 256 : 8 * 392 * 256;
    REQUIRE(expected > 0);
    CHECK(floats == expected);
    tg::gemm_fp16_into(split, 0, true, 1, false, alone);
    const tg::Tensor workspace = tg::empty({floats}, cuda32);
    tg::cuda::Fork beside(true);
    CHECK(contains(error_of([&] { beside.run([&] { tg::gemm_fp16_into(split, 0, true, 1, false, side); }); }),
                   "inside a cuda::Fork's side work, which must not allocate"));
    beside.run([&] { tg::gemm_fp16_into(split, 0, true, 1, false, side, workspace); });
    beside.join();
    CHECK(max_abs_diff(side, alone) == 0);  // NaN (an element not written) fails it too
    CHECK(contains(error_of([&] {
                     tg::gemm_fp16_into(split, 0, true, 1, false, side, workspace.narrow(0, 0, floats - 1));
                   }),
                   "gemm_fp16: a workspace of " + std::to_string(floats - 1) + " floats for a product that needs " +
                       std::to_string(floats)));
    CHECK(contains(error_of([&] { tg::gemm_fp16_into(split, 0, true, 1, false, side, workspace.cpu()); }),
                   "gemm_fp16: the workspace must be contiguous float32 on c's device (cuda), got [" +
                       std::to_string(floats) + "] float32 on cpu"));
  }
}

// to_fp16 takes its scale from a sample of 1024 elements and converts once
// more when the true max leaves the window the sample's scale allows: a huge
// element the sample misses (the first conversion overflows it to Inf), or
// tiny elements it never sees (fp16 subnormals at the first scale, ~3e-8 off
// where TF32 is ~5e-10 off). Either way the product keeps TF32's accuracy,
// and a split group's stays 100x better than that.
TEST_CASE("cuda/gemm_fp16: a max the sample misses is converted again" * doctest::skip(kNoGpu)) {
  const int64_t rows = 2048, cols = 256;
  const std::vector<bool> sampled = sampled_elements(rows * cols);
  std::vector<double> huge = with_unsampled_max(rows, cols);  // not const: the loop below takes &huge and &tiny as one type
  std::vector<double> tiny = tg::mul(tg::randn({rows, cols}), 1e-6).to_vector();
  for (size_t i = 0; i < tiny.size(); ++i)
    if (sampled[i]) tiny[i] = 0.0;
  for (const auto* values : {&huge, &tiny}) {
    CAPTURE(values == &huge);
    const tg::Tensor a = tg::from_vector(*values, {rows, cols}, {tg::DType::Float32}), b = tg::randn({rows, 64});
    const tg::Tensor exact = tg::matmul(a.to(tg::DType::Float64).transpose(0, 1), b.to(tg::DType::Float64));
    const tg::TensorOptions cuda32{tg::DType::Float32, tg::Device::CUDA};
    const tg::Tensor tf32 = tg::empty({cols, 64}, cuda32), fp16 = tg::full({cols, 64}, std::nan(""), cuda32);
    tg::gemm_into("test", a.cuda().transpose(0, 1), b.cuda(), tf32, 0.0, tg::MatmulPrecision::High);
    tg::gemm_fp16_into(tg::to_fp16({a.cuda(), b.cuda()}), 0, true, 1, false, fp16);
    const double tf32_error = max_abs_diff(tf32.cpu().to(tg::DType::Float64), exact);
    CHECK(max_abs_diff(fp16.cpu().to(tg::DType::Float64), exact) < 2 * tf32_error);
    // A split group converts its low parts again too (left at the first
    // scale they would be off by far more than TF32; right, 22 bits: ~2^-11 of TF32's error).
    const tg::Tensor split = tg::full({cols, 64}, std::nan(""), cuda32);
    tg::gemm_fp16_into(tg::to_fp16_split({a.cuda(), b.cuda()}), 0, true, 1, false, split);
    CHECK(max_abs_diff(split.cpu().to(tg::DType::Float64), exact) * 100 < tf32_error);
  }
}

// to_fp16's scalars: each matrix's storage scale s (alpha(i, i) = 1 / s^2)
// puts its max in [2^8, 2^14), its bound scale b in [2^13, 2^14) (the
// attention backward bounds dS with it), alpha(i, j) = 1 / (s_i s_j), beta 0.
// Magnitudes far apart, one whose sample sees everything (7 elements), an
// all-zero one (scale 1).
TEST_CASE("cuda/to_fp16: storage scales, bound scales and alphas" * doctest::skip(kNoGpu)) {
  const std::vector<tg::Tensor> xs = {tg::mul(tg::randn({300, 70}), 1e-12), tg::mul(tg::randn({1, 7}), 3e5),
                                      tg::randn({64, 64}), tg::zeros({5, 3})};
  std::vector<tg::Tensor> on_gpu;
  for (const tg::Tensor& x : xs) on_gpu.push_back(x.cuda());
  const std::vector<double> sc = tg::to_fp16(on_gpu).scalars.cpu().to_vector();
  const int K = tg::kMaxFp16Group;
  CHECK(sc[tg::kFp16Beta] == 0.0);
  for (int i = 0; i < 4; ++i) {
    CAPTURE(i);
    const double amax = max_abs_diff(xs[size_t(i)], tg::zeros_like(xs[size_t(i)])), s = 1 / std::sqrt(sc[size_t(i * K + i)]), b = sc[size_t(tg::kFp16BoundScales + i)];
    CHECK(std::log2(s) == std::round(std::log2(s)));
    CHECK(std::log2(b) == std::round(std::log2(b)));
    if (amax == 0) {
      CHECK(s == 1.0);
      continue;
    }
    CHECK(amax * s >= 0x1p8);
    CHECK(amax * s < 0x1p14);
    CHECK(amax * b >= 0x1p13);
    CHECK(amax * b < 0x1p14);
    for (int j = 0; j < 4; ++j) CHECK(sc[size_t(i * K + j)] * sc[size_t(i * K + j)] == sc[size_t(i * K + i)] * sc[size_t(j * K + j)]);
  }
}

// to_fp16 in two steps (fp16_group, then convert_to_fp16, which allocates
// nothing) gives to_fp16's values and scalars bit for bit (the scalars of
// the group's two unused slots are never written: NaN, the allocations'
// poison, on both sides).
TEST_CASE("cuda/to_fp16 in two steps equals to_fp16" * doctest::skip(kNoGpu)) {
  const std::vector<tg::Tensor> xs = {tg::mul(tg::randn({300, 70}), 1e-3).cuda(), tg::randn({33, 5}).cuda()};
  const tg::Fp16Group whole = tg::to_fp16(xs), steps = tg::fp16_group(xs);
  tg::convert_to_fp16(xs, steps);
  CHECK(max_abs_diff(steps.scalars, whole.scalars, true) == 0);
  for (size_t i = 0; i < xs.size(); ++i) CHECK(max_abs_diff(steps.matrices[i].values, whole.matrices[i].values, true) == 0);
}

// A group converted in parts, in slot order (convert_to_fp16 from a first
// slot), gives to_fp16's (to_fp16_split's) values and scalars bit for bit:
// the first part's own scalars (its pair's alphas, bounds, beta and one)
// are whole after it, and the last part writes those of its pairs with the
// first part's matrices, reading what that part kept; each part has a
// matrix whose max the sample misses (converted again).
TEST_CASE("cuda/to_fp16 in parts equals to_fp16" * doctest::skip(kNoGpu)) {
  const int64_t rows = 512, cols = 64;
  const tg::Tensor unseen_max =
      tg::from_vector(with_unsampled_max(rows, cols), {rows, cols}, {tg::DType::Float32}).cuda();
  const std::vector<tg::Tensor> xs = {tg::mul(tg::randn({300, 70}), 1e-3).cuda(), tg::mul(unseen_max, 1e3),
                                      unseen_max};
  std::vector<int> first_part = {tg::kFp16Beta, tg::kFp16One, tg::kFp16BoundScales, tg::kFp16BoundScales + 1};
  for (const int pair : {0, 1, tg::kMaxFp16Group, tg::kMaxFp16Group + 1}) {  // (0, 0), (0, 1), (1, 0), (1, 1)
    first_part.push_back(pair);
    first_part.push_back(tg::kFp16LowAlphas + pair);
  }
  for (const bool split : {false, true}) {
    CAPTURE(split);
    const tg::Fp16Group whole = split ? tg::to_fp16_split(xs) : tg::to_fp16(xs), parts = tg::fp16_group(xs, split);
    tg::convert_to_fp16({xs[0], xs[1]}, parts);
    const std::vector<double> expected = whole.scalars.to_vector(), after_first = parts.scalars.to_vector();
    for (const int k : first_part) {
      CAPTURE(k);
      CHECK(after_first[size_t(k)] == expected[size_t(k)]);
    }
    tg::convert_to_fp16({xs[2]}, parts, 2);
    CHECK(max_abs_diff(parts.scalars, whole.scalars, true) == 0);
    for (size_t i = 0; i < xs.size(); ++i) {
      CHECK(max_abs_diff(parts.matrices[i].values, whole.matrices[i].values, true) == 0);
      if (split) CHECK(max_abs_diff(parts.lows[i].values, whole.lows[i].values, true) == 0);
    }
  }
}

// A column bias added in the conversion gives to_fp16 of x + b bit for bit:
// quads read as vectors (cols % 4 == 0) on a matrix larger than one pass of
// the grid (the column advanced per step, wrapping), elements one by one
// (cols % 4 != 0), a bias that sets the scale, a matrix without one, and a
// max the sample misses (the rescale pass adds the bias too).
TEST_CASE("cuda/to_fp16 with column biases equals to_fp16 of x + b" * doctest::skip(kNoGpu)) {
  const int64_t rows = 512, cols = 64;
  const std::vector<double> unseen_max = with_unsampled_max(rows, cols);
  const std::vector<tg::Tensor> xs = {tg::randn({1500, 1000}).cuda(), tg::mul(tg::randn({33, 5}), 1e-3).cuda(),
                                      tg::randn({64, 64}).cuda(),
                                      tg::from_vector(unseen_max, {rows, cols}, {tg::DType::Float32}).cuda()};
  const std::vector<tg::Tensor> biases = {tg::randn({1000}).cuda(), tg::mul(tg::randn({5}), 1e3).cuda(), tg::Tensor(),
                                          tg::mul(tg::randn({cols}), 1e-3).cuda()};
  const tg::Fp16Group fused = tg::to_fp16(xs, biases);
  const tg::Fp16Group added = tg::to_fp16(
      {tg::add(xs[0], biases[0]), tg::add(xs[1], biases[1]), xs[2], tg::add(xs[3], biases[3])});
  CHECK(max_abs_diff(fused.scalars, added.scalars, true) == 0);
  for (size_t i = 0; i < xs.size(); ++i) {
    CAPTURE(i);
    CHECK(max_abs_diff(fused.matrices[i].values, added.matrices[i].values, true) == 0);
  }
  CHECK(max_abs_diff(fused.scalars, tg::to_fp16(xs).scalars, true) > 0);  // the biases changed the scales
  CHECK_THROWS_WITH(tg::to_fp16(xs, {biases[0]}), doctest::Contains("to_fp16: 1 column biases for 4 matrices"));
  CHECK_THROWS_WITH(tg::to_fp16({xs[1]}, {biases[0]}),
                    doctest::Contains("to_fp16: the column bias of matrix 0 [33,5] must be a contiguous float32 [5]"));
}

// to_fp16_with_head_dots: the conversion bit for bit to_fp16's (to_fp16_split's
// with split), and out[b, h, i] the dot of x and other over head h's 64
// columns of row b S + i, against float64 sums (out poisoned with NaN
// first). Shapes: one pass of the grid, and one of several passes whose
// column step wraps rows (3000 x 1024: 768 K quads for 270 K threads).
TEST_CASE("cuda/to_fp16_with_head_dots: Delta and the conversion in one pass" * doctest::skip(kNoGpu)) {
  const tg::TensorOptions cuda32{tg::DType::Float32, tg::Device::CUDA};
  for (const auto [B, S, H] : {std::tuple{3, 37, 4}, std::tuple{2, 1500, 16}, std::tuple{1, 1, 1}})
    for (const bool split : {false, true}) {
      CAPTURE(B);
      CAPTURE(S);
      CAPTURE(split);
      const int64_t C = 64 * H;
      const tg::Tensor x = tg::randn({B * S, C}), other = tg::randn({B * S, C});
      const tg::Tensor out = tg::full({B, H, S}, std::numeric_limits<double>::quiet_NaN(), cuda32);
      const tg::Tensor xc = x.cuda();
      const tg::Fp16Group dotted = tg::to_fp16_with_head_dots(xc, {other.cuda(), out, S}, split);
      const tg::Fp16Group plain = split ? tg::to_fp16_split({xc}) : tg::to_fp16({xc});
      CHECK(max_abs_diff(dotted.scalars, plain.scalars, true) == 0);
      CHECK(max_abs_diff(dotted.matrices[0].values, plain.matrices[0].values, true) == 0);
      if (split) CHECK(max_abs_diff(dotted.lows[0].values, plain.lows[0].values, true) == 0);
      const std::vector<double> xv = x.to_vector(), ov = other.to_vector(), got = out.cpu().to_vector();
      double worst = 0;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < S; ++i) {
            double dot = 0, magnitude = 0;
            for (int64_t d = 0; d < 64; ++d) {
              const size_t at = size_t((b * S + i) * C + 64 * h + d);
              dot += xv[at] * ov[at];
              magnitude += std::abs(xv[at] * ov[at]);
            }
            const double g = got[size_t((b * H + h) * S + i)];
            worst = std::isnan(g) ? INFINITY : std::max(worst, std::abs(g - dot) / magnitude);
          }
      CHECK(worst < 64 * 0x1p-24);  // fp32 sums of 64 products
    }
}

// cuda::Fork: the side work starts after everything queued before the fork
// (its first copy reads `a`, which ends a long queue of fills on the stream,
// so that a missing wait reads a -1 or the previous round), and the stream's
// work after the join follows all of it (the side work ends with a long
// queue of fills of `d`, so that a missing join reads a -2); allocating
// inside it is an error, and allocation works again after.
TEST_CASE("cuda/fork: side work between the fork point and the join; it cannot allocate" * doctest::skip(kNoGpu)) {
  const tg::TensorOptions cuda32{tg::DType::Float32, tg::Device::CUDA};
  const int64_t n = int64_t(1) << 24;  // 64 MiB per fill, ~16 us each
  const tg::Tensor a = tg::empty({n}, cuda32), b = tg::empty({n}, cuda32), c = tg::empty({n}, cuda32),
                   d = tg::empty({n}, cuda32);
  for (int round = 1; round <= 3; ++round) {
    CAPTURE(round);
    for (int k = 0; k < 20; ++k) tg::fill_into(a, -1.0);
    tg::fill_into(a, round);
    tg::cuda::Fork beside(true);
    beside.run([&] {
      tg::copy_into(b, a);
      for (int k = 0; k < 20; ++k) tg::fill_into(d, -2.0);
      tg::fill_into(d, round);
    });
    beside.join();
    tg::copy_into(c, d);
    CHECK(max_abs_diff(b, tg::full({n}, round)) == 0);
    CHECK(max_abs_diff(c, tg::full({n}, round)) == 0);
  }
  tg::cuda::Fork beside(true);
  CHECK(contains(error_of([&] { beside.run([&] { tg::empty({4}, cuda32); }); }),
                 "cuda allocator: 16 bytes requested inside a cuda::Fork's side work, which must not allocate"));
  beside.join();
  CHECK(tg::empty({4}, cuda32).numel() == 4);
}

// The next two read the CUDA context and stream, which a CPU-only build lacks.
#ifdef TG_CUDA
// A Fork's side work may call cuBLAS: it gets the side workspace (outside
// side work, the context's), so that GEMMs there and on the main stream at
// the same time (long reductions, which cuBLAS splits over its workspace;
// four queued on each stream, either stream's first) give what they give
// alone. A fork asking while another holds the side workspace is an error,
// and so is one made before the holder's join (its side stream does not
// follow the holder's work); a fork made after the join, or after a holder
// that ended unjoined (released by its destructor), takes it; a fork made
// inside side work is refused it.
TEST_CASE("cuda/fork: cuBLAS in side work on its own workspace, one fork after another" * doctest::skip(kNoGpu)) {
  const tg::TensorOptions cuda32{tg::DType::Float32, tg::Device::CUDA};
  const tg::Tensor a = tg::randn({48, 1 << 16}).cuda(), b = tg::randn({1 << 16, 40}).cuda();
  const tg::Tensor c = tg::randn({40, 1 << 16}).cuda(), d = tg::randn({1 << 16, 48}).cuda();
  const auto product = [](const tg::Tensor& x, const tg::Tensor& y, const tg::Tensor& into) {
    tg::gemm_into("side workspace test", x, y, into, 0.0, tg::MatmulPrecision::High);
  };
  const auto products = [&](const tg::Tensor& x, const tg::Tensor& y, const tg::Tensor& into) {
    for (int k = 0; k < 4; ++k) product(x, y, into);
  };
  const tg::Tensor ab_alone = tg::full({48, 40}, std::nan(""), cuda32),
                   cd_alone = tg::full({40, 48}, std::nan(""), cuda32);
  product(a, b, ab_alone);
  product(c, d, cd_alone);
  CHECK(tg::cuda::cublas_workspace() == tg::cuda::context().cublas_workspace);
  for (int round = 1; round <= 6; ++round) {
    CAPTURE(round);
    const tg::Tensor ab = tg::full({48, 40}, std::nan(""), cuda32), cd = tg::full({40, 48}, std::nan(""), cuda32);
    tg::cuda::Fork beside(true);
    if (round % 2 == 0) products(c, d, cd);
    beside.run([&] {
      CHECK(tg::cuda::cublas_workspace() == tg::cuda::context().side_cublas_workspace);
      products(a, b, ab);
    });
    if (round % 2 == 1) products(c, d, cd);
    beside.join();
    CHECK(max_abs_diff(ab, ab_alone) == 0);
    CHECK(max_abs_diff(cd, cd_alone) == 0);
  }
  const tg::Tensor ab = tg::full({48, 40}, std::nan(""), cuda32);
  tg::cuda::Fork first(true), second(true);
  first.run([&] { product(a, b, ab); });
  CHECK(contains(error_of([&] { second.run([&] { product(a, b, ab); }); }),
                 "cuda fork: cuBLAS called in side work while the side workspace is held by another fork"));
  first.join();
  CHECK(contains(error_of([&] { second.run([&] { product(a, b, ab); }); }),
                 "cuda fork: cuBLAS called in side work while the side workspace is free only for forks made after "
                 "its last holder's join"));
  second.join();
  {
    tg::cuda::Fork unjoined(true);
    unjoined.run([&] { product(a, b, ab); });
  }
  tg::cuda::Fork after(true);
  after.run([&] {
    product(a, b, ab);
    tg::cuda::Fork nested(true);
    CHECK(contains(error_of([&] { nested.run([&] { product(a, b, ab); }); }),
                   "cuda fork: cuBLAS called in the side work of a fork made inside another fork's side work"));
  });
  after.join();
  CHECK(max_abs_diff(ab, ab_alone) == 0);
}

// Stream priorities (core/cuda_context.h): a Fork's side work runs at the
// device's least priority, GraphReplay's private stream one step above it
// (where the device has two levels), and a graph instantiated with node
// priorities still launches (the fourth call writes what the caller's
// stream zeroed, through the graph). With graph replay off (TG_CUDA_GRAPHS=0,
// the sanitizer runs' TG_CUDA_NO_CACHING=1) every call runs on the caller's
// stream.
TEST_CASE("cuda/fork and graph replay: the side work below the critical path's priority" * doctest::skip(kNoGpu)) {
  int least = 0, greatest = 0;
  REQUIRE(cudaDeviceGetStreamPriorityRange(&least, &greatest) == cudaSuccess);
  const auto priority_here = [] {
    int p = 0;
    REQUIRE(cudaStreamGetPriority(tg::cuda::stream(), &p) == cudaSuccess);
    return p;
  };
  const tg::Tensor t = tg::zeros({256}, {tg::DType::Float32, tg::Device::CUDA});
  int side = greatest - 1;
  tg::cuda::Fork beside(true);
  beside.run([&] {
    side = priority_here();
    tg::fill_into(t, 2.0);
  });
  beside.join();
  CHECK(side == least);
  tg::cuda::GraphReplay replay;
  std::vector<int> seen;  // the priority of each call's stream, outside a capture
  for (int call = 1; call <= 4; ++call) {
    CAPTURE(call);
    if (call == 4) tg::fill_into(t, 0.0);
    replay.run("priorities", nullptr, [&] {
      cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
      REQUIRE(cudaStreamIsCapturing(tg::cuda::stream(), &status) == cudaSuccess);
      if (status == cudaStreamCaptureStatusNone) seen.push_back(priority_here());
      tg::fill_into(t, 1.0);
    });
  }
  CHECK(max_abs_diff(t, tg::ones({256})) == 0);
  if (!tg::cuda::graph_replay_enabled()) {
    CHECK(seen.size() == 4);
    return;
  }
  REQUIRE(seen.size() == 2);  // the first call on the caller's stream, the second (warm-up) on the private one
  CHECK(seen[1] == std::max(greatest, least - 1));
  CHECK(replay.launches() == 2);  // the third call captured and launched, the fourth launched
}
#endif

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

TEST_CASE("cuda/rand and randn: the device draws the CPU's values" * doctest::skip(kNoGpu)) {
  // Sizes with every tail (n % 4), and one whose blocks outnumber the grid's
  // threads (the grid-stride loop wraps); each output starts as NaN (every
  // device allocation is poisoned), so an unwritten element fails.
  for (const tg::DType dtype : {tg::DType::Float32, tg::DType::Float64})
    for (const int64_t n : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{4097}, int64_t{9 << 20} + 3}) {
      CAPTURE(static_cast<int>(dtype));
      CAPTURE(n);
      tg::manual_seed(77);
      const tg::Tensor u_cpu = tg::rand({n}, {dtype}), z_cpu = tg::randn({n}, {dtype});
      tg::manual_seed(77);
      const tg::Tensor u_gpu = tg::rand({n}, {dtype, tg::Device::CUDA}), z_gpu = tg::randn({n}, {dtype, tg::Device::CUDA});
      CHECK(max_abs_diff(u_gpu, u_cpu) == 0.0);  // exact in float: bit for bit
      // Box-Muller in double: CUDA's log and cos (1 and 2 ulp) against libm's differ in a double's last bits.
      const std::vector<double> got = z_gpu.cpu().to_vector(), want = z_cpu.to_vector();
      const double rel = dtype == tg::DType::Float32 ? std::ldexp(1.0, -23) : 1e-13;
      int64_t outside = 0, differ = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        outside += !(std::abs(got[i] - want[i]) <= rel * std::abs(want[i]));
        differ += got[i] != want[i];
      }
      CHECK(outside == 0);
      // In float32 the two doubles round apart only where a float's rounding boundary falls between them (~1e-8 each).
      if (dtype == tg::DType::Float32) CHECK(differ <= n / 10000);
    }
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
  // Rank 4, odd sizes: every dim's index comes from the indexer's dividers.
  const tg::Tensor x4 = tg::randn({3, 5, 7, 11});
  const std::vector<int64_t> order = {2, 0, 3, 1};
  CHECK(max_abs_diff(x4.cuda().permute(order).contiguous().cpu(), x4.permute(order).contiguous()) == 0.0);
  // Strided fills of the middle of dims 1 and 3, checked element by element:
  // rows of whole quads (start 4, 16-byte aligned: vector stores) and a view
  // that is not 16-byte aligned (start 1, the scalar walk), float32 and float64.
  for (const tg::DType dtype : {tg::DType::Float32, tg::DType::Float64}) {
    for (const int64_t start : {4, 1}) {
      CAPTURE(start);
      const tg::Tensor base = tg::randn({3, 5, 7, 12}).to(dtype);
      tg::Tensor filled = base.cuda();
      filled.narrow(1, 1, 3).narrow(3, start, 8).fill_(-2.0);
      const std::vector<double> got = filled.cpu().to_vector(), before = base.to_vector();
      for (size_t k = 0; k < got.size(); ++k) {
        const int64_t i1 = (k / (7 * 12)) % 5, i3 = k % 12;
        const bool inside = i1 >= 1 && i1 < 4 && i3 >= start && i3 < start + 8;
        REQUIRE(got[k] == (inside ? -2.0 : before[k]));
      }
    }
  }
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

TEST_CASE("cuda/sync debug mode reports a faulting kernel by the op that launched it" * doctest::skip(kNoGpu)) {
  int status = 0;
  const std::string sync = run_self("--fault-probe=sync", status);
  INFO(sync);
  CHECK(status == 0);
  CHECK(contains(sync, "caught at the launch: fault_probe: CUDA call kernel (TG_CUDA_SYNC=1) failed: cudaErrorIllegalAddress"));
  const std::string async = run_self("--fault-probe=async", status);
  INFO(async);
  CHECK(status == 0);  // without the mode, the launch returns and a later call sees the fault
  CHECK(contains(async, "launch returned; caught later: synchronize: CUDA call"));
  CHECK(contains(async, "cudaErrorIllegalAddress"));
#ifdef TG_CUDA
  CHECK(contains(error_of([] { tg::cuda::check(cudaErrorInvalidValue, "my_op", "cudaMemcpy(...)"); }),
                 "my_op: CUDA call cudaMemcpy(...) failed: cudaErrorInvalidValue"));
#endif
}

// core/cuda_launch.cuh on the device. A kernel that lets the next one start
// at once and writes x (ones) with twos only ~20 ms later: a kernel launched
// through tg::cuda::launch that does not wait reads the ones (the overlap is
// real), unless launches do not overlap (the setting off, sync-debug mode, a
// device before compute capability 9.0: it reads the twos). The library's
// kernels launched right after it read the twos: a map, the row and column
// sums (for_each's loop), and a conversion to fp16 (its sample kernel); their
// outputs are allocated before, as an allocation's poison fill (a memset)
// would wait for the writer itself (for_each_kernel without its wait fails
// the column sums). A launch that fails raises its error against its op,
// once: the next op runs.
TEST_CASE("cuda/launch: a kernel overlaps the one before it; the library's kernels wait for it" *
          doctest::skip(kNoGpu)) {
  const int64_t n = 4096;
  const tg::TensorOptions cuda32{tg::DType::Float32, tg::Device::CUDA};
  const tg::Tensor x = tg::empty({64, 64}, cuda32), copy = tg::empty({64, 64}, cuda32), sums = tg::empty({64, 64}, cuda32),
                   rows = tg::empty({64}, cuda32), columns = tg::empty({256}, cuda32);
  const tg::Fp16Group half = tg::fp16_group({x});
  // kernels run once first: a kernel's first launch loads its module, which
  // may wait for the device (lazy loading), so it would not overlap.
  const auto after_late_twos = [&](const auto& kernels) {
    kernels();
    tg::fill_into(x, 1.0);
    tg::cuda::synchronize();
    tgtest::write_late(x.data<float>(), n, 2.f);
    kernels();
  };
  const auto count = [](const tg::Tensor& t, double value) {
    const std::vector<double> v = t.cpu().to_vector();
    return std::count(v.begin(), v.end(), value);
  };
  const auto copy_early = [&] { tgtest::copy_without_waiting(x.data<float>(), copy.data<float>(), n); };
  after_late_twos(copy_early);
  CHECK(count(copy, launches_overlap() ? 1.0 : 2.0) == n);
  {
    const SerialLaunches serial;
    after_late_twos(copy_early);
    CHECK(count(copy, 2.0) == n);
  }
#ifdef TG_CUDA
  after_late_twos([&] { tg::ElementwiseKernels<tg::Device::CUDA>::binary_forward(tg::BinaryOp::Add, x, x, sums); });
  CHECK(count(sums, 4.0) == n);
  after_late_twos([&] { tg::ReduceKernels<tg::Device::CUDA>::sum_rows(x, rows, 64, 64); });
  CHECK(count(rows, 128.0) == 64);
  after_late_twos([&] { tg::ReduceKernels<tg::Device::CUDA>::sum_columns(x, columns, 16, 256, tg::Tensor()); });
  CHECK(count(columns, 32.0) == 256);
#endif
  after_late_twos([&] { tg::convert_to_fp16({x}, half); });
  CHECK(half.scalars.cpu().to_vector()[0] == std::ldexp(1.0, -14));  // alpha(0, 0) = 1 / s^2: the sample saw 2, s = 2^7
  const tg::Tensor bits = half.matrices[0].values.cpu();
  const auto* h = reinterpret_cast<const uint16_t*>(bits.data<float>());
  CHECK(std::all_of(h, h + n, [](uint16_t v) { return v == 0x5C00; }));  // 2 s = 256 in fp16
  const std::string error =
      error_of([&] { tgtest::launch_too_many_threads(x.data<float>(), copy.data<float>(), n); });
  INFO(error);
  CHECK(contains(error, "launch probe (2048 threads): CUDA call cudaLaunchKernelEx failed: cudaErrorInvalidValue"));
  CHECK(count(tg::add(x, x), 4.0) == n);
}

// check_binary_mask's count on the device: the exact number of non-binary
// elements (planted at random places among random 0/1 values, over many
// blocks) added to its own slot of the counts, as the CPU counts them; and
// the same errors as on the CPU, the first offending element named, for one
// mask or several in one call (one device sync), contiguous or not.
TEST_CASE("cuda/check_binary_mask" * doctest::skip(kNoGpu)) {
  tg::manual_seed(31);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto coin_flips = [](int64_t n) {
    std::vector<double> v = tg::rand({n}).to_vector();
    for (double& x : v) x = x < 0.5 ? 0 : 1;
    return v;
  };
  for (const tg::DType dtype : {tg::DType::Float32, tg::DType::Float64}) {
    CAPTURE(dtype);
    const int64_t n = 37 * 1001;
    std::vector<double> values = coin_flips(n);
    const std::vector<double> planted = {0.5, 2, -1, nan, 1e-30, 0.999999};
    std::vector<int64_t> where;
    for (size_t k = 0; k < 40; ++k) where.push_back(static_cast<int64_t>(tg::rand({1}).item() * n));
    for (size_t k = 0; k < where.size(); ++k) values[where[k]] = planted[k % planted.size()];
    const int64_t bad = std::count_if(values.begin(), values.end(), [](double v) { return !(v == 0 || v == 1); });
    const tg::Tensor cpu = tg::from_vector(values, {37, 1001}).to(dtype);
    for (const tg::Device device : {tg::Device::CPU, tg::Device::CUDA}) {
      CAPTURE(device);
      const tg::Tensor counts = tg::zeros({3}, {tg::DType::Float64, device});
      TG_DISPATCH_DEVICE(counts, tg::BinaryMaskKernels, count_non_binary, cpu.to(device), counts, 1);
      CHECK(counts.to_vector() == std::vector<double>{0, double(bad), 0});
    }
    const tg::Tensor good = tg::from_vector(coin_flips(n), {37, 1001}).to(dtype).cuda();
    const tg::Tensor gpu = cpu.cuda();
    const std::string expected = error_of([&] { tg::check_binary_mask("op", "m", cpu); });
    CHECK(contains(expected, "op: m [37,1001] must hold only 0 and 1; element "));
    CHECK(error_of([&] { tg::check_binary_mask("op", "m", gpu); }) == expected);
    CHECK(error_of([&] { tg::check_binary_masks("op", {{"a", good}, {"m", gpu}}); }) == expected);
    CHECK(error_of([&] { tg::check_binary_masks("op", {{"m", gpu}, {"a", good}}); }) == expected);
    CHECK(error_of([&] { tg::check_binary_masks("op", {{"a", good}, {"b", good.transpose(0, 1)}}); }).empty());
    const std::string transposed = error_of([&] { tg::check_binary_mask("op", "t", cpu.transpose(0, 1)); });
    CHECK(contains(transposed, "op: t [1001,37] must hold only 0 and 1"));
    CHECK(error_of([&] { tg::check_binary_mask("op", "t", gpu.transpose(0, 1)); }) == transposed);
  }
  CHECK(contains(error_of([] { tg::check_binary_masks("op", {{"a", tg::ones({2}).cuda()}, {"b", tg::ones({2})}}); }),
                 "op: b is on cpu, a on cuda"));
}

// A CUDA mask found binary is remembered by storage, version and view (ops/binary_mask.h): a write behind
// tapegrad's back is not seen, while tapegrad's writes, another view and borrowed memory are counted again; a bad
// mask is never remembered; two remembered masks on two devices are still refused.
TEST_CASE("cuda/check_binary_mask: a mask found binary is counted again once written" * doctest::skip(kNoGpu)) {
  const auto check = [](const tg::Tensor& t) { return error_of([&] { tg::check_binary_mask("op", "m", t); }); };
  tg::Tensor m = tg::from_vector({0, 1, 1, 0, 1, 1}, {3, 2}).cuda();
  CHECK(check(m).empty());
  const tg::TensorOptions cuda32{tg::DType::Float32, tg::Device::CUDA};
  tg::from_blob(m.raw_data(), {6}, cuda32).narrow(0, 3, 1).fill_(2.0);  // through other storage: m's is unwritten
  CHECK(check(m).empty());  // unseen: the storage's version is the one found binary
  CHECK(check(m.transpose(0, 1)) == "op: m [2,3] must hold only 0 and 1; element 4 is 2");  // other strides
  CHECK(check(m.narrow(0, 0, 1)).empty());                                                   // other shape
  const tg::Tensor rows = tg::from_vector({1, 0, 2, 1}, {2, 2}).cuda();
  CHECK(check(rows.narrow(0, 0, 1)).empty());  // the same offset and strides as rows, a smaller shape
  CHECK(check(rows) == "op: m [2,2] must hold only 0 and 1; element 2 is 2");
  CHECK(check(m.narrow(0, 1, 1)) == "op: m [1,2] must hold only 0 and 1; element 1 is 2");  // other offset
  m.mul_(1.0);  // an in-place op bumps the version
  CHECK(check(m) == "op: m [3,2] must hold only 0 and 1; element 3 is 2");
  m.copy_(tg::zeros({3, 2}).cuda());
  CHECK(check(m).empty());
  m.fill_(0.5);
  CHECK(check(m) == "op: m [3,2] must hold only 0 and 1; element 0 is 0.5");
  tg::Tensor owner = tg::ones({3}).cuda();
  const tg::Tensor view = tg::from_blob(owner.raw_data(), {3}, cuda32);
  CHECK(check(view).empty());
  owner.fill_(2.0);  // the view's storage is not written
  CHECK(check(view) == "op: m [3] must hold only 0 and 1; element 0 is 2");  // borrowed: counted every time
  const tg::Tensor good = tg::ones({2}).cuda(), bad = tg::from_vector({1, -1}, {2}).cuda();
  CHECK(check(good).empty());
  for (int i = 0; i < 2; ++i)  // the second time too: a bad mask is never remembered
    CHECK(error_of([&] { tg::check_binary_masks("op", {{"g", good}, {"b", bad}}); }) ==
          "op: b [2] must hold only 0 and 1; element 1 is -1");
  const tg::Tensor host = tg::ones({2});
  CHECK(check(host).empty());
  CHECK(contains(error_of([&] { tg::check_binary_masks("op", {{"g", good}, {"h", host}}); }),
                 "op: h is on cpu, g on cuda"));
}

// The foreach updates (ops/foreach.h) on the GPU against the CPU's, on 100
// random tensors (some empty, more than one launch's kForeachSlots) with
// step counts of their own: the same update to a few float32 ulps, float64's
// last bits (nvcc fuses its multiply-adds); the sum of squares bit for bit
// (the same order of additions, each square rounded on its own).
TEST_CASE("cuda/foreach_adamw_, foreach_sum_of_squares, foreach_mul_" * doctest::skip(kNoGpu)) {
  for (const tg::DType dtype : {tg::DType::Float32, tg::DType::Float64}) {
    CAPTURE(dtype);
    tg::manual_seed(dtype == tg::DType::Float32 ? 11 : 12);
    std::vector<tg::Tensor> cpu[4], gpu[4];  // p, g, m, v
    std::vector<int64_t> steps;
    for (int i = 0; i < 100; ++i) {
      const int64_t n = i % 13 == 5 ? 0 : 1 + (i * 4099) % 2500;
      for (int k = 0; k < 4; ++k) {
        tg::Tensor x = tg::randn({n}, {dtype});
        if (k == 3) x = tg::mul(x, x);
        cpu[k].push_back(x);
        gpu[k].push_back(x.cuda());
      }
      steps.push_back(1 + i % 4);
    }
    const tg::AdamWHyper h{1e-3, 0.9, 0.999, 1e-8, 0.01};
    tg::foreach_adamw_(cpu[0], cpu[1], cpu[2], cpu[3], steps, h);
    tg::foreach_adamw_(gpu[0], gpu[1], gpu[2], gpu[3], steps, h);
    const double rtol = dtype == tg::DType::Float32 ? 1e-6 : 1e-14;
    for (int k : {0, 2, 3})
      for (size_t i = 0; i < steps.size(); ++i) {
        CAPTURE(k);
        CAPTURE(i);
        REQUIRE(gpu[k][i].is_cuda());
        CHECK(max_abs_diff(gpu[k][i].cpu(), cpu[k][i]) <= rtol * (1 + max_abs(cpu[k][i])));
      }
    // The gradients, equal on both devices (the stepped parameters differ in their last bits).
    const double cpu_sum = tg::foreach_sum_of_squares(cpu[1]).item(), gpu_sum = tg::foreach_sum_of_squares(gpu[1]).item();
    CHECK(cpu_sum > 1000.0);
    CHECK(gpu_sum == cpu_sum);
    tg::foreach_mul_(cpu[1], 0.5);
    tg::foreach_mul_(gpu[1], 0.5);
    for (size_t i = 0; i < steps.size(); ++i) CHECK(max_abs_diff(gpu[1][i].cpu(), cpu[1][i]) == 0.0);
  }
}
