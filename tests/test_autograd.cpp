// Recording and the backward walk as a user sees them: accumulation, grad
// mode, freeing, version counters. The engine's own cases are in test_engine.cpp.
#include "helpers.h"

using namespace tgtest;

TEST_CASE("autograd/simple graph gives the hand-derived gradient") {
  // L = sum(x * y + x), dL/dx = y + 1, dL/dy = x
  tg::Tensor x = tg::from_vector({1, 2, 3}, {3}).requires_grad_();
  tg::Tensor y = tg::from_vector({4, 5, 6}, {3}).requires_grad_();
  tg::Tensor loss = tg::sum(x * y + x);
  CHECK(loss.item() == doctest::Approx(1 * 4 + 2 * 5 + 3 * 6 + 6));
  loss.backward();
  CHECK(x.grad().to_vector() == std::vector<double>{5, 6, 7});
  CHECK(y.grad().to_vector() == std::vector<double>{1, 2, 3});
}

TEST_CASE("autograd/a tensor used twice accumulates both paths") {
  tg::Tensor x = tg::from_vector({3}, {1}).requires_grad_();
  tg::Tensor loss = tg::sum(x * x * x);  // d/dx x^3 = 3x^2 = 27
  loss.backward();
  CHECK(x.grad().item() == doctest::Approx(27));
}

TEST_CASE("autograd/gradients accumulate across backward calls until zero_grad") {
  tg::Tensor x = tg::from_vector({2}, {1}).requires_grad_();
  tg::sum(x * 3.0).backward();
  tg::sum(x * 3.0).backward();
  CHECK(x.grad().item() == doctest::Approx(6));
  x.zero_grad();
  CHECK_FALSE(x.grad().defined());
  tg::sum(x * 3.0).backward();
  CHECK(x.grad().item() == doctest::Approx(3));
}

TEST_CASE("autograd/backward twice over a freed graph is an error; retain_graph keeps it") {
  tg::Tensor x = tg::from_vector({1, 2}, {2}).requires_grad_();
  tg::Tensor loss = tg::sum(tg::exp(x));
  loss.backward(tg::Tensor(), /*retain_graph=*/true);
  loss.backward();
  CHECK(x.grad().at({0}) == doctest::Approx(2 * std::exp(1.0)));
  const std::string msg = error_of([&] { loss.backward(); });
  CHECK(contains(msg, "backward: the graph behind this tensor (op 'sum') was freed"));
  CHECK(contains(msg, "retain_graph"));
}

TEST_CASE("autograd/no_grad records nothing") {
  tg::Tensor x = tg::ones({2}).requires_grad_();
  tg::Tensor y;
  {
    tg::NoGradGuard guard;
    y = x * 2.0;
  }
  CHECK_FALSE(y.requires_grad());
  CHECK(y.is_leaf());
  CHECK(contains(error_of([&] { tg::sum(y).backward(); }), "does not require grad"));
}

TEST_CASE("autograd/detach cuts the graph but shares storage") {
  tg::Tensor x = tg::ones({2}).requires_grad_();
  tg::Tensor y = x * 2.0;
  tg::Tensor d = y.detach();
  CHECK_FALSE(d.requires_grad());
  CHECK(d.same_storage(y));
  tg::Tensor loss = tg::sum(y * d);  // d is a constant: dL/dx = 2 * d = 4
  loss.backward();
  CHECK(x.grad().to_vector() == std::vector<double>{4, 4});
}

TEST_CASE("autograd/an in-place write to a saved tensor is detected at backward") {
  tg::Tensor x = tg::from_vector({1, 2}, {2}).requires_grad_();
  tg::Tensor w = tg::from_vector({3, 4}, {2});
  tg::Tensor loss = tg::sum(x * w);  // saves w
  w.mul_(2.0);
  const std::string msg = error_of([&] { loss.backward(); });
  CHECK(contains(msg, "mul: a tensor of shape [2] saved for backward was modified in place"));
  CHECK(contains(msg, "version 1, saved at version 0"));
}

TEST_CASE("autograd/in-place write to a leaf that requires grad is an error outside no_grad") {
  tg::Tensor w = tg::ones({2}).requires_grad_();
  CHECK(contains(error_of([&] { w.mul_(2.0); }), "mul_: in-place write to a leaf tensor of shape [2] that requires grad"));
  tg::NoGradGuard guard;
  w.mul_(2.0);
  CHECK(w.to_vector() == std::vector<double>{2, 2});
}

TEST_CASE("autograd/non-scalar backward needs an explicit seed") {
  tg::Tensor x = tg::from_vector({1, 2, 3}, {3}).requires_grad_();
  tg::Tensor y = x * x;
  CHECK(contains(error_of([&] { y.backward(); }), "shape [3], so pass backward(seed)"));
  y.backward(tg::from_vector({1, 0, 2}, {3}));
  CHECK(x.grad().to_vector() == std::vector<double>{2, 0, 12});
  CHECK(contains(error_of([&] { (x * 2.0).backward(tg::ones({2})); }), "seed of shape [2] does not match"));
}

TEST_CASE("autograd/nodes live as long as the graph is held and go with it") {
  const int64_t before = tg::autograd::live_nodes();
  tg::Tensor x = tg::ones({2}).requires_grad_();
  {
    tg::Tensor unused = tg::exp(x * 2.0);
    CHECK(tg::autograd::live_nodes() == before + 2);
  }
  CHECK(tg::autograd::live_nodes() == before);  // nobody holds that graph
  tg::Tensor loss = tg::sum(x * 3.0);
  CHECK(tg::autograd::live_nodes() == before + 2);
  loss.backward();
  loss = tg::Tensor();
  CHECK(tg::autograd::live_nodes() == before);
}

TEST_CASE("autograd/only the part of the graph behind the root runs") {
  tg::Tensor x = tg::from_vector({1}, {1}).requires_grad_();
  tg::Tensor a = x * 2.0;
  tg::Tensor b = x * 5.0;  // recorded after a, not behind a
  tg::sum(a).backward();
  CHECK(x.grad().item() == doctest::Approx(2));
  tg::sum(b).backward();
  CHECK(x.grad().item() == doctest::Approx(7));
}

TEST_CASE("autograd/a leaf's gradient never aliases another tensor") {
  // exp's gradient is a fresh tensor (taken over as .grad); clone's is the seed
  // itself (copied); a leaf root gets the seed (copied).
  tg::Tensor x = tg::from_vector({0, 1}, {2}).requires_grad_();
  tg::exp(x).backward(tg::ones({2}));
  CHECK(x.grad().to_vector()[1] == doctest::Approx(std::exp(1.0)));
  tg::Tensor y = tg::from_vector({1, 2}, {2}).requires_grad_();
  tg::Tensor seed = tg::ones({2});
  tg::clone(y).backward(seed);
  CHECK_FALSE(y.grad().same_storage(seed));
  seed.fill_(5.0);
  CHECK(y.grad().to_vector() == std::vector<double>{1, 1});
  tg::Tensor z = tg::zeros({2}).requires_grad_();
  z.backward(seed);
  CHECK_FALSE(z.grad().same_storage(seed));
  CHECK(z.grad().to_vector() == std::vector<double>{5, 5});
}
