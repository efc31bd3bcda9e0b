// shapes/, inplace/, numerics/: sizes that overflow, views outside their
// storage, edge shapes, in-place writes that would corrupt memory or drop a
// gradient, and the numeric rules (NaN propagation, 0/1 masks, dtypes).
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "helpers.h"
#include "ops/binary_mask.h"
#include "ops/untracked.h"

using namespace tgtest;

namespace {
constexpr int64_t kBig = int64_t(1) << 40;
const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();
}  // namespace

// ---- shapes

TEST_CASE("shapes/element and byte counts that overflow int64 are errors") {
  CHECK(error_of([] { tg::zeros({kBig, kBig}); }) == "full: shape [1099511627776,1099511627776] has more elements than int64 can count");
  CHECK(error_of([] { tg::zeros({int64_t(1) << 31, int64_t(1) << 31}); }) ==
        "full: shape [2147483648,2147483648] needs more bytes than int64 can count");
  CHECK(contains(error_of([] { tg::zeros({0}).view({int64_t(1) << 62, 4}); }), "view: shape [4611686018427387904,4] has more elements"));
  CHECK(contains(error_of([] { tg::empty({3, -2}); }), "empty: negative dimension in shape [3,-2]"));
}

TEST_CASE("shapes/an allocation that cannot be satisfied is a tg::Error naming the bytes and shape") {
  const std::string msg = error_of([] { tg::zeros({int64_t(1) << 45}); });
  CHECK(contains(msg, "full: cannot allocate 140737488355328 bytes for [35184372088832] on cpu"));
}

TEST_CASE("shapes/negative sizes in factories are tg::Errors") {
  CHECK(error_of([] { tg::arange(-5); }) == "arange: the number of elements must be >= 0, got -5");
  CHECK(error_of([] { tg::randn({-1, 2}); }) == "randn: negative dimension in shape [-1,2]");
  CHECK(error_of([] { tg::rand({2, -1}); }) == "rand: negative dimension in shape [2,-1]");
}

TEST_CASE("shapes/narrow and expand ranges are checked without overflow") {
  const tg::Tensor x = tg::zeros({2, 3});
  CHECK(contains(error_of([&] { x.narrow(1, 1, INT64_MAX); }), "narrow: range [1, 1 + 9223372036854775807) is out of bounds for dim 1"));
  CHECK(contains(error_of([&] { x.narrow(1, -1, 1); }), "is out of bounds for dim 1 of shape [2,3]"));
  CHECK(contains(error_of([] { tg::zeros({}).expand({-1}); }), "expand: -1 at dim 0 of [-1] names no dim of x []"));
  CHECK(tg::zeros({3, 1}).expand({2, -1, 4}).shape() == tg::Shape{2, 3, 4});  // -1 keeps a dim, as in PyTorch
  CHECK(contains(error_of([] { tg::zeros({1}).expand({-2}); }), "expand: negative dimension in shape [-2]"));
}

TEST_CASE("shapes/make_view outside its storage is an error") {
  const tg::Tensor t = tg::zeros({2, 3});
  CHECK(contains(error_of([&] { tg::make_view(t, {2, 3}, {3, 1}, 1); }), "reach element 6 of a storage of 6 elements"));
  CHECK(contains(error_of([&] { tg::make_view(t, {7}, {1}, 0); }), "reach element 6 of a storage of 6 elements"));
  CHECK(contains(error_of([&] { tg::make_view(t, {2}, {-1}, 1); }), "has a negative size or stride"));
  CHECK(contains(error_of([&] { tg::make_view(t, {2}, {1, 1}, 0); }), "differ in rank"));
  CHECK(contains(error_of([&] { tg::make_view(t, {kBig, kBig}, {kBig, kBig}, 0); }), "overflows int64 offsets"));
  CHECK(tg::make_view(t, {0, 5}, {100, 100}, 6).numel() == 0);  // an empty view reads nothing
  CHECK(tg::make_view(t, {3}, {2}, 1).to_vector() == std::vector<double>{0, 0, 0});
}

TEST_CASE("shapes/materialize_aligned copies a contiguous view that starts off a 16-byte boundary") {
  const tg::Tensor base = tg::randn({9});
  const tg::Tensor off = base.narrow(0, 1, 8);  // contiguous, 4 bytes past an aligned start
  REQUIRE(off.is_contiguous());
  const tg::Tensor copied = tg::materialize_aligned(off);
  CHECK(copied.raw_data() != off.raw_data());
  CHECK(reinterpret_cast<uintptr_t>(copied.raw_data()) % 16 == 0);
  CHECK(copied.to_vector() == off.to_vector());
  CHECK(tg::materialize_aligned(base).raw_data() == base.raw_data());  // aligned and contiguous: itself
}

TEST_CASE("shapes/linear on a 0-d input, and with zero in_features") {
  CHECK(error_of([] { tg::linear(tg::scalar_tensor(1), tg::zeros({4, 1})); }) ==
        "linear: x must have at least one dim [..., in], got []");
  const tg::Tensor y = tg::linear(tg::ones({5, 0}), tg::ones({3, 0}), tg::from_vector({1, 2, 3}, {3}));
  CHECK(y.shape() == tg::Shape{5, 3});
  CHECK(y.at({4, 2}) == 3);  // the bias rows: an empty sum adds nothing
  CHECK(tg::linear(tg::ones({2, 0}), tg::ones({3, 0})).to_vector() == std::vector<double>(6, 0.0));
}

TEST_CASE("shapes/sum_to names itself when the target does not broadcast") {
  CHECK(error_of([] { tg::sum_to(tg::zeros({2, 1}), {2, 3}); }) ==
        "sum_to: cannot sum shape [2,1] to [2,3] ([2,3] must broadcast to [2,1])");
  CHECK(contains(error_of([] { tg::sum_to(tg::zeros({3}), {2, 3}); }), "sum_to: cannot sum shape [3] to [2,3]"));
}

// ---- in-place writes

TEST_CASE("inplace/a source that requires grad is refused while grad mode is on") {
  tg::Tensor x = tg::zeros({3});
  const tg::Tensor w = tg::ones({3}).requires_grad_();
  CHECK(contains(error_of([&] { x.add_(w); }), "add_: the source tensor of shape [3] requires grad"));
  CHECK(contains(error_of([&] { x.copy_(w); }), "copy_: the source tensor of shape [3] requires grad"));
  tg::NoGradGuard no_grad;
  x.add_(w, 2.0);
  CHECK(x.to_vector() == std::vector<double>{2, 2, 2});
}

TEST_CASE("inplace/overlapping source and destination copy correctly") {
  tg::Tensor a = tg::arange(5, {tg::DType::Float64});
  a.narrow(0, 1, 3).copy_(a.narrow(0, 0, 3));  // shift right by one
  CHECK(a.to_vector() == std::vector<double>{0, 0, 1, 2, 4});
  tg::Tensor b = tg::arange(5, {tg::DType::Float64});
  b.narrow(0, 0, 3).copy_(b.narrow(0, 1, 3));  // shift left by one
  CHECK(b.to_vector() == std::vector<double>{1, 2, 3, 3, 4});
  tg::Tensor m = tg::arange(9, {tg::DType::Float64}).view({3, 3});
  m.copy_(m.transpose(0, 1));
  CHECK(m.to_vector() == std::vector<double>{0, 3, 6, 1, 4, 7, 2, 5, 8});
}

TEST_CASE("inplace/writes into an expanded tensor are refused") {
  tg::Tensor e = tg::zeros({1, 3}).expand({4, 3});
  CHECK(contains(error_of([&] { e.fill_(1.0); }), "fill_: cannot write into a tensor of shape [4,3] with strides [0,1]"));
  CHECK(contains(error_of([&] { e.copy_(tg::ones({4, 3})); }), "several of its elements share one memory location"));
  CHECK(contains(error_of([&] { e.add_(tg::ones({4, 3})); }), "add_: cannot write into"));
  CHECK(contains(error_of([&] { e.mul_(2.0); }), "mul_: cannot write into"));
}

// ---- numerics

TEST_CASE("numerics/softmax propagates NaN; only an all -inf row gives zeros") {
  const tg::Tensor x = tg::from_vector({1, kNaN, 2, kNaN, -kInf, -kInf, -kInf, -kInf, -kInf, 0, -kInf, 1}, {4, 3},
                                       {tg::DType::Float64});
  const std::vector<double> y = tg::softmax(x).to_vector();
  for (int j = 0; j < 3; ++j) CHECK(std::isnan(y[j]));      // NaN with finite values
  for (int j = 3; j < 6; ++j) CHECK(std::isnan(y[j]));      // NaN with -inf: not a masked row
  for (int j = 6; j < 9; ++j) CHECK(y[j] == 0.0);           // every key masked
  CHECK(y[11] == doctest::Approx(std::exp(1.0) / (1 + std::exp(1.0))).epsilon(1e-15));
}

TEST_CASE("numerics/masks must hold only 0 and 1") {
  auto p = tg::RegionAttentionParams::init({8, 2, 4});
  const tg::Tensor x = tg::zeros({1, 3, 8}), e = tg::zeros({1, 3}), a = tg::ones({1, 3});
  CHECK(error_of([&] { tg::region_attention_decomposed(x, e, tg::from_vector({1, 2, 1}, {1, 3}), p); }) ==
        "region_attention: attn_mask [1,3] must hold only 0 and 1; element 1 is 2");
  CHECK(error_of([&] { tg::region_attention_decomposed(x, tg::from_vector({0, 0.5, 1}, {1, 3}), a, p); }) ==
        "edit_bias: edit_mask [1,3] must hold only 0 and 1; element 1 is 0.5");
  CHECK(contains(error_of([&] { tg::region_attention_decomposed(x, tg::from_vector({0, kNaN, 1}, {1, 3}), a, p); }),
                 "element 1 is nan"));
  CHECK(error_of([] { tg::dropout(tg::ones({2, 2}), {0.5, std::nullopt, tg::from_vector({1, 0, 3, 1}, {2, 2})}); }) ==
        "dropout: mask [2,2] must hold only 0 and 1; element 2 is 3");
  CHECK(tg::region_attention_decomposed(x, e, a, p).shape() == tg::Shape{1, 3, 8});  // 0/1 masks pass
  // Several masks in one check: the first bad one named, whichever place it has.
  const tg::Tensor bad = tg::from_vector({0, 1, 2, 0.5}, {2, 2});
  CHECK(error_of([&] { tg::check_binary_masks("op", {{"a", a}, {"b", bad}, {"c", e}}); }) ==
        "op: b [2,2] must hold only 0 and 1; element 2 is 2");
  CHECK(error_of([&] { tg::check_binary_masks("op", {{"b", bad.transpose(0, 1)}, {"a", a}}); }) ==
        "op: b [2,2] must hold only 0 and 1; element 1 is 2");
  CHECK(error_of([&] { tg::check_binary_masks("op", {{"a", a}, {"e", e}}); }).empty());
}

// Only CUDA masks found binary are remembered (ops/binary_mask.h): a CPU mask refilled through data<T>() is
// counted again at every check.
TEST_CASE("numerics/a CPU mask is counted at every check") {
  const tg::Tensor m = tg::from_vector({0, 1, 1, 0}, {2, 2});
  const auto check = [](const tg::Tensor& t) { return error_of([&] { tg::check_binary_mask("op", "m", t); }); };
  CHECK(check(m).empty());
  m.data<float>()[1] = 2;
  CHECK(check(m) == "op: m [2,2] must hold only 0 and 1; element 1 is 2");
}

TEST_CASE("numerics/an unknown dtype is a clear error, not float64") {
  const auto bogus = static_cast<tg::DType>(7);
  CHECK(error_of([&] { tg::element_size(bogus); }) == "element_size: unknown dtype (enumerator 7)");
  CHECK(error_of([&] { tg::dtype_name(bogus); }) == "dtype_name: unknown dtype (enumerator 7)");
  CHECK(error_of([&] { TG_DISPATCH_FLOAT(bogus, T, [] { return sizeof(T); }); }) ==
        "TG_DISPATCH_FLOAT: unknown dtype (enumerator 7)");
}

TEST_CASE("shapes/zero-size dims broadcast only against 1; huge aranges; rank-9 contiguous factories") {
  CHECK(contains(error_of([] { tg::add(tg::zeros({0}), tg::ones({3})); }), "add: shapes [0] and [3] cannot be broadcast"));
  CHECK(tg::add(tg::zeros({0}), tg::ones({1})).shape() == tg::Shape{0});
  CHECK(contains(error_of([] { tg::arange(int64_t(1) << 61); }), "arange: shape [2305843009213693952] needs more bytes than int64 can count"));
  CHECK(contains(error_of([] { tg::arange(int64_t(1) << 58); }), "arange: cannot allocate"));
  const tg::Tensor nine = tg::ones({1, 1, 1, 1, 1, 1, 1, 1, 2});
  CHECK(nine.to_vector() == std::vector<double>{1, 1});
}

TEST_CASE("shapes/error texts name the op that was called") {
  tg::Tensor x = tg::zeros({3});
  CHECK(error_of([&] { x.add_(tg::ones({2, 3})); }) == "add_: other [2,3] does not broadcast to this tensor's shape [3]");
  CHECK(error_of([&] { x.add_(tg::Tensor()); }) == "add_: argument 'other' is an undefined tensor");
  CHECK(error_of([] { tg::mean(tg::zeros({2, 3}), {0, 0}); }) == "mean: dim 0 repeats in the dims of a tensor of shape [2,3]");
  tg::RegionAttentionParams p = tg::RegionAttentionParams::init({8, 2, 4});
  p.out_weight = tg::Tensor();
  CHECK(error_of([&] { tg::region_attention(tg::zeros({1, 3, 8}), tg::zeros({1, 3}), tg::ones({1, 3}), p); }) ==
        "region_attention: argument 'out_weight' is an undefined tensor");
}

TEST_CASE("inplace/expanded by two, and overlapping by exactly one element, also across from_blob views") {
  tg::Tensor e = tg::zeros({1, 3}).expand({2, 3});
  CHECK(contains(error_of([&] { e.fill_(1.0); }), "several of its elements share one memory location"));
  tg::Tensor a = tg::arange(5, {tg::DType::Float64});
  a.narrow(0, 2, 3).copy_(a.narrow(0, 0, 3));  // element 2 is read and written
  CHECK(a.to_vector() == std::vector<double>{0, 1, 0, 1, 2});
  std::vector<float> buffer = {0, 1, 2, 3, 4};
  const tg::Tensor head = tg::from_blob(buffer.data(), {4}), tail = tg::from_blob(buffer.data() + 1, {4});
  tg::Tensor(tail).copy_(head);  // two Storage objects over one buffer
  CHECK(buffer == std::vector<float>{0, 0, 1, 2, 3});
}

TEST_CASE("numerics/+inf in a softmax row gives NaN; relu lets NaN through; dropout checks an explicit mask at p = 0") {
  const std::vector<double> y = tg::softmax(tg::from_vector({1, kInf, 2}, {1, 3}, {tg::DType::Float64})).to_vector();
  for (double v : y) CHECK(std::isnan(v));
  CHECK(std::isnan(tg::relu(tg::from_vector({kNaN}, {1}, {tg::DType::Float64})).item()));
  CHECK(error_of([] { tg::dropout(tg::ones({2}), {0.0, std::nullopt, tg::from_vector({1, 7}, {2})}); }) ==
        "dropout: mask [2] must hold only 0 and 1; element 1 is 7");
}

// ---- sources

namespace {
// text without its // and /* */ comments (string literals in kernel sources hold neither).
std::string without_comments(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text.compare(i, 2, "//") == 0) {
      i = text.find('\n', i);
      if (i == std::string::npos) break;
    } else if (text.compare(i, 2, "/*") == 0) {
      i = text.find("*/", i);
      if (i == std::string::npos) break;
      ++i;
      continue;
    }
    out += text[i];
  }
  return out;
}

// The __global__ functions `text` defines (declarations without a body are
// skipped), the declarations, up to the body, of those whose body does
// not begin with after_previous_kernels(), and the <<< launches in its code.
struct KernelScan {
  int kernels = 0;
  std::vector<std::string> not_waiting;
  int chevron_launches = 0;
};
KernelScan scan_kernels(const std::string& text) {
  const std::string code = without_comments(text);
  KernelScan scan;
  for (size_t at = code.find("<<<"); at != std::string::npos; at = code.find("<<<", at + 3)) ++scan.chevron_launches;
  for (size_t at = code.find("__global__"); at != std::string::npos; at = code.find("__global__", at + 1)) {
    const size_t body = code.find_first_of("{;", at);
    if (body == std::string::npos || code[body] == ';') continue;
    ++scan.kernels;
    const std::string start = code.substr(code.find_first_not_of(" \t\r\n", body + 1), 40);
    if (start.rfind("after_previous_kernels();", 0) != 0 && start.rfind("cuda::after_previous_kernels();", 0) != 0)
      scan.not_waiting.push_back(code.substr(at, body - at));
  }
  return scan;
}
}  // namespace

// core/cuda_launch.cuh: a kernel launched so that it overlaps the kernel
// before it must wait for that kernel, in every thread, before anything
// else. Every kernel of the library (every file under ops/ and core/) does,
// and every launch there goes through launch() (no <<<...>>> in code). The
// check reads the sources (comments dropped; a macro that defines or
// launches a kernel, or a wait inside #if, would fool it: there are none);
// it is checked itself on a kernel that waits (with a declaration before
// it), one that may return first, and a launch.
TEST_CASE("sources/every library kernel waits for the kernels before it") {
  const KernelScan good = scan_kernels(
      "template <class T>\n__global__ void k(T* x);\n__global__ void k(T* x) {\n  // first\n"
      "  after_previous_kernels();\n  x[0] = 1;\n}\n");
  CHECK(good.kernels == 1);
  CHECK(good.not_waiting.empty());
  const KernelScan bad = scan_kernels(
      "__global__ void __launch_bounds__(128, 2) k(float* x) {\n  if (x) return;\n  after_previous_kernels();\n}\n");
  CHECK(bad.kernels == 1);
  CHECK(bad.not_waiting.size() == 1);
  CHECK(bad.chevron_launches == 0);
  CHECK(scan_kernels("// k<<<1, 32>>>(x);\nvoid f(float* x) { k<<<1, 32>>>(x); }\n").chevron_launches == 1);
  for (const char* folder : {"ops", "core"}) {
    int kernels = 0;
    for (const auto& entry :
         std::filesystem::recursive_directory_iterator(std::filesystem::path(TG_SOURCE_DIR) / folder)) {
      if (!entry.is_regular_file()) continue;
      const KernelScan scan = scan_kernels(read_bytes(entry.path().string()));
      kernels += scan.kernels;
      for (const std::string& kernel : scan.not_waiting)
        FAIL_CHECK(entry.path().string() << ": a kernel that does not wait first: " << kernel);
      if (scan.chevron_launches > 0)
        FAIL_CHECK(entry.path().string() << ": " << scan.chevron_launches << " launch(es) with <<<...>>>, not launch()");
    }
    CAPTURE(folder);
    CHECK(kernels > 0);  // the sources were found
  }
}
