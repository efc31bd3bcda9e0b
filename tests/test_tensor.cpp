// Tensors: factories, views without copies, contiguous, casts, printing, RNG.
#include <cmath>
#include <random>
#include <sstream>

#include "core/indexing.h"
#include "helpers.h"

using namespace tgtest;

TEST_CASE("tensor/factories") {
  CHECK(tg::zeros({2, 3}).to_vector() == std::vector<double>(6, 0.0));
  CHECK(tg::ones({4}).to_vector() == std::vector<double>(4, 1.0));
  CHECK(tg::full({2}, 2.5, {tg::DType::Float64}).to_vector() == std::vector<double>{2.5, 2.5});
  CHECK(tg::arange(4).to_vector() == std::vector<double>{0, 1, 2, 3});
  const tg::Tensor t = tg::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(t.shape() == tg::Shape{2, 3});
  CHECK(t.strides() == tg::Shape{3, 1});
  CHECK(t.at({1, 2}) == 6);
  CHECK(t.dtype() == tg::DType::Float32);
  CHECK(t.device() == tg::Device::CPU);
  CHECK(tg::scalar_tensor(3.0).dim() == 0);
  CHECK(tg::scalar_tensor(3.0).item() == 3.0);
}

TEST_CASE("tensor/strided indexing divides by multiply-high, as integer division does") {
  std::vector<uint32_t> divisors = {1, 2, 3, 5, 7, 63, 64, 65, 1000, 1023, 1024, 1025, 3072, 65535, 65537,
                                    (1u << 30) - 1, 1u << 30, (1u << 30) + 1, (1u << 31) - 1};
  std::mt19937 gen(7);
  for (int i = 0; i < 200; ++i) divisors.push_back(1 + gen() % ((1u << 31) - 1));
  for (const uint32_t d : divisors) {
    const tg::Divider div(d);
    std::vector<uint32_t> dividends = {0, 1, d - 1, d, (1u << 31) - 1, (1u << 31) - 1 - ((1u << 31) - 1) % d};
    if (d < (1u << 30)) dividends.insert(dividends.end(), {d + 1, 2 * d - 1, 2 * d});
    for (int k = 0; k < 50; ++k) dividends.push_back(gen() % (1u << 31));
    for (const uint32_t n : dividends) REQUIRE_MESSAGE(div.quotient(n) == n / d, n, " / ", d);
  }
  // Offsets through the dividers match the 64-bit arithmetic (a permuted view, odd sizes).
  const tg::Shape shape = {3, 5, 7, 11}, strides = {1, 3, 165, 15};
  const tg::StridedIndexer narrow = tg::make_indexer("test", shape, strides);
  tg::StridedIndexer wide = narrow;
  wide.narrow = false;
  REQUIRE(narrow.narrow);
  for (int64_t i = 0; i < tg::numel(shape); ++i) REQUIRE(narrow.offset(i) == wide.offset(i));
}

TEST_CASE("tensor/views share storage and copy nothing") {
  const tg::Tensor t = tg::arange(24).view({2, 3, 4});
  const tg::Tensor p = t.permute({2, 0, 1});
  CHECK(p.same_storage(t));
  CHECK(p.shape() == tg::Shape{4, 2, 3});
  CHECK(p.strides() == tg::Shape{1, 12, 4});
  CHECK(p.at({3, 1, 2}) == t.at({1, 2, 3}));
  CHECK_FALSE(p.is_contiguous());

  const tg::Tensor tr = t.transpose(0, 2);
  CHECK(tr.same_storage(t));
  CHECK(tr.at({3, 2, 1}) == t.at({1, 2, 3}));

  const tg::Tensor n = t.narrow(1, 1, 2);
  CHECK(n.same_storage(t));
  CHECK(n.shape() == tg::Shape{2, 2, 4});
  CHECK(n.at({1, 0, 0}) == t.at({1, 1, 0}));

  const tg::Tensor e = tg::from_vector({1, 2, 3}, {3, 1}).expand({3, 4});
  CHECK(e.strides() == tg::Shape{1, 0});
  CHECK(e.at({2, 3}) == 3);

  const tg::Tensor r = t.reshape({6, 4});
  CHECK(r.same_storage(t));  // contiguous: a view
  const tg::Tensor rp = p.reshape({24});
  CHECK_FALSE(rp.same_storage(t));  // not contiguous: reshape copies
  CHECK(rp.at({1}) == p.at({0, 0, 1}));
  CHECK(t.unsqueeze(1).shape() == tg::Shape{2, 1, 3, 4});
  CHECK(t.unsqueeze(1).squeeze(1).shape() == tg::Shape{2, 3, 4});
  CHECK(t.view({-1, 4}).shape() == tg::Shape{6, 4});
}

TEST_CASE("tensor/contiguous copies a permuted view in logical order") {
  const tg::Tensor t = tg::arange(6).view({2, 3});
  const tg::Tensor c = t.transpose(0, 1).contiguous();
  CHECK(c.is_contiguous());
  CHECK(c.to_vector() == std::vector<double>{0, 3, 1, 4, 2, 5});
  CHECK(t.contiguous().same_storage(t));
}

TEST_CASE("tensor/dtype conversion and clone") {
  const tg::Tensor t = tg::from_vector({1.25, -2.5}, {2});
  const tg::Tensor d = t.to(tg::DType::Float64);
  CHECK(d.dtype() == tg::DType::Float64);
  CHECK(d.to_vector() == std::vector<double>{1.25, -2.5});
  const tg::Tensor c = t.clone();
  CHECK_FALSE(c.same_storage(t));
  CHECK(c.to_vector() == t.to_vector());
}

TEST_CASE("tensor/in-place ops bump the version") {
  tg::Tensor t = tg::zeros({3});
  const uint64_t v0 = t.version();
  t.fill_(2.0);
  t.add_(tg::ones({3}), 0.5);
  CHECK(t.version() == v0 + 2);
  CHECK(t.to_vector() == std::vector<double>{2.5, 2.5, 2.5});
  tg::Tensor view = t.narrow(0, 1, 1);
  view.zero_();
  CHECK(t.version() == v0 + 3);  // shared with every view of the storage
  CHECK(t.to_vector() == std::vector<double>{2.5, 0, 2.5});
}

TEST_CASE("tensor/make_view is untracked: its view shares storage but does not require grad") {
  const tg::Tensor x = tg::from_vector({1, 2, 3, 4}, {4}).requires_grad_();
  const tg::Tensor v = tg::make_view(x, {2}, {2}, 1);  // elements 1 and 3
  CHECK(v.to_vector() == std::vector<double>{2, 4});
  CHECK_FALSE(v.requires_grad());
  CHECK(v.same_storage(x));
}

TEST_CASE("tensor/printing") {
  std::ostringstream os;
  os << tg::from_vector({1, 2}, {1, 2});
  CHECK(os.str() == "Tensor(shape=[1,2], dtype=float32, device=cpu)\n[1, 2]");
}

TEST_CASE("rng/Philox4x32-10 known-answer vectors (Random123)") {
  const tg::Philox4 zero = tg::philox4x32_10({{0, 0, 0, 0}}, 0, 0);
  CHECK(zero.v[0] == 0x6627e8d5u);
  CHECK(zero.v[1] == 0xe169c58du);
  CHECK(zero.v[2] == 0xbc57ac4cu);
  CHECK(zero.v[3] == 0x9b00dbd8u);
  const tg::Philox4 ones = tg::philox4x32_10({{~0u, ~0u, ~0u, ~0u}}, ~0u, ~0u);
  CHECK(ones.v[0] == 0x408f276du);
  CHECK(ones.v[1] == 0x41c83b0eu);
  CHECK(ones.v[2] == 0xa20bc7c6u);
  CHECK(ones.v[3] == 0x6d5451fdu);
  const tg::Philox4 pi = tg::philox4x32_10({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u);
  CHECK(pi.v[0] == 0xd16cfe09u);
  CHECK(pi.v[1] == 0x94fdccebu);
  CHECK(pi.v[2] == 0x5001e420u);
  CHECK(pi.v[3] == 0x24126ea1u);
}

TEST_CASE("rng/rand and randn: element i is draw i of one Philox state, at any size, in float32 and float64") {
  const auto as = [](tg::DType dtype, double v) { return dtype == tg::DType::Float32 ? double(float(v)) : v; };
  // Empty, every tail (n % 4), sizes past the CPU loops' parallel grain; shapes of any rank are their elements in order.
  const std::vector<tg::Shape> shapes = {{0}, {2, 0}, {1}, {2}, {3}, {4}, {4097}, {5 * 16384 + 3}, {3, 5, 7}};
  for (const tg::DType dtype : {tg::DType::Float32, tg::DType::Float64})
    for (const tg::Shape& shape : shapes) {
      CAPTURE(static_cast<int>(dtype));
      CAPTURE(shape);
      const int64_t n = tg::checked_numel("test", shape);
      tg::manual_seed(11 + static_cast<uint64_t>(n));
      const tg::PhiloxState first = tg::default_generator().state(), second{first.seed, first.offset + 1};
      const tg::Tensor uniform = tg::rand(shape, {dtype}), normal = tg::randn(shape, {dtype});
      CHECK(uniform.shape() == shape);
      CHECK(normal.shape() == shape);
      CHECK(tg::default_generator().state().offset == first.offset + 2);  // one draw per tensor
      const std::vector<double> u = uniform.to_vector(), z = normal.to_vector();
      int64_t wrong = 0;
      for (int64_t i = 0; i < n; ++i)
        wrong += u[size_t(i)] != as(dtype, tg::philox_uniform(first, i)) ||
                 z[size_t(i)] != as(dtype, tg::philox_normal(second, i));
      CHECK(wrong == 0);
    }
}

TEST_CASE("rng/rand and randn known values: a seed draws what it drew before (checkpoints replay)") {
  tg::manual_seed(2024);
  const std::vector<double> z = tg::randn({5}, {tg::DType::Float64}).to_vector();
  const std::vector<double> u = tg::rand({5}, {tg::DType::Float64}).to_vector();
  const std::vector<double> z32 = tg::randn({3}).to_vector();
  const std::vector<double> want_z = {-0.11691734762447252, 0.1524376053415184, -1.3398119607365018,
                                      -0.4522431877553556, 1.0015566952187838};
  const std::vector<double> want_u = {0.29755765199661255, 0.63148671388626099, 0.44886332750320435,
                                      0.18112856149673462, 0.29758822917938232};
  const std::vector<float> want_z32 = {-0.59449029f, -1.49234509f, 0.979631424f};
  for (size_t i = 0; i < 5; ++i) {
    CHECK(z[i] == doctest::Approx(want_z[i]).epsilon(1e-14));  // libm's log and cos: to their last bits
    CHECK(u[i] == want_u[i]);                                 // uniforms are exact
  }
  for (size_t i = 0; i < 3; ++i) CHECK(float(z32[i]) == want_z32[i]);
}

TEST_CASE("rng/dropout_keep_threshold: the integer compare keeps exactly what the uniform compare keeps") {
  std::vector<float> ps = {0.f, 1e-30f, 1.f / 65536.f, 1.5f / 65536.f, 0.1f, 1.f / 3.f, 0.5f, 0.9f,
                           1.f - 1.f / 65536.f};
  tg::Philox4 state{{1, 2, 3, 4}};
  for (int i = 0; i < 64; ++i) {  // and random p's from the generator's own bits
    state = tg::philox4x32_10(state, 7, 11);
    ps.push_back(tg::bits_to_uniform(state.v[0]));
  }
  int checked = 0, kept = 0;
  for (const float p : ps) {
    const uint32_t t = tg::dropout_keep_threshold(p);
    std::vector<uint32_t> draws = {0u, 1u, 0xffffu, t, t - 1, t + 1};
    for (int i = 0; i < 32; ++i) draws.push_back(tg::philox4x32_10({{uint32_t(i), 9, 9, 9}}, 5, 6).v[i % 4] >> 16);
    for (const uint32_t n : draws) {
      if (n > 0xffffu) continue;  // t - 1 for t = 0
      const bool by_uniform = static_cast<double>(n) / 65536.0 >= p;
      CHECK_MESSAGE((n >= t) == by_uniform, "p ", p, " draw ", n, " threshold ", t);
      ++checked, kept += by_uniform;
    }
  }
  CHECK(checked > 1000);
  CHECK(kept > 0);
  CHECK(kept < checked);
  // Past 1 - 2^-16 the threshold stays at the largest 16-bit one: only the draw 0xffff is kept.
  const float near_one = std::nextafter(1.f, 0.f);
  CHECK(tg::dropout_keep_threshold(near_one) == 0xffffu);
}

TEST_CASE("rng/dropout_keep_pair: one lane's two draws against the threshold in its high half") {
  std::vector<uint32_t> thresholds = {0u, 1u, 6554u, 0x8000u, 0xfffeu, 0xffffu};
  std::vector<uint32_t> lanes = {0u, 0xffffffffu, 0x0000ffffu, 0xffff0000u};
  for (uint32_t t : thresholds) lanes.insert(lanes.end(), {t, t << 16, (t << 16) | t, ((t - 1) << 16) | (t + 1)});
  for (int i = 0; i < 64; ++i) lanes.push_back(tg::philox4x32_10({{uint32_t(i), 3, 3, 3}}, 1, 2).v[i % 4]);
  int even_kept = 0, odd_kept = 0;
  for (const uint32_t t : thresholds)
    for (const uint32_t w : lanes) {
      const tg::KeepPair k = tg::dropout_keep_pair(w, t << 16);
      CHECK_MESSAGE(k.even == ((w & 0xffffu) >= t), "lane ", w, " threshold ", t);
      CHECK_MESSAGE(k.odd == ((w >> 16) >= t), "lane ", w, " threshold ", t);
      even_kept += k.even, odd_kept += k.odd;
    }
  CHECK(even_kept > 0);
  CHECK(odd_kept > 0);
  // And the draw of column c is the half of lane (c % 8) / 2 that dropout_keep_pair reads for it.
  const tg::Philox4 block = tg::philox4x32_10({{5, 6, 7, 8}}, 9, 10);
  for (int c = 0; c < 8; ++c) {
    const uint32_t lane = block.v[c / 2];
    CHECK(tg::dropout_draw(block, c) == (c % 2 ? lane >> 16 : lane & 0xffffu));
  }
}

TEST_CASE("rng/seeded draws: the known-answer block gives the first uniforms") {
  tg::manual_seed(0);
  const std::vector<double> u = tg::rand({4}).to_vector();
  tg::manual_seed(0);
  CHECK(tg::rand({4}).to_vector() == u);  // same seed, same draw
  CHECK(tg::rand({4}).to_vector() != u);  // the offset advanced
  // Seed 0, offset 0: Philox block 0 is the Random123 known answer for a zero
  // counter and key; uniform i is the top 24 bits of its lane i over 2^24.
  const uint32_t kat[4] = {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u};
  for (int i = 0; i < 4; ++i) CHECK(u[i] == static_cast<double>(kat[i] >> 8) / 16777216.0);
  // Normals by Box-Muller from lanes (0, 1): sqrt(-2 ln u1) cos(2 pi u2), u1 in (0, 1].
  tg::manual_seed(0);
  const double n0 = tg::randn({1}, {tg::DType::Float64}).item();
  const double u1 = (kat[0] + 1.0) / 4294967296.0, u2 = kat[1] / 4294967296.0;
  CHECK(n0 == doctest::Approx(std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2)).epsilon(1e-15));
}

TEST_CASE("rng/dropout masks are reproducible and have the right rate") {
  const tg::PhiloxState s{7, 3};
  const tg::Tensor m1 = tg::dropout_mask({1000, 100}, 0.1, s);
  const tg::Tensor m2 = tg::dropout_mask({1000, 100}, 0.1, s);
  CHECK(m1.to_vector() == m2.to_vector());
  const double kept = tg::mean(m1).item();
  CHECK(kept == doctest::Approx(0.9).epsilon(0.01));
}
