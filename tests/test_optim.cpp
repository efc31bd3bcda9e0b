// Optimizers against steps worked out by hand (and against torch.optim.AdamW
// through a recorded fixture), their state export, the cosine schedule,
// gradient clipping, and the foreach updates behind them.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "helpers.h"
#include "ops/foreach.h"

using namespace tgtest;
namespace optim = tg::optim;

namespace {

tg::Tensor param64(const std::vector<double>& values) {
  return tg::from_vector(values, {static_cast<int64_t>(values.size())}, {tg::DType::Float64}).requires_grad_();
}

// Sets p.grad() to exactly g through a backward pass: d/dp sum(p * g) = g.
void set_grad(tg::Tensor p, const std::vector<double>& g) {
  p.zero_grad();
  tg::sum(tg::mul(p, tg::from_vector(g, p.shape(), {p.dtype(), p.device()}))).backward();
}

void check_values(const tg::Tensor& t, const std::vector<double>& expected, double tolerance) {
  const std::vector<double> v = t.to_vector();
  REQUIRE(v.size() == expected.size());
  for (size_t i = 0; i < v.size(); ++i) {
    INFO("element " << i << ": " << v[i] << " vs " << expected[i]);
    CHECK(std::abs(v[i] - expected[i]) <= tolerance);
  }
}

struct Step {
  std::vector<double> grad, expected;  // the gradient given, the parameter after the step
};

void check_steps(optim::Optimizer& optimizer, const tg::Tensor& p, const std::vector<Step>& steps, double tolerance) {
  for (size_t k = 0; k < steps.size(); ++k) {
    INFO("step " << k + 1);
    set_grad(p, steps[k].grad);
    optimizer.step();
    check_values(p, steps[k].expected, tolerance);
  }
}

tg::Tensor entry(const tg::StateDict& dict, const std::string& name) {
  for (const auto& [key, t] : dict)
    if (key == name) return t;
  FAIL("no entry " << name);
  return {};
}

}  // namespace

TEST_CASE("optim/SGD with momentum and weight decay against steps by hand") {
  tg::Tensor p = param64({1.0, -2.0});
  optim::SGD sgd({p}, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
  // d = g + 0.01 p;  b = d (step 1), else 0.9 b + d;  p -= 0.1 b
  check_steps(sgd, p,
              {// step 1: d = [0.51, 0.23] = b;  p = [1 - 0.051, -2 - 0.023]
               {{0.5, 0.25}, {0.949, -2.023}},
               // step 2: d = [-1 + 0.00949, 2 - 0.02023];  b = [0.459 - 0.99051, 0.207 + 1.97977] = [-0.53151, 2.18677]
               {{-1.0, 2.0}, {1.002151, -2.241677}},
               // step 3: d = [0.11002151, -0.02241677];  b = [-0.36833749, 1.94567623]
               {{0.1, 0.0}, {1.038984749, -2.436244623}}},
              1e-15);
  CHECK(p.is_leaf());
  CHECK(p.requires_grad());
}

TEST_CASE("optim/SGD without momentum is p -= lr g") {
  tg::Tensor p = param64({3.0});
  optim::SGD sgd({p}, {.lr = 0.5});
  set_grad(p, {2.0});
  sgd.step();
  check_values(p, {2.0}, 0.0);
  CHECK(keys_of(sgd.state_dict()) == std::vector<std::string>{"state.0.step"});
}

TEST_CASE("optim/AdamW against steps by hand") {
  tg::Tensor p = param64({0.5, -1.5});
  optim::AdamW adamw({p}, {.lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1});
  check_steps(adamw, p,
              {// Step 1: m/(1-b1) = g and v/(1-b2) = g^2, so p = p (1 - lr wd) - lr g / (|g| + eps).
               {{0.2, -0.4}, {0.5 * 0.999 - 0.01 * 0.2 / (0.2 + 1e-8), -1.5 * 0.999 + 0.01 * 0.4 / (0.4 + 1e-8)}},
               // Steps 2 and 3 by the same formulas, carried out separately in float64: after step 2,
               // m = [0.028, -0.036] and v = [4.996e-05, 1.5984e-04] (g = [0.1, 0]: the zero still moves p).
               {{0.1, 0.0}, {0.4796887047010366, -1.480310917945345}},
               {{-0.3, 0.5}, {0.48002878393690246, -1.4805871725039632}}},
              1e-15);
  const tg::StateDict state = adamw.state_dict();
  check_values(entry(state, "state.0.exp_avg"), {-0.0048, 0.0176}, 1e-15);
  check_values(entry(state, "state.0.exp_avg_sq"), {0.00013991004, 0.00040968016}, 1e-15);
  CHECK(entry(state, "state.0.step").item() == 3);
}

TEST_CASE("optim/a parameter without a gradient is skipped and keeps no state") {
  tg::Tensor a = param64({1.0}), b = param64({1.0});
  optim::AdamW adamw({a, b});
  set_grad(a, {1.0});
  adamw.step();
  CHECK(b.item() == 1.0);
  CHECK(a.item() != 1.0);
  CHECK(keys_of(adamw.state_dict()) ==
        std::vector<std::string>{"state.0.step", "state.0.exp_avg", "state.0.exp_avg_sq"});
  adamw.zero_grad();
  CHECK_FALSE(a.grad().defined());
}

TEST_CASE("optim/state_dict and load_state_dict continue training identically") {
  const std::vector<std::vector<double>> grads = {{0.3, -0.1, 2}, {0.2, 0.5, -1}, {-0.7, 0.1, 0}, {1, 1, 1}};
  tg::Tensor p = param64({1, 2, 3});
  optim::AdamW first({p}, {.lr = 0.1});
  for (int k = 0; k < 2; ++k) {
    set_grad(p, grads[k]);
    first.step();
  }
  tg::Tensor q = param64(p.to_vector());
  optim::AdamW second({q}, {.lr = 0.1});
  second.load_state_dict(first.state_dict());
  for (int k = 2; k < 4; ++k) {
    set_grad(p, grads[k]);
    first.step();
    set_grad(q, grads[k]);
    second.step();
  }
  CHECK(p.to_vector() == q.to_vector());
  // the loaded state is a copy: stepping one leaves the other's state alone
  CHECK_FALSE(entry(first.state_dict(), "state.0.exp_avg").same_storage(entry(second.state_dict(), "state.0.exp_avg")));
}

TEST_CASE("optim/SGD momentum buffers round-trip through state_dict") {
  tg::Tensor p = param64({1, 2});
  optim::SGD sgd({p}, {.lr = 0.1, .momentum = 0.9});
  set_grad(p, {1, -1});
  sgd.step();
  CHECK(keys_of(sgd.state_dict()) == std::vector<std::string>{"state.0.step", "state.0.momentum_buffer"});
  tg::Tensor q = param64(p.to_vector());
  optim::SGD other({q}, {.lr = 0.1, .momentum = 0.9});
  other.load_state_dict(sgd.state_dict());
  set_grad(p, {0.5, 0.5});
  sgd.step();
  set_grad(q, {0.5, 0.5});
  other.step();
  CHECK(p.to_vector() == q.to_vector());
}

TEST_CASE("optim/load_state_dict errors name the key and change nothing") {
  tg::Tensor p = param64({1, 2});
  optim::AdamW adamw({p});
  set_grad(p, {1, 1});
  adamw.step();
  const tg::StateDict good = adamw.state_dict();
  auto with = [&](const std::string& key, const tg::Tensor& t) {
    tg::StateDict d = good;
    for (auto& [k, v] : d)
      if (k == key) v = t;
    return d;
  };
  const tg::StateDict missing(good.begin(), good.end() - 1);
  CHECK(error_of([&] { adamw.load_state_dict(missing); }) ==
        "AdamW::load_state_dict: missing key 'state.0.exp_avg_sq' (parameter 0 has a step count)");
  tg::StateDict extra = good;
  extra.emplace_back("state.1.step", tg::scalar_tensor(1, {tg::DType::Float64}));
  CHECK(error_of([&] { adamw.load_state_dict(extra); }) == "AdamW::load_state_dict: unexpected key 'state.1.step'");
  CHECK(error_of([&] { adamw.load_state_dict(with("state.0.exp_avg", tg::zeros({3}, {tg::DType::Float64}))); }) ==
        "AdamW::load_state_dict: 'state.0.exp_avg' is float64 [3], but parameter 0 is float64 [2]");
  CHECK(error_of([&] { adamw.load_state_dict(with("state.0.exp_avg", tg::zeros({2}))); }) ==
        "AdamW::load_state_dict: 'state.0.exp_avg' is float32 [2], but parameter 0 is float64 [2]");
  CHECK(error_of([&] { adamw.load_state_dict(with("state.0.step", tg::scalar_tensor(1.5))); }) ==
        "AdamW::load_state_dict: 'state.0.step' must be a whole number of steps >= 1, got 1.5");
  CHECK(error_of([&] { adamw.load_state_dict(with("state.0.step", tg::ones({1}))); }) ==
        "AdamW::load_state_dict: 'state.0.step' must be a 0-d tensor, got shape [1]");
  const tg::StateDict after = adamw.state_dict();  // nothing changed
  CHECK(entry(after, "state.0.step").item() == 1);
  CHECK(entry(after, "state.0.exp_avg").same_storage(entry(good, "state.0.exp_avg")));
  adamw.load_state_dict({});  // the state of a fresh optimizer
  CHECK(adamw.state_dict().empty());
}

TEST_CASE("optim/constructor and lr errors") {
  tg::Tensor p = param64({1});
  CHECK(error_of([] { optim::SGD({}, {}); }) == "SGD: got an empty parameter list");
  CHECK(error_of([&] { optim::SGD({p, p}, {}); }) == "SGD: parameter 1 [1] appears more than once");
  CHECK(error_of([&] { optim::SGD({tg::mul(p, 2.0)}, {}); }) == "SGD: parameter 0 [1] is not a leaf tensor");
  CHECK(error_of([&] { optim::SGD({p}, {.lr = -1}); }) == "SGD: lr must be finite and >= 0, got -1");
  CHECK(error_of([&] { optim::SGD({p}, {.momentum = -0.5}); }) ==
        "SGD: momentum -0.5 and weight_decay 0 must be finite and >= 0");
  CHECK(error_of([&] { optim::SGD({p}, {.momentum = INFINITY}); }) ==
        "SGD: momentum inf and weight_decay 0 must be finite and >= 0");
  CHECK(error_of([&] { optim::AdamW({p}, {.eps = INFINITY}); }) ==
        "AdamW: eps inf and weight_decay 0.01 must be finite and >= 0");
  CHECK(error_of([&] { optim::AdamW({p}, {.beta2 = 1.0}); }) == "AdamW: betas must be in [0, 1), got (0.9, 1)");
  optim::AdamW adamw({p});
  adamw.set_lr(0.5);
  CHECK(adamw.lr() == 0.5);
  CHECK(error_of([&] { adamw.set_lr(NAN); }) == "AdamW: lr must be finite and >= 0, got nan");
}

// A step writes every parameter in place, so parameters that cannot take
// such a write are refused up front, not halfway through a step (after
// other parameters and the step counts have moved).
TEST_CASE("optim/constructors refuse expanded parameters and parameters that share memory") {
  const tg::Tensor expanded = tg::randn({1, 4}, {tg::DType::Float64}).expand({3, 4}).detach().requires_grad_();
  CHECK(error_of([&] { optim::AdamW({param64({2}), expanded}); }) ==
        "AdamW: parameter 1 [3,4] with strides [0,1] has elements that share one memory location (an expanded view), "
        "so a step cannot update it in place; clone() it first");
  const tg::Tensor base = tg::randn({10}, {tg::DType::Float64});
  const auto part = [&](int64_t start, int64_t length) {
    return base.narrow(0, start, length).detach().requires_grad_();
  };
  const tg::Tensor p = param64({3});
  CHECK(error_of([&] { optim::SGD({part(0, 6), p, part(4, 6)}, {}); }) ==
        "SGD: parameters 0 and 2 lie in overlapping memory; each must have memory of its own (clone() one)");
  CHECK(error_of([&] { optim::AdamW({part(5, 5), part(0, 6)}); }) ==
        "AdamW: parameters 0 and 1 lie in overlapping memory; each must have memory of its own (clone() one)");
  // Disjoint views of one buffer are separate parameters: both step.
  tg::Tensor a = part(0, 5), b = part(5, 5);
  const tg::Tensor before = tg::clone(base);
  optim::SGD sgd({b, a}, {.lr = 1.0});
  tg::sum(tg::add(a, b)).backward();
  sgd.step();
  CHECK(max_abs_diff(base, tg::sub(before, tg::ones({10}, {tg::DType::Float64}))) == 0);  // every element by lr * 1
}

TEST_CASE("optim/AdamW matches torch.optim.AdamW (tests/fixtures/adamw_torch.json)") {
  std::ifstream in(TG_FIXTURES_DIR "/adamw_torch.json");
  REQUIRE_MESSAGE(in.is_open(), "missing " TG_FIXTURES_DIR "/adamw_torch.json: run "
                                "python3 tests/fixtures/make_adamw_fixture.py where torch is installed");
  const nlohmann::json fixture = nlohmann::json::parse(in);
  REQUIRE(fixture.at("cases").size() >= 2);
  for (const auto& c : fixture.at("cases")) {
    const bool f64 = c.at("dtype") == "float64";
    INFO("dtype " << c.at("dtype"));
    const tg::TensorOptions opts{f64 ? tg::DType::Float64 : tg::DType::Float32};
    // float32: torch and tapegrad round differently (torch lerps m; the order of the float ops differs)
    const double tolerance = f64 ? 1e-14 : 1e-6;
    std::vector<tg::Tensor> params;
    for (size_t i = 0; i < c.at("shapes").size(); ++i)
      params.push_back(tg::from_vector(c.at("initial")[i], c.at("shapes")[i], opts).requires_grad_());
    const auto& lrs = c.at("lr");
    optim::AdamW adamw(params, {.lr = lrs[0], .beta1 = c.at("betas")[0], .beta2 = c.at("betas")[1],
                                .eps = c.at("eps"), .weight_decay = c.at("weight_decay")});
    for (size_t k = 0; k < lrs.size(); ++k) {
      adamw.set_lr(lrs[k]);
      for (size_t i = 0; i < params.size(); ++i) set_grad(params[i], c.at("grads")[k][i]);
      adamw.step();
      for (size_t i = 0; i < params.size(); ++i) check_values(params[i], c.at("after")[k][i], tolerance);
    }
    const tg::StateDict state = adamw.state_dict();
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string prefix = "state." + std::to_string(i) + ".";
      check_values(entry(state, prefix + "exp_avg"), c.at("exp_avg")[i], tolerance);
      check_values(entry(state, prefix + "exp_avg_sq"), c.at("exp_avg_sq")[i], tolerance);
    }
  }
}

TEST_CASE("optim/AdamW on CUDA takes the CPU's steps" * doctest::skip(!tg::cuda::is_available())) {
  tg::Tensor cpu = param64({0.5, -1.5, 0.0});
  tg::Tensor gpu = param64({0.5, -1.5, 0.0});
  gpu = gpu.detach().cuda().requires_grad_();
  optim::AdamW on_cpu({cpu}), on_gpu({gpu});
  for (const auto& g : std::vector<std::vector<double>>{{0.2, -0.4, 0.0}, {0.1, 0.0, 1e-3}}) {
    set_grad(cpu, g);
    set_grad(gpu, g);
    on_cpu.step();
    on_gpu.step();
  }
  CHECK(gpu.is_cuda());
  check_values(gpu, cpu.to_vector(), 1e-15);
}

TEST_CASE("optim/cosine schedule: linear warm-up, then cosine to min_lr") {
  const optim::CosineSchedule schedule(1.0, 4, 12, 0.1);
  CHECK(schedule.lr(0) == 0.25);
  CHECK(schedule.lr(1) == 0.5);
  CHECK(schedule.lr(3) == 1.0);
  CHECK(schedule.lr(4) == 1.0);  // cos(0)
  CHECK(schedule.lr(6) == doctest::Approx(0.1 + 0.9 * (1 + std::sqrt(0.5)) / 2).epsilon(1e-15));
  CHECK(schedule.lr(8) == doctest::Approx(0.55).epsilon(1e-15));  // halfway: cos(pi/2) = 0
  CHECK(schedule.lr(11) == doctest::Approx(0.13425421036992097).epsilon(1e-15));
  CHECK(schedule.lr(12) == 0.1);
  CHECK(schedule.lr(1000) == 0.1);
  CHECK(optim::CosineSchedule(2.0, 0, 10).lr(0) == 2.0);
  CHECK(error_of([&] { schedule.lr(-1); }) == "CosineSchedule: step must be >= 0, got -1");
  CHECK(error_of([] { optim::CosineSchedule(1.0, 5, 4); }) ==
        "CosineSchedule: need 0 <= warmup_steps <= total_steps, got 5 and 4");
  CHECK(error_of([] { optim::CosineSchedule(1.0, 0, 4, 2.0); }) ==
        "CosineSchedule: need 0 <= min_lr <= base_lr < inf, got min_lr 2 and base_lr 1");
  CHECK(error_of([] { optim::CosineSchedule(INFINITY, 0, 4); }) ==
        "CosineSchedule: need 0 <= min_lr <= base_lr < inf, got min_lr 0 and base_lr inf");
}

TEST_CASE("optim/clip_grad_norm_ returns the total norm and scales when it exceeds max_norm") {
  tg::Tensor a = param64({0, 0}), b = param64({0}), c = param64({0});
  set_grad(a, {3, 4});
  set_grad(b, {12});  // total norm sqrt(9 + 16 + 144) = 13; c has no gradient
  CHECK(tg::nn::utils::clip_grad_norm_({a, b, c}, 100.0) == 13.0);
  CHECK(a.grad().to_vector() == std::vector<double>{3, 4});
  CHECK(tg::nn::utils::clip_grad_norm_({a, b, c}, 6.5) == 13.0);
  const double scale = 6.5 / (13.0 + 1e-6);
  check_values(a.grad(), {3 * scale, 4 * scale}, 1e-15);
  check_values(b.grad(), {12 * scale}, 1e-15);
  CHECK_FALSE(c.grad().defined());
  CHECK(tg::nn::utils::clip_grad_norm_({a, b}, 6.5) == doctest::Approx(6.5).epsilon(1e-6));
  CHECK(error_of([&] { tg::nn::utils::clip_grad_norm_({a}, 0.0); }) ==
        "clip_grad_norm_: max_norm must be finite and > 0, got 0");
}

TEST_CASE("optim/clip_grad_norm_ squares float32 gradients in float64: no overflow at 1e20, no underflow at 1e-25") {
  tg::Tensor big = tg::zeros({4}).requires_grad_(), tiny = tg::zeros({4}).requires_grad_();
  set_grad(big, {1e20, 1e20, 1e20, 1e20});  // norm 2e20; in float32 its square, 4e40, is past the 3.4e38 maximum
  CHECK(tg::nn::utils::clip_grad_norm_({big}, 1.0) == doctest::Approx(2e20).epsilon(1e-6));
  for (double v : big.grad().to_vector()) CHECK(v == doctest::Approx(0.5).epsilon(1e-6));
  set_grad(tiny, {1e-25, 1e-25, 1e-25, 1e-25});  // squares of 1e-50, below float32's smallest subnormal
  CHECK(tg::nn::utils::clip_grad_norm_({tiny}, 1.0) == doctest::Approx(2e-25).epsilon(1e-6));
}

// As PyTorch's: a NaN or Inf among the gradients makes the total norm
// non-finite, and the clip coefficient max_norm / (norm + 1e-6) (NaN, or 0
// for Inf) still multiplies every gradient, so the step that follows sees the
// problem in every parameter rather than in one.
TEST_CASE("optim/clip_grad_norm_ with a non-finite gradient: the norm says so and every gradient is scaled by it") {
  tg::Tensor a = param64({0, 0}), b = param64({0});
  set_grad(a, {3, std::nan("")});
  set_grad(b, {12});
  CHECK(std::isnan(tg::nn::utils::clip_grad_norm_({a, b}, 1.0)));
  for (const tg::Tensor* t : {&a, &b})
    for (double v : t->grad().to_vector()) CHECK(std::isnan(v));
  set_grad(a, {3, INFINITY});
  set_grad(b, {12});
  CHECK(std::isinf(tg::nn::utils::clip_grad_norm_({a, b}, 1.0)));
  CHECK(b.grad().to_vector() == std::vector<double>{0});  // 12 * (1 / Inf)
  CHECK(std::isnan(a.grad().to_vector()[1]));             // Inf * 0
}

// ---- the foreach updates behind AdamW and clipping (ops/foreach.h)

namespace {

// 100 tensors of sizes 0 to ~3000 (some empty), more than kForeachSlots, so
// that a call takes several launches.
std::vector<tg::Tensor> random_list(uint64_t seed, tg::DType dtype, double scale = 1.0) {
  tg::manual_seed(seed);
  std::vector<tg::Tensor> xs;
  for (int i = 0; i < 100; ++i) {
    const int64_t n = i % 17 == 3 ? 0 : (i * 7919) % 3001;
    xs.push_back(tg::mul(tg::randn({n}, {dtype}), scale));
  }
  return xs;
}

std::vector<tg::Tensor> clones(const std::vector<tg::Tensor>& xs) {
  std::vector<tg::Tensor> out;
  for (const tg::Tensor& x : xs) out.push_back(x.clone());
  return out;
}

}  // namespace

// Each element against the update written out in float64 here, with a step
// count of its own per tensor (the bias corrections differ per tensor).
TEST_CASE("foreach/adamw equals the AdamW update of every element, over several launches") {
  const optim::AdamWOptions o{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};
  for (const tg::DType dtype : {tg::DType::Float64, tg::DType::Float32}) {
    CAPTURE(dtype);
    const std::vector<tg::Tensor> p = random_list(1, dtype), g = random_list(2, dtype), m = random_list(3, dtype, 0.1);
    std::vector<tg::Tensor> v = random_list(4, dtype, 0.1);
    for (tg::Tensor& x : v) x = tg::mul(x, x);  // second moments are >= 0
    std::vector<int64_t> steps;
    for (size_t i = 0; i < p.size(); ++i) steps.push_back(1 + static_cast<int64_t>(i % 5));
    const std::vector<tg::Tensor> p1 = clones(p), m1 = clones(m), v1 = clones(v);
    tg::foreach_adamw_(p1, g, m1, v1, steps, {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay});
    const double tolerance = dtype == tg::DType::Float64 ? 1e-14 : 1e-5;
    double worst = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      const std::vector<double> pv = p[i].to_vector(), gv = g[i].to_vector(), mv = m[i].to_vector(),
                                vv = v[i].to_vector(), p_out = p1[i].to_vector(), m_out = m1[i].to_vector(),
                                v_out = v1[i].to_vector();
      const double t = static_cast<double>(steps[i]);
      const double c1 = 1 - std::pow(o.beta1, t), c2 = 1 - std::pow(o.beta2, t);
      for (size_t j = 0; j < pv.size(); ++j) {
        const double mj = o.beta1 * mv[j] + (1 - o.beta1) * gv[j], vj = o.beta2 * vv[j] + (1 - o.beta2) * gv[j] * gv[j];
        const double pj = pv[j] * (1 - o.lr * o.weight_decay) - o.lr / c1 * mj / (std::sqrt(vj / c2) + o.eps);
        worst = std::max({worst, std::abs(m_out[j] - mj), std::abs(v_out[j] - vj), std::abs(p_out[j] - pj)});
      }
    }
    CAPTURE(worst);
    CHECK(worst <= tolerance);
  }
}

TEST_CASE("foreach/sum_of_squares and mul_ over several launches, empty tensors and an empty list") {
  const std::vector<tg::Tensor> xs = random_list(5, tg::DType::Float64);
  double expected = 0;
  for (const tg::Tensor& x : xs)
    for (double v : x.to_vector()) expected += v * v;
  const tg::Tensor total = tg::foreach_sum_of_squares(xs);
  CHECK(total.dtype() == tg::DType::Float64);
  CHECK(total.dim() == 0);
  CHECK(total.item() == doctest::Approx(expected).epsilon(1e-13));
  CHECK(tg::foreach_sum_of_squares({}).item() == 0.0);
  CHECK(tg::foreach_sum_of_squares({tg::zeros({0})}).item() == 0.0);
  // float32 values squared in float64: 1e20^2 is past float32's range.
  CHECK(tg::foreach_sum_of_squares({tg::full({3}, 1e20)}).item() == doctest::Approx(3e40).epsilon(1e-6));

  const std::vector<tg::Tensor> scaled = clones(xs);
  tg::foreach_mul_(scaled, -0.25);
  for (size_t i = 0; i < xs.size(); ++i) CHECK(max_abs_diff(scaled[i], tg::mul(xs[i], -0.25)) == 0.0);
}

TEST_CASE("foreach/bad lists are errors naming the list, the index and what differs") {
  const tg::Tensor a = tg::zeros({3}), b = tg::zeros({4}), d = tg::zeros({3}, {tg::DType::Float64});
  const tg::AdamWHyper h{0.1, 0.9, 0.999, 1e-8, 0.0};
  CHECK(error_of([&] { tg::foreach_adamw_({a}, {a, a}, {a}, {a}, {1}, h); }) ==
        "foreach_adamw_: grads holds 2 tensors, params holds 1");
  CHECK(error_of([&] { tg::foreach_adamw_({a}, {b}, {a}, {a}, {1}, h); }) ==
        "foreach_adamw_: grads[0] is [4], params[0] is [3]");
  CHECK(error_of([&] { tg::foreach_adamw_({a, d}, {a, d}, {a, d}, {a, d}, {1, 1}, h); }) ==
        "foreach_adamw_: params[1] is float64 on cpu, params[0] is float32 on cpu (one dtype and one device per call)");
  CHECK(error_of([&] { tg::foreach_adamw_({a}, {a}, {a}, {a}, {0}, h); }) ==
        "foreach_adamw_: steps[0] is 0; a step counts itself, so it is at least 1");
  CHECK(error_of([&] { tg::foreach_adamw_({a}, {a}, {a}, {a}, {}, h); }) ==
        "foreach_adamw_: steps holds 0 counts, params 1 tensors");
  const tg::Tensor t = tg::zeros({2, 3}).transpose(0, 1);
  CHECK(error_of([&] { tg::foreach_mul_({t}, 2.0); }) ==
        "foreach_mul_: xs[0] [3,2] with strides [1,3] is not contiguous");
  CHECK(error_of([&] { tg::foreach_sum_of_squares({a, tg::Tensor()}); }) ==
        "foreach_sum_of_squares: xs[1] is an undefined tensor");
  CHECK(error_of([&] { tg::foreach_adamw_({a}, {a}, {a}, {a}, {1}, {0.1, 1.0, 0.999, 1e-8, 0.0}); }) ==
        "foreach_adamw_: betas must be in [0, 1), got (1, 0.999)");
  CHECK(error_of([&] { tg::foreach_adamw_({a}, {a}, {a}, {a}, {1}, {-1.0, 0.9, 0.999, 1e-8, 0.0}); }) ==
        "foreach_adamw_: lr must be finite and >= 0, got -1");
  CHECK(error_of([&] { tg::foreach_adamw_({a}, {a}, {a}, {a}, {1}, {0.1, 0.9, 0.999, NAN, 0.0}); }) ==
        "foreach_adamw_: eps nan and weight_decay 0 must be finite and >= 0");
  const tg::Tensor leaf = tg::zeros({3}).requires_grad_();
  CHECK(error_of([&] { tg::foreach_mul_({leaf}, 2.0); }) ==
        "foreach_mul_: in-place write to a leaf tensor of shape [3] that requires grad; wrap it in tg::NoGradGuard");
}

// One launch writes a call's tensors at once, so those it writes may share
// memory with no other tensor of the call; tensors it only reads may.
TEST_CASE("foreach/tensors a call writes share no memory") {
  const tg::Tensor x = tg::zeros({200});
  CHECK(error_of([&] { tg::foreach_mul_({x, x}, 2.0); }) ==
        "foreach_mul_: xs[0] and xs[1] share memory; a tensor a call writes must share it with no other tensor of "
        "the call");
  CHECK(error_of([&] { tg::foreach_mul_({x.narrow(0, 0, 4), x.narrow(0, 2, 4)}, 2.0); }) ==
        "foreach_mul_: xs[0] and xs[1] share memory; a tensor a call writes must share it with no other tensor of "
        "the call");
  tg::foreach_mul_({x.narrow(0, 0, 4), x.narrow(0, 4, 4)}, 2.0);  // neighbours, not overlapping
  const auto fresh = [](int64_t n) { return tg::zeros({n}); };
  const tg::AdamWHyper h{0.1, 0.9, 0.999, 1e-8, 0.0};
  // grads[0] covers x[0, 100), grads[1] x[10, 20) (reads may overlap), params[2] x[50, 60): the write clashes
  // with grads[0], not with its neighbour in address order, grads[1].
  const std::vector<tg::Tensor> grads{x.narrow(0, 0, 100), x.narrow(0, 10, 10), fresh(10)};
  const std::vector<tg::Tensor> params{fresh(100), fresh(10), x.narrow(0, 50, 10)};
  const std::vector<tg::Tensor> m{fresh(100), fresh(10), fresh(10)}, v{fresh(100), fresh(10), fresh(10)};
  CHECK(error_of([&] { tg::foreach_adamw_(params, grads, m, v, {1, 1, 1}, h); }) ==
        "foreach_adamw_: grads[0] and params[2] share memory; a tensor a call writes must share it with no other "
        "tensor of the call");
  const std::vector<tg::Tensor> separate{fresh(100), fresh(10), fresh(10)};
  const std::vector<tg::Tensor> v_sharing_m{m[0], v[1], v[2]};
  CHECK(error_of([&] { tg::foreach_adamw_(params, separate, m, v_sharing_m, {1, 1, 1}, h); }) ==
        "foreach_adamw_: exp_avgs[0] and exp_avg_sqs[0] share memory; a tensor a call writes must share it with no "
        "other tensor of the call");
  tg::foreach_adamw_(separate, grads, m, v, {1, 1, 1}, h);  // overlapping reads only
}

// An optimizer step writes the parameters in place: a graph that saved a
// parameter before the step cannot be differentiated after it (as with
// PyTorch's version counters), rather than giving a gradient at the new value.
TEST_CASE("optim/AdamW steps and clipping bump the version counters of what they write") {
  tg::Tensor p = param64({1, 2, 3});
  optim::AdamW adamw({p}, {.lr = 0.1});
  const tg::Tensor y = tg::sum(tg::mul(p, p));  // saves p
  set_grad(p, {1, 1, 1});
  const uint64_t before = p.version(), grad_before = p.grad().version();
  adamw.step();
  CHECK(p.version() > before);
  CHECK(contains(error_of([&] { y.backward(); }), "modified in place"));
  CHECK(tg::nn::utils::clip_grad_norm_({p}, 1e-3) > 1e-3);
  CHECK(p.grad().version() > grad_before);
  CHECK(error_of([&] { tg::nn::utils::clip_grad_norm_({p, p}, 1.0); }) ==
        "clip_grad_norm_: parameter 1 [3] appears more than once (its gradient would count and be scaled twice)");
}

// A parameter that is a transposed view steps through a contiguous copy
// written back: the same values as a contiguous twin's.
TEST_CASE("optim/AdamW steps a parameter that is not contiguous like a contiguous one") {
  tg::manual_seed(7);
  const tg::Tensor base = tg::randn({3, 4}, {tg::DType::Float64});
  tg::Tensor strided = base.clone().transpose(0, 1).requires_grad_();
  tg::Tensor twin = base.clone().transpose(0, 1).contiguous().requires_grad_();
  REQUIRE_FALSE(strided.is_contiguous());
  optim::AdamW a({strided}), b({twin});
  const tg::Tensor g = tg::randn({4, 3}, {tg::DType::Float64});
  for (int k = 0; k < 2; ++k) {
    for (tg::Tensor* p : {&strided, &twin}) {
      p->zero_grad();
      tg::sum(tg::mul(*p, g)).backward();
    }
    a.step();
    b.step();
  }
  CHECK(max_abs_diff(strided, twin) == 0.0);
  CHECK(max_abs_diff(strided, base.transpose(0, 1)) > 1e-4);
}
