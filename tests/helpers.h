// Small helpers shared by the doctest suites.
#pragma once
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "tapegrad.h"

namespace tgtest {

// A file's whole contents (the test fails if it cannot be opened).
inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.is_open());
  return {std::istreambuf_iterator<char>(in), {}};
}

inline tg::Tensor randn64(const tg::Shape& shape, bool requires_grad = true) {
  return tg::randn(shape, {tg::DType::Float64}).requires_grad_(requires_grad);
}

// Uniform in [lo, hi): for inputs that must stay away from a kink or a pole.
inline tg::Tensor uniform64(const tg::Shape& shape, double lo, double hi, bool requires_grad = true) {
  tg::Tensor u = tg::rand(shape, {tg::DType::Float64});
  return tg::add(tg::mul(u, hi - lo), lo).requires_grad_(requires_grad);
}

// max |a - b| over elements; a NaN on either side makes it infinite (so it
// fails any bound) unless `nan_equal`, when NaN against NaN counts as equal.
// Equal infinities count as equal.
inline double max_abs_diff(const tg::Tensor& a, const tg::Tensor& b, bool nan_equal = false) {
  REQUIRE(a.shape() == b.shape());
  const auto va = a.to_vector(), vb = b.to_vector();
  double m = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    const bool na = std::isnan(va[i]), nb = std::isnan(vb[i]);
    if (na || nb) {
      if (!(nan_equal && na && nb)) return INFINITY;
      continue;
    }
    if (va[i] == vb[i]) continue;  // equal infinities
    m = std::max(m, std::abs(va[i] - vb[i]));
  }
  return m;
}

// Per element of t (on any device), whether it is finite.
inline std::vector<bool> finite_pattern(const tg::Tensor& t) {
  std::vector<bool> finite;
  for (double v : t.cpu().to_vector()) finite.push_back(std::isfinite(v));
  return finite;
}

// max |x| over elements.
inline double max_abs(const tg::Tensor& t) {
  double m = 0;
  for (double v : t.to_vector()) m = std::max(m, std::abs(v));
  return m;
}

inline void expect_gradcheck(const tg::GradcheckFn& fn, const std::vector<tg::Tensor>& inputs) {
  const tg::GradcheckResult r = tg::gradcheck(fn, inputs);
  INFO("worst element: " << r.report);
  CHECK(r.elements_checked > 0);
  CHECK(r.ok);
}

// The message of the tg::Error that f throws ("" when it throws none).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const tg::Error& e) {
    return e.what();
  }
  return "";
}

// The keys of a state_dict, in order.
inline std::vector<std::string> keys_of(const tg::StateDict& dict) {
  std::vector<std::string> keys;
  for (const auto& entry : dict) keys.push_back(entry.first);
  return keys;
}

// A file name in a folder of this process's own, removed with its contents at exit.
inline std::string temp_path(const std::string& name) {
  static const struct Folder {
    std::filesystem::path path = std::filesystem::temp_directory_path() / ("tg_tests_" + std::to_string(::getpid()));
    Folder() { std::filesystem::create_directories(path); }
    ~Folder() { std::filesystem::remove_all(path); }
  } folder;
  return (folder.path / name).string();
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The fused attention layer with B = 0 or S = 0 on `device`, at both
// precisions: the output's shape, and zero gradients of the right shapes.
inline void check_empty_fused_attention(tg::Device device) {
  const int64_t C = 128, H = 2;
  const auto to = [&](const tg::Tensor& t) { return t.to(device); };
  for (const auto& [B, S] : std::vector<std::pair<int64_t, int64_t>>{{0, 5}, {2, 0}}) {
    CAPTURE(B);
    CAPTURE(S);
    tg::RegionAttentionParams params = tg::RegionAttentionParams::init({C, H, 8});
    const std::vector<tg::Tensor*> trained = {&params.qkv_weight, &params.edit_region_bias, &params.within_edit_bias};
    for (tg::Tensor* t : {&params.qkv_weight, &params.qkv_bias, &params.out_weight, &params.out_bias,
                          &params.edit_region_bias, &params.within_edit_bias, &params.cross_edit_bias})
      *t = to(t->detach());
    for (tg::Tensor* t : trained) t->requires_grad_();
    const tg::Tensor x = to(tg::randn({B, S, C})).requires_grad_(), e = to(tg::ones({B, S}));
    for (const char* precision : {"high", "highest"}) {
      tg::set_float32_matmul_precision(precision);
      const tg::Tensor y = tg::region_attention(x, e, e, params, {0.1}, tg::AttentionImpl::Fused);
      CHECK(y.shape() == tg::Shape({B, S, C}));
      y.backward(to(tg::ones({B, S, C})));
      for (tg::Tensor* t : trained) {
        CHECK(t->grad().shape() == t->shape());
        CHECK(max_abs_diff(t->grad(), tg::zeros_like(*t)) == 0.0);
        t->zero_grad();
      }
    }
    tg::set_float32_matmul_precision("highest");
  }
}

}  // namespace tgtest
