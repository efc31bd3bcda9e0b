// engine/ and concurrency/: the backward walk from the root (graph discovery,
// dependency order, per-call state), needs-grad masks, long chains, threads.
// CI also runs this file's cases under ThreadSanitizer (.ci/run).
#include <atomic>
#include <chrono>
#include <cmath>
#include <set>
#include <thread>

#include "autograd/node.h"
#include "helpers.h"

using namespace tgtest;

namespace {
tg::Tensor leaf(std::vector<double> v) {
  const tg::Shape s{static_cast<int64_t>(v.size())};
  return tg::from_vector(v, s, {tg::DType::Float64}).requires_grad_();
}

double seconds_for(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

TEST_CASE("engine/a second backward over a freed shared subgraph is an error; retained, it adds 3 e^x") {
  SUBCASE("freed") {
    tg::Tensor x = leaf({0.5, -1.0});
    const tg::Tensor y = tg::exp(x);
    const tg::Tensor l1 = tg::sum(y), l2 = tg::sum(tg::mul(y, 2.0));
    l1.backward();
    const std::string msg = error_of([&] { l2.backward(); });
    CHECK(contains(msg, "backward: op 'exp' was already freed by an earlier backward()"));
    CHECK(contains(msg, "retain_graph=true"));
    CHECK(x.grad().at({0}) == doctest::Approx(std::exp(0.5)).epsilon(1e-14));  // only l1's part, from the first call
  }
  SUBCASE("retained") {
    tg::Tensor x = leaf({0.5, -1.0});
    const tg::Tensor y = tg::exp(x);
    const tg::Tensor l1 = tg::sum(y), l2 = tg::sum(tg::mul(y, 2.0));
    l1.backward(tg::Tensor(), /*retain_graph=*/true);
    l2.backward();
    CHECK(x.grad().at({0}) == doctest::Approx(3 * std::exp(0.5)).epsilon(1e-14));
    CHECK(x.grad().at({1}) == doctest::Approx(3 * std::exp(-1.0)).epsilon(1e-14));
  }
}

TEST_CASE("engine/a backward that throws changes no gradient and leaves nothing for the next one") {
  tg::Tensor x1 = leaf({1, 2}), x2 = leaf({3, 4});
  tg::Tensor w = tg::from_vector({5, 6}, {2}, {tg::DType::Float64});
  // x1's branch is sound; x2's saved w is modified before backward.
  const tg::Tensor loss = tg::add(tg::sum(tg::mul(x1, 2.0)), tg::sum(tg::mul(x2, w)));
  w.mul_(2.0);
  CHECK(contains(error_of([&] { loss.backward(); }), "saved for backward was modified in place"));
  CHECK_FALSE(x1.grad().defined());  // not even the branch that ran
  CHECK_FALSE(x2.grad().defined());
  tg::Tensor z = leaf({7});
  tg::sum(tg::mul(z, 3.0)).backward();  // an unrelated graph afterwards
  CHECK(z.grad().item() == 3.0);
  CHECK_FALSE(x1.grad().defined());
}

TEST_CASE("engine/backward on another thread than the one that built the graph") {
  tg::Tensor x = leaf({1, 2, 3});
  const tg::Tensor loss = tg::sum(tg::mul(x, x));
  std::thread([&] { loss.backward(); }).join();
  CHECK(x.grad().to_vector() == std::vector<double>{2, 4, 6});
  tg::Tensor z = leaf({1});
  tg::sum(tg::mul(z, 5.0)).backward();  // a later backward here must not replay the first one
  CHECK(x.grad().to_vector() == std::vector<double>{2, 4, 6});
  CHECK(z.grad().item() == 5.0);
}

TEST_CASE("engine/the cost of a backward does not grow with unrelated live graphs") {
  auto tiny_backwards = [] {
    for (int i = 0; i < 200; ++i) {
      tg::Tensor x = leaf({1});
      tg::sum(tg::mul(x, 2.0)).backward();
    }
  };
  const double alone = seconds_for(tiny_backwards);
  tg::Tensor base = leaf({1});
  std::vector<tg::Tensor> unrelated;
  for (int i = 0; i < 100000; ++i) unrelated.push_back(tg::add(base, 1.0));
  const double crowded = seconds_for(tiny_backwards);
  CAPTURE(alone);
  CAPTURE(crowded);
  CHECK(crowded < 10 * alone + 0.05);  // the tape engine took 370x longer here
}

TEST_CASE("engine/a 1,000,000-node chain runs backward and is released without deep recursion") {
  const int64_t before = tg::autograd::live_nodes();
  tg::Tensor x = leaf({0});
  tg::Tensor y = x;
  for (int i = 0; i < 1000000; ++i) y = tg::add(y, 1.0);
  CHECK(y.item() == 1000000.0);
  CHECK(tg::autograd::live_nodes() == before + 1000000);
  tg::sum(y).backward();
  CHECK(x.grad().item() == 1.0);
  y = tg::Tensor();  // the last handle: the whole chain goes, iteratively
  CHECK(tg::autograd::live_nodes() == before);
  tg::Tensor z = leaf({0});
  for (int i = 0; i < 200000; ++i) z = tg::add(z, 1.0);
  z = tg::Tensor();  // never differentiated
  CHECK(tg::autograd::live_nodes() == before);
}

TEST_CASE("engine/each closure is told which inputs need a gradient") {
  tg::Tensor a = leaf({1, 2}), b = tg::from_vector({3, 4}, {2}, {tg::DType::Float64});
  tg::autograd::GradMask seen;
  tg::Tensor out = tg::autograd::record("probe", tg::add(a.detach(), b), {a, b, tg::Tensor()}, {},
                                        [&](const tg::Tensor& g, const auto&, const tg::autograd::GradMask& needs) {
                                          seen = needs;
                                          return std::vector<tg::Tensor>{g, tg::Tensor(), tg::Tensor()};
                                        });
  tg::sum(out).backward();
  CHECK(seen == tg::autograd::GradMask{true, false, false});
  CHECK(a.grad().to_vector() == std::vector<double>{1, 1});
  CHECK(out.grad_fn()->name == "probe");
}

TEST_CASE("engine/ops save only what their needed gradients read") {
  auto storage_of = [](const tg::Tensor& t) { return std::weak_ptr<tg::Storage>(t.impl()->storage); };
  tg::Tensor x = leaf({1, 2, 3});
  SUBCASE("scalar ops save nothing: the scores of mul(s, scale) can go") {
    tg::Tensor s = tg::add(x, 1.0);
    const auto s_storage = storage_of(s);
    const tg::Tensor scaled = tg::neg(tg::mul(tg::add(s, 2.0), 0.125));
    s = tg::Tensor();
    CHECK(s_storage.expired());
    tg::sum(scaled).backward();
    CHECK(x.grad().to_vector() == std::vector<double>{-0.125, -0.125, -0.125});
  }
  SUBCASE("mul keeps only the other operand of the input that needs a gradient") {
    tg::Tensor a = tg::add(x, 1.0);  // requires grad
    const tg::Tensor b = tg::from_vector({4, 5, 6}, {3}, {tg::DType::Float64});
    const auto a_storage = storage_of(a);
    const tg::Tensor y = tg::mul(a, b);
    a = tg::Tensor();
    CHECK(a_storage.expired());  // b's gradient is not needed, so a is not kept
    tg::sum(y).backward();
    CHECK(x.grad().to_vector() == std::vector<double>{4, 5, 6});
  }
  SUBCASE("matmul with a constant right operand keeps only that operand") {
    tg::Tensor a = tg::add(tg::randn({2, 3}, {tg::DType::Float64}).requires_grad_(), 0.0);
    const auto a_storage = storage_of(a);
    const tg::Tensor y = tg::matmul(a, tg::randn({3, 4}, {tg::DType::Float64}));
    a = tg::Tensor();
    CHECK(a_storage.expired());
  }
}

TEST_CASE("engine/error texts: implied seed, freed graph, version counter") {
  tg::Tensor x = leaf({1, 2});
  CHECK(contains(error_of([&] { tg::mul(x, 2.0).backward(); }), "a seed gradient can be implied only for a tensor with one element"));
  const tg::Tensor loss = tg::sum(tg::exp(x));
  loss.backward();
  CHECK(contains(error_of([&] { loss.backward(); }), "the graph behind this tensor (op 'sum') was freed"));
}

TEST_CASE("concurrency/two threads accumulating into one leaf lose no update") {
  tg::Tensor w = leaf({1, 1, 1, 1});
  constexpr int kSteps = 200;
  auto work = [&] {
    for (int i = 0; i < kSteps; ++i) tg::sum(tg::mul(w, 0.5)).backward();
  };
  std::thread t1(work), t2(work);
  t1.join();
  t2.join();
  CHECK(w.grad().to_vector() == std::vector<double>(4, 2 * kSteps * 0.5));
}

TEST_CASE("concurrency/threads drawing random tensors get distinct draws") {
  constexpr int kDraws = 500;
  std::vector<uint64_t> offsets[2];
  auto draw = [&](int t) {
    for (int i = 0; i < kDraws; ++i) {
      offsets[t].push_back(tg::default_generator().next().offset);
      tg::rand({4});
    }
  };
  std::thread t1(draw, 0), t2(draw, 1);
  t1.join();
  t2.join();
  std::set<uint64_t> all(offsets[0].begin(), offsets[0].end());
  all.insert(offsets[1].begin(), offsets[1].end());
  CHECK(all.size() == 2 * kDraws);
}

TEST_CASE("concurrency/threads running backward over one retained graph") {
  tg::Tensor x = leaf({1, 2});
  const tg::Tensor loss = tg::sum(tg::mul(tg::exp(x), 2.0));
  auto work = [&] {
    for (int i = 0; i < 50; ++i) loss.backward(tg::Tensor(), /*retain_graph=*/true);
  };
  std::thread t1(work), t2(work);
  t1.join();
  t2.join();
  CHECK(x.grad().at({1}) == doctest::Approx(100 * 2 * std::exp(2.0)).epsilon(1e-12));
}

TEST_CASE("engine/an observer sees every node the walk runs, each after all its consumers") {
  tg::Tensor x = leaf({1, 2});
  const tg::Tensor y = tg::exp(x);
  const tg::Tensor loss = tg::sum(tg::add(tg::mul(y, 2.0), y));
  std::vector<std::string> order;
  std::vector<double> grad_of_exp;
  {
    const tg::autograd::ObserveBackward observe([&](const tg::autograd::Node& n, const tg::Tensor& g, const auto&) {
      order.push_back(n.name);
      if (n.name == "exp") grad_of_exp = g.to_vector();
    });
    loss.backward();
  }
  CHECK(order == std::vector<std::string>{"sum", "add", "mul_scalar", "exp"});
  CHECK(grad_of_exp == std::vector<double>{3, 3});  // both paths summed before exp runs
  tg::sum(tg::mul(x, 1.0)).backward();              // the guard is gone: nothing observed
  CHECK(order.size() == 4);
}

TEST_CASE("engine/saved tensors are freed by the backward that used them") {
  tg::Tensor x = leaf({1, 2});
  tg::Tensor y = tg::exp(x);  // exp saves its output
  const auto y_storage = std::weak_ptr<tg::Storage>(y.impl()->storage);
  const tg::Tensor loss = tg::sum(y);
  y = tg::Tensor();
  CHECK_FALSE(y_storage.expired());  // held for the backward
  loss.backward();
  CHECK(y_storage.expired());
}

TEST_CASE("engine/a leaf's gradient never aliases the seed through a view") {
  tg::Tensor x = tg::from_vector({1, 2}, {1, 2}, {tg::DType::Float64}).requires_grad_();
  tg::Tensor seed = tg::from_vector({3, 4}, {2}, {tg::DType::Float64});
  x.view({2}).backward(seed);
  CHECK_FALSE(x.grad().same_storage(seed));
  seed.fill_(0.0);
  CHECK(x.grad().to_vector() == std::vector<double>{3, 4});
}

TEST_CASE("engine/gradients must match their input's shape, dtype and device; a bad one changes no .grad()") {
  tg::Tensor a = leaf({1, 2});
  tg::sum(tg::mul(a, 1.0)).backward();  // a.grad = [1, 1]
  auto custom = [&](auto grad_of) {
    return tg::autograd::record("custom", tg::add(a.detach(), 0.0), {a}, {},
                                [grad_of](const tg::Tensor& g, const auto&, const auto&) { return std::vector<tg::Tensor>{grad_of(g)}; });
  };
  CHECK(contains(error_of([&] { tg::sum(custom([](const tg::Tensor& g) { return g.reshape({1, 2}); })).backward(); }),
                 "backward: op 'custom' returned a gradient of shape [1,2] for its input 0 of shape [2]"));
  CHECK(contains(error_of([&] { tg::sum(custom([](const tg::Tensor& g) { return g.to(tg::DType::Float32); })).backward(); }),
                 "returned a float32 cpu gradient for its input 0, which is float64 on cpu"));
  CHECK(a.grad().to_vector() == std::vector<double>{1, 1});
  CHECK(contains(error_of([&] { tg::sum(tg::mul(a, 2.0)).backward(tg::scalar_tensor(1.0)); }),
                 "backward: tensors have different dtypes"));
}

// A closure holds the engine's only handle to dL/d(output) (one that takes
// it by value can free it before it returns; an observer keeps a second
// handle; the gradient here comes from an op that returns a fresh tensor) and
// may drop a saved tensor it is done with (release_early), which frees it only
// when the graph is not retained: then reading it again is an error, while a
// retained graph runs the same closure twice.
TEST_CASE("engine/a backward owns its incoming gradient and releases saved tensors early unless retained") {
  tg::Tensor a = leaf({1, 2});
  long owners = 0;
  bool freed = false;
  std::string read_after;
  const auto op = [&] {
    const tg::Tensor y = tg::autograd::record("owner", tg::mul(a.detach(), a.detach()), {a}, {a.detach()},
                                              [&](tg::Tensor g, const auto& s, const auto&) {
                                                owners = g.impl().use_count();
                                                std::vector<tg::Tensor> grads{tg::mul(g, tg::mul(s[0], 2.0))};
                                                const std::weak_ptr<tg::TensorImpl> held = s[0].impl();
                                                s.release_early(0);
                                                freed = held.expired();
                                                read_after = error_of([&] { (void)s[0]; });
                                                return grads;
                                              });
    return tg::sum(tg::autograd::record("fresh", tg::add(y.detach(), 0.0), {y}, {}, [](const tg::Tensor& g, const auto&, const auto&) {
      return std::vector<tg::Tensor>{tg::mul(g, 1.0)};
    }));
  };
  op().backward();
  CHECK(owners == 1);
  CHECK(freed);
  CHECK(contains(read_after, "owner: saved tensor 0 was released early by an earlier run of this backward"));
  CHECK(a.grad().to_vector() == std::vector<double>{2, 4});
  a.zero_grad();
  const tg::Tensor retained = op();
  retained.backward(tg::Tensor(), /*retain_graph=*/true);
  CHECK(!freed);
  CHECK(read_after.empty());
  retained.backward();  // the last run: released
  CHECK(freed);
  CHECK(contains(read_after, "pass retain_graph=true to run it again"));
  CHECK(a.grad().to_vector() == std::vector<double>{4, 8});
  {
    const tg::autograd::ObserveBackward observe([](const auto&, const auto&, const auto&) {});
    op().backward();
  }
  CHECK(owners == 2);
}

TEST_CASE("engine/a subgraph shared by two losses survives dropping one of them") {
  tg::Tensor x = leaf({0.5});
  const tg::Tensor y = tg::exp(tg::exp(x));
  tg::Tensor l1 = tg::sum(y);
  const tg::Tensor l2 = tg::sum(tg::mul(y, 2.0));
  l1 = tg::Tensor();
  l2.backward();
  REQUIRE(x.grad().defined());
  CHECK(x.grad().item() == doctest::Approx(2 * std::exp(std::exp(0.5)) * std::exp(0.5)).epsilon(1e-14));
}

TEST_CASE("engine/a long chain held through closures is released without deep recursion") {
  const int64_t before = tg::autograd::live_nodes();
  tg::Tensor y = leaf({0});
  for (int i = 0; i < 200000; ++i) {
    const tg::Tensor prev = y;  // captured by the closure, not by an edge
    y = tg::autograd::record("captures", tg::add(prev.detach(), 1.0), {prev}, {},
                             [prev](const tg::Tensor& g, const auto&, const auto&) { return std::vector<tg::Tensor>{g}; });
  }
  y = tg::Tensor();
  CHECK(tg::autograd::live_nodes() == before);
}

TEST_CASE("engine/gradcheck notices a gradient that is 1e-4 off") {
  const auto scaled = [](double factor) {
    return [factor](const std::vector<tg::Tensor>& t) {
      return tg::autograd::record("scaled", tg::mul(t[0].detach(), 3.0), {t[0]}, {},
                                  [factor](const tg::Tensor& g, const auto&, const auto&) {
                                    return std::vector<tg::Tensor>{tg::mul(g, 3.0 * factor)};
                                  });
    };
  };
  const std::vector<tg::Tensor> x{randn64({4})};
  CHECK(tg::gradcheck(scaled(1.0), x).ok);
  CHECK_FALSE(tg::gradcheck(scaled(1.0 + 1e-4), x).ok);
}

TEST_CASE("engine/requires_grad_(false) is only for leaves; in-place writes into an op's output need no_grad") {
  tg::Tensor x = leaf({1, 2});
  tg::Tensor y = tg::mul(x, 2.0);
  CHECK(contains(error_of([&] { y.requires_grad_(false); }), "only leaf tensors can stop requiring grad"));
  CHECK(contains(error_of([&] { y.fill_(0.0); }), "fill_: in-place write to a tensor of shape [2] produced by op 'mul_scalar'"));
  tg::NoGradGuard no_grad;
  tg::Tensor(x.view({2})).mul_(2.0);  // as an optimizer updates a parameter through a view
  CHECK(x.to_vector() == std::vector<double>{2, 4});
}

TEST_CASE("engine/a held .grad() keeps its values; the next backward accumulates into a new tensor") {
  tg::Tensor w = leaf({1, 2});
  tg::sum(tg::mul(w, 3.0)).backward();
  const tg::Tensor held = w.grad();
  const void* first_storage = held.raw_data();
  tg::sum(tg::mul(w, 3.0)).backward();
  CHECK(held.to_vector() == std::vector<double>{3, 3});
  CHECK(w.grad().to_vector() == std::vector<double>{6, 6});
  CHECK(w.grad().raw_data() != first_storage);
}

TEST_CASE("engine/an unheld .grad() is accumulated in place") {
  tg::Tensor w = leaf({1, 2});
  tg::sum(tg::mul(w, 3.0)).backward();
  const void* storage = w.grad().raw_data();
  tg::sum(tg::mul(w, 3.0)).backward();
  CHECK(w.grad().raw_data() == storage);
  CHECK(w.grad().to_vector() == std::vector<double>{6, 6});
}

TEST_CASE("concurrency/reading a leaf's gradient while another thread accumulates into it") {
  tg::Tensor w = leaf({1, 1});
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int i = 0; i < 200; ++i) tg::sum(tg::mul(w, 2.0)).backward();
    done = true;
  });
  double last = 0;
  while (!done) {
    const tg::Tensor g = w.grad();
    if (g.defined()) last = g.to_vector()[0];
  }
  writer.join();
  CHECK(last <= 400);
  CHECK(w.grad().to_vector() == std::vector<double>{400, 400});
}
