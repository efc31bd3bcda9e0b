// fused/ on CUDA: the fused op against the decomposed graph. The benchmark
// interface at benchmark sizes under the benchmark's tolerance rule ("high")
// and against a float64 reference ("highest"); edge shapes and masks; the
// training path through the tape; the C API, its errors, streams and graph
// capture. Every device allocation is poisoned with NaN (tests/main_cuda.cpp).
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "attention_problem.h"
#include "cuda_helpers.h"
#include "capi/c_api_internal.h"
#include "ops/fused_attention_kernels.h"
#include "include/tapegrad/c_api.h"

using namespace tgtest;

namespace {

using tg::fused::BackwardInputs;
using tg::fused::Gradients;
using tg::fused::kOutputNames;

// The benchmark's rule: |out - ref| <= atol + 1e-5 |ref| for >= 99% of the elements, no NaN/Inf.
void check_benchmark_rule(const Gradients& got, const Gradients& ref, double atol) {
  const auto g = outputs_of(got), r = outputs_of(ref);
  for (size_t i = 0; i < g.size(); ++i) {
    CAPTURE(std::string(kOutputNames[i]));
    const std::vector<double> gv = g[i].to_vector(), rv = r[i].to_vector();
    REQUIRE(gv.size() == rv.size());
    size_t pass = 0;
    bool finite = true;
    for (size_t k = 0; k < gv.size(); ++k) {
      finite = finite && std::isfinite(gv[k]);
      pass += std::abs(gv[k] - rv[k]) <= atol + 1e-5 * std::abs(rv[k]);
    }
    CHECK(finite);
    CHECK(static_cast<double>(pass) >= 0.99 * static_cast<double>(gv.size()));
  }
}

// max |a - b| / max |b|.
double relative_error(const tg::Tensor& a, const tg::Tensor& b) {
  const std::vector<double> av = a.to_vector(), bv = b.to_vector();
  double err = 0, scale = 0;
  for (size_t k = 0; k < av.size(); ++k) {
    if (!std::isfinite(av[k])) return INFINITY;
    err = std::max(err, std::abs(av[k] - bv[k]));
    scale = std::max(scale, std::abs(bv[k]));
  }
  return scale > 0 ? err / scale : err;
}

// sum |x| over elements.
double sum_abs(const tg::Tensor& t) {
  double s = 0;
  for (const double v : t.to_vector()) s += std::abs(v);
  return s;
}

// sum |a - b| / sum |b|: the typical error, where relative_error takes the worst.
double mean_relative_error(const tg::Tensor& a, const tg::Tensor& b) {
  const std::vector<double> av = a.to_vector(), bv = b.to_vector();
  double err = 0, size = 0;
  for (size_t k = 0; k < av.size(); ++k) err += std::abs(av[k] - bv[k]), size += std::abs(bv[k]);
  return size > 0 ? err / size : err;
}

// "highest": each output within 10x of the fp32 graph's own error against float64.
void check_near_fp32(const Gradients& highest, const Gradients& ref32, const Gradients& ref64) {
  const auto h3 = outputs_of(highest), r32 = outputs_of(ref32), r64 = outputs_of(ref64);
  double largest = 0;
  for (const tg::Tensor& r : r64) largest = std::max(largest, max_abs(r));
  for (size_t i = 0; i < h3.size(); ++i) {
    CAPTURE(std::string(kOutputNames[i]));
    const double fused = relative_error(h3[i], r64[i]), fp32 = relative_error(r32[i], r64[i]);
    const double magnitude = max_abs(r64[i]);
    CAPTURE(fused);
    CAPTURE(fp32);
    CAPTURE(magnitude);
    CAPTURE(largest);
    if (magnitude > 1e-6 * largest) {
      CHECK(fused <= 10 * fp32 + 1e-7);
    } else {  // zero up to rounding (a sum of dS, whose rows sum to 0): judged against the problem's scale
      CHECK(fused * magnitude <= 1e-6 * largest);
    }
  }
}

// The gradients at `precision` from each backward kernel this device runs:
// on compute capability 9.0 the warpgroup-MMA kernel (the default there) and
// the mma.sync one (enable_warpgroup_attention(false)); elsewhere the
// mma.sync one alone.
std::vector<std::pair<std::string, Gradients>> by_kernel(const std::function<Gradients()>& run) {
  std::vector<std::pair<std::string, Gradients>> out;
  if (tgtest::on_sm90()) out.emplace_back("warpgroup", run());
  const MmaSyncAttention mma_sync;
  out.emplace_back("mma.sync", run());
  return out;
}
std::vector<std::pair<std::string, Gradients>> by_kernel(const BackwardInputs& in, double scale, double p,
                                                         tg::MatmulPrecision precision) {
  return by_kernel([&] { return tg::fused::region_attention_backward(in, scale, p, precision); });
}

void check_case(const Spec& s, double atol, const BackwardInputs& in) {
  const double scale = 1 / std::sqrt(double(s.C / s.H));
  const std::vector<tg::Tensor> before = inputs_of(in);
  std::vector<tg::Tensor> copies;
  for (const tg::Tensor& t : before) copies.push_back(t.clone());
  const auto high = by_kernel(in, scale, s.p, tg::MatmulPrecision::High);
  const auto highest = by_kernel(in, scale, s.p, tg::MatmulPrecision::Highest);
  for (size_t i = 0; i < before.size(); ++i) CHECK(max_abs_diff(before[i], copies[i]) == 0.0);  // inputs untouched
  const Gradients ref32 = reference_backward(in, scale, s.p, tg::DType::Float32);
  for (const auto& [kernel, grads] : high) {
    CAPTURE(kernel);
    check_benchmark_rule(grads, ref32, atol);
  }
  const Gradients ref64 = reference_backward(in, scale, s.p, tg::DType::Float64);
  for (const auto& [kernel, grads] : highest) {
    CAPTURE(kernel);
    check_near_fp32(grads, ref32, ref64);
  }
}

}  // namespace

TEST_CASE("fused/benchmark interface at benchmark sizes: high under the benchmark rule, highest near fp32" *
          doctest::skip(kNoGpu)) {
  tg::manual_seed(101);
  for (const auto& [S, B, atol] : std::vector<std::tuple<int64_t, int64_t, double>>{
           {1024, 1, 0.026}, {773, 32, 0.14}, {128, 64, 0.089}, {293, 32, 0.092}, {373, 1, 0.019},
           // Not a benchmark case (atol near 176/16's, B S = 2816): 640 key-tile CTAs, one split at
           // either precision. Split query tiles: 1024/1 (3 CTAs per key tile at "high": 6, 5 and 5
           // tiles) and 373/1 (3 at "high", 2 at "highest"; backward_grid on an H200).
           {128, 20, 0.06}}) {
    CAPTURE(S);
    CAPTURE(B);
    const Spec s{B, S};
    check_case(s, atol, make_backward_inputs(s));
  }
}

TEST_CASE("fused/benchmark interface: edge shapes and masks" * doctest::skip(kNoGpu)) {
  tg::manual_seed(102);
  for (int64_t S : {1, 2, 77, 130}) {
    for (double p : {0.0, 0.1}) {
      CAPTURE(S);
      CAPTURE(p);
      const Spec s{3, S, 128, 2, 150, p};
      tg::Tensor attn = tg::dropout_mask({3, S}, 0.3, {4, uint64_t(S)});
      attn.narrow(0, 0, 1).fill_(0.0);  // batch 0: every key masked
      check_case(s, 0.05, make_backward_inputs(s, {}, attn));
      check_case(s, 0.05, make_backward_inputs(s, tg::ones({3, S}), {}));   // all inside
      check_case(s, 0.05, make_backward_inputs(s, tg::zeros({3, S}), {}));  // all outside
    }
  }
}

// Every input and output a contiguous view that starts 4 bytes past a
// 16-byte boundary (a slice of a larger buffer, as a caller of the C API may
// pass): the interface copies q, k, v and o, which its kernels read in
// 16-byte vectors, and reads the rest where they lie (P, Pd and E by 4-byte
// copies, the fp16 conversions and GEMMs through their unaligned paths);
// the outputs are written where they lie (dE's zeros by the fill's scalar
// path, its sums by single-float atomics), under the same rules, on each
// kernel. At S = 77, M = 150 the rows of P, Pd and dE are not whole quads
// anyway; at S = 128, M = 160 they are, so the addresses alone decide (B = 1:
// dE's corner stored, B = 2: added).
TEST_CASE("fused/benchmark interface: inputs and outputs off a 16-byte boundary" * doctest::skip(kNoGpu)) {
  tg::manual_seed(107);
  const auto off_boundary = [](const tg::Shape& shape) {  // poisoned with NaN, as every allocation here
    const int64_t n = tg::numel(shape);
    tg::Tensor view = tg::empty({n + 1}, {tg::DType::Float32, tg::Device::CUDA}).narrow(0, 1, n).view(shape);
    REQUIRE(reinterpret_cast<uintptr_t>(view.raw_data()) % 16 != 0);
    return view;
  };
  for (const Spec& s : {Spec{2, 77, 128, 2, 150, 0.1}, Spec{2, 128, 128, 2, 160, 0.1}, Spec{1, 128, 128, 2, 160, 0.1}}) {
    CAPTURE(s.B);
    CAPTURE(s.S);
    BackwardInputs in = make_backward_inputs(s);
    for (tg::Tensor* t : {&in.grad_output, &in.hidden_states, &in.edit_region_mask, &in.qkv_weight, &in.qkv_bias,
                          &in.out_weight, &in.out_bias, &in.edit_region_bias, &in.within_edit_bias,
                          &in.cross_edit_bias, &in.attention_mask, &in.query, &in.key, &in.value,
                          &in.attention_scores, &in.attention_probs, &in.attention_probs_dropped,
                          &in.attention_output, &in.dropout_mask})
      *t = off_boundary(t->shape()).copy_(*t);
    check_case(s, 0.05, in);

    const double scale = 1 / std::sqrt(double(s.C / s.H));
    const auto into_off_boundary = [&](tg::MatmulPrecision precision) {
      return by_kernel([&] {
        Gradients out;  // each gradient has the shape of what it is the gradient of
        for (auto [to, of] :
             {std::pair{&out.hidden_states, &in.hidden_states}, {&out.qkv_weight, &in.qkv_weight},
              {&out.qkv_bias, &in.qkv_bias}, {&out.out_weight, &in.out_weight}, {&out.out_bias, &in.out_bias},
              {&out.edit_region_bias, &in.edit_region_bias}, {&out.within_edit_bias, &in.within_edit_bias},
              {&out.cross_edit_bias, &in.cross_edit_bias}})
          *to = off_boundary(of->shape());
        tg::fused::region_attention_backward_into(in, scale, s.p, precision, out);
        return out;
      });
    };
    const Gradients ref32 = reference_backward(in, scale, s.p, tg::DType::Float32);
    const Gradients ref64 = reference_backward(in, scale, s.p, tg::DType::Float64);
    for (const auto& [kernel, grads] : into_off_boundary(tg::MatmulPrecision::High)) {
      CAPTURE(kernel);
      check_benchmark_rule(grads, ref32, 0.05);
    }
    for (const auto& [kernel, grads] : into_off_boundary(tg::MatmulPrecision::Highest)) {
      CAPTURE(kernel);
      check_near_fp32(grads, ref32, ref64);
    }
  }
}

// A key tile of v far smaller than the others, or all zeros. The backward
// scales each key tile's V by its own power of two, so such a tile's b_v
// allows a large dS scale (or, for zeros, none at all), while Delta sums over
// every key tile of the row: dS's scale is capped by Delta's bound too
// (KeyTileScales), or the fp16 dS of that tile's keys (about -P Delta)
// overflows to Inf (at 2^-30 by about 2^10, an estimate from these sizes).
// The tile of zeros checks that an infinite b_v gives finite, right
// gradients (its former scale, 1, left dS in fp16's subnormals, an error
// these rules would not see). (b, h) = (0, 0)'s whole v is 2^-20 smaller
// again, and with it its Delta: a CTA of another head or batch capped by
// (0, 0)'s Delta bound (a bound taken from the wrong rows) overflows the
// same way. attention_output = Pd v is made again from the changed v, so
// that rowsum(do o) stays equal to rowsum(P dP), the Delta
// reference_backward forms.
TEST_CASE("fused/benchmark interface: a key tile of v far smaller than the rest, or zeros" * doctest::skip(kNoGpu)) {
  tg::manual_seed(108);
  const Spec s{2, 128, 128, 2, 160, 0.1};
  for (const double factor : {0x1p-30, 0.0}) {
    CAPTURE(factor);
    BackwardInputs in = make_backward_inputs(s);
    tg::Tensor v = in.value.clone();  // [B, H, S, D]
    v.narrow(2, 64, s.S - 64).copy_(tg::mul(in.value.narrow(2, 64, s.S - 64), factor));
    v.narrow(0, 0, 1).narrow(1, 0, 1).copy_(tg::mul(v.narrow(0, 0, 1).narrow(1, 0, 1), 0x1p-20));
    in.value = v;
    in.attention_output = tg::matmul(in.attention_probs_dropped, v, tg::MatmulPrecision::Highest)
                              .permute({0, 2, 1, 3})
                              .reshape({s.B, s.S, s.C});
    check_case(s, 0.05, in);
  }
}

namespace {

// Moves `in` (128 keys, p = 0) to the worst case of Delta's bound
// (the test below): every query row puts 1 - 2^-14 of its probability on one
// key of the second key tile, whose v is 2^-30 of the first tile's (so dP ~ 0
// there and dS = P (dP - Delta) ~ -(1 - 2^-14) Delta), and 2^-20 on each key
// of the first; each (b, h)'s v is scaled so that its max |Delta| sits 2^-14
// below a power of two. do = dy Wo is exact, also in fp16 (Wo the identity,
// dy on a grid of 2^-6 in [-4, 4]), so Delta = rowsum(do o) is known here to
// fp32's rounding. attention_output = Pd v again. Returns the largest s_dS
// |dS| over the second tiles' keys, s_dS = 2^e with max |Delta| 2^e in [2^13,
// 2^14) per (b, h), as KeyTileScales caps it.
double put_at_delta_bound(BackwardInputs& in, const Spec& s) {
  const int64_t B = s.B, H = s.H, S = s.S, C = s.C, D = C / H, keys = 64;
  REQUIRE((S == 2 * keys && s.p == 0.0));
  constexpr double kRest = 0x1p-14;  // a row's probability off its dominant key
  const tg::TensorOptions f32{tg::DType::Float32, in.value.device()};
  const auto to_float = [](double x) { return double(float(x)); };
  std::vector<double> dy = in.grad_output.to_vector();  // [B, S, C]
  for (double& x : dy) x = std::clamp(std::round(64 * x), -256.0, 256.0) / 64;
  std::vector<double> identity(size_t(C * C), 0.0);
  for (int64_t c = 0; c < C; ++c) identity[size_t(c * C + c)] = 1;
  std::vector<double> P(size_t(B * H * S * S), 0.0);
  for (int64_t row = 0; row < B * H * S; ++row) {
    double* p = P.data() + row * S;
    std::fill(p, p + keys, kRest / keys);
    p[keys + row % keys] = 1 - kRest;
  }
  std::vector<double> v = in.value.to_vector(), o(size_t(B * S * C));  // [B, H, S, D], [B, S, C]
  std::vector<double> delta(static_cast<size_t>(S));
  double peak = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      double* vh = v.data() + (b * H + h) * S * D;
      const double* ph = P.data() + (b * H + h) * S * S;
      const auto at = [&](int64_t i, int64_t d) { return size_t((b * S + i) * C + h * D + d); };
      // o = P v (rounded to fp32) and Delta_i = dy_i . o_i of (b, h); returns max |Delta|
      const auto make_o = [&] {
        for (int64_t i = 0; i < S; ++i) {
          delta[i] = 0;
          for (int64_t d = 0; d < D; ++d) {
            double sum = 0;
            for (int64_t j = 0; j < S; ++j) sum += ph[i * S + j] * vh[j * D + d];
            o[at(i, d)] = to_float(sum);
            delta[i] += dy[at(i, d)] * o[at(i, d)];
          }
        }
        double largest = 0;
        for (const double x : delta) largest = std::max(largest, std::abs(x));
        return largest;
      };
      for (int64_t k = keys * D; k < S * D; ++k) vh[k] = to_float(vh[k] * 0x1p-30);
      int x = 0;
      const double before = make_o();
      std::frexp(before, &x);  // before in [2^(x-1), 2^x)
      const double factor = std::ldexp(1 - 0x1p-14, x) / before;
      for (int64_t k = 0; k < S * D; ++k) vh[k] = to_float(vh[k] * factor);
      std::frexp(make_o(), &x);
      const double s_ds = std::ldexp(1.0, 14 - x);  // max |Delta| s_ds in [2^13, 2^14)
      for (int64_t i = 0; i < S; ++i)
        for (int64_t j = keys; j < S; ++j) {
          double dp = 0;
          for (int64_t d = 0; d < D; ++d) dp += dy[at(i, d)] * vh[j * D + d];
          peak = std::max(peak, s_ds * std::abs(ph[i * S + j] * (dp - delta[i])));
        }
    }
  in.grad_output = tg::from_vector(dy, {B, S, C}, f32);
  in.out_weight = tg::from_vector(identity, {C, C}, f32);
  in.attention_probs = tg::from_vector(P, {B, H, S, S}, f32);
  in.attention_probs_dropped = in.attention_probs.clone();
  in.dropout_mask = tg::ones({B, H, S, S}, f32);
  in.value = tg::from_vector(v, {B, H, S, D}, f32);
  in.attention_output = tg::from_vector(o, {B, S, C}, f32);
  return peak;
}

}  // namespace

// Delta's bound at its worst. Where a key tile's own b_v allows a large dS
// scale, Delta's bound caps it (KeyTileScales): s_dS |dS| <= s_dS (|dP| +
// |Delta|) < 2^14 + 2^14, a margin of 2 to fp16's 65504 that consistent
// inputs use only where dS ~ -Delta at P ~ 1 with max |Delta| at the top of
// its power of two (put_at_delta_bound: s_dS |dS| just under 2^14). A cap 4x
// looser rounds such a dS to Inf (>= 65520) in fp16, which dQ and dK carry
// into dx and dWqkv; the right one keeps every output within the rules. (The
// attention scores, which the backward does not read, stay as drawn.)
TEST_CASE("fused/benchmark interface: Delta's bound at its worst (dS ~ -Delta at P ~ 1)" * doctest::skip(kNoGpu)) {
  tg::manual_seed(109);
  const Spec s{2, 128, 128, 2, 160, 0.0};
  BackwardInputs in = make_backward_inputs(s);
  const double peak = put_at_delta_bound(in, s);
  CAPTURE(peak);
  REQUIRE(peak > 65520.0 / 4);
  check_case(s, 0.05, in);
}

// Powers of two of the inputs scale every output by a power of two, exactly:
// with query, key, value (and attention_output = Pd value) and grad_output
// times 2^q, 2^k, 2^v, 2^dy and P, Pd as given, dS scales by 2^e, e = v + dy,
// so dE, dw_in, dw_x and dWo by 2^e, dbo by 2^dy, the q, k and v blocks of
// dWqkv and dbqkv by 2^(e+k), 2^(e+q) and 2^dy, and dx by 2^dy when all three
// agree. Every fp16 operand (the attention core's q, k, v, dO and dS, the
// projections'; at "highest" both parts of each) has a power-of-two scale
// taken from the data, so this holds there too, up to the order of the
// atomic sums: fp32 sums that cancel (the column sums of dS behind dbq),
// measured at up to 3e-5 of an output's largest element between two runs. A
// wrong or swapped scale shows as a factor of 2^11 or more (a low part's), or
// as zeros or Inf: the bound is 1e-3.
namespace {

void check_power_of_two_scaling(const BackwardInputs& in, double scale, const Spec& s, tg::MatmulPrecision precision) {
  const auto run = [&](const BackwardInputs& x) {
    return outputs_of(tg::fused::region_attention_backward(x, scale, s.p, precision));
  };
  const auto base = run(in);
  struct Powers {
    int q, k, v, dy;
  };
  for (const Powers m : {Powers{0, 0, 0, -40}, {0, 0, 0, 40}, {6, -6, 0, 0}, {40, 0, 0, 0}, {0, 40, 0, 0},
                         {0, 0, 40, 0}, {0, 0, 40, -40}}) {
    CAPTURE(m.q);
    CAPTURE(m.k);
    CAPTURE(m.v);
    CAPTURE(m.dy);
    BackwardInputs x = in;
    x.query = in.query * std::ldexp(1.0, m.q);
    x.key = in.key * std::ldexp(1.0, m.k);
    x.value = in.value * std::ldexp(1.0, m.v);
    x.attention_output = in.attention_output * std::ldexp(1.0, m.v);
    x.grad_output = in.grad_output * std::ldexp(1.0, m.dy);
    const auto got = run(x);
    const int e = m.v + m.dy;
    const auto check = [&](const std::string& name, const tg::Tensor& g, const tg::Tensor& b, int power) {
      CAPTURE(name);
      CHECK(max_abs_diff(g * std::ldexp(1.0, -power), b) <= 1e-3 * max_abs(b));
    };
    check("grad_edit_region_bias", got[5], base[5], e);
    check("grad_within_edit_bias", got[6], base[6], e);
    check("grad_cross_edit_bias", got[7], base[7], e);
    check("grad_out_weight", got[3], base[3], e);
    check("grad_out_bias", got[4], base[4], m.dy);
    const int block_power[3] = {e + m.k, e + m.q, m.dy};
    const int largest = std::max({block_power[0], block_power[1], block_power[2]});
    for (int blk = 0; blk < 3; ++blk) {
      CAPTURE(blk);
      check("grad_qkv_bias", got[2].narrow(0, blk * s.C, s.C), base[2].narrow(0, blk * s.C, s.C), block_power[blk]);
      // dWqkv comes from one fp16 copy of dqkv: a block 2^12 below the largest one loses its small elements.
      if (block_power[blk] >= largest - 12)
        check("grad_qkv_weight", got[1].narrow(0, blk * s.C, s.C), base[1].narrow(0, blk * s.C, s.C),
              block_power[blk]);
    }
    if (block_power[0] == m.dy && block_power[1] == m.dy) check("grad_hidden_states", got[0], base[0], m.dy);
  }
}

}  // namespace

TEST_CASE("fused/benchmark interface: fp16 scales follow each operand's magnitude" * doctest::skip(kNoGpu)) {
  tg::manual_seed(104);
  const Spec s{2, 130, 128, 2, 150, 0.1};
  const BackwardInputs in = make_backward_inputs(s);
  const double scale = 1 / std::sqrt(double(s.C / s.H));
  for (const auto& [name, precision] : {std::pair{"high", tg::MatmulPrecision::High},
                                        std::pair{"highest", tg::MatmulPrecision::Highest}}) {
    CAPTURE(std::string(name));
    check_power_of_two_scaling(in, scale, s, precision);
  }
  const MmaSyncAttention mma_sync;  // the mma.sync kernels too (on compute capability 9.0)
  for (const auto& [name, precision] : {std::pair{"high on mma.sync", tg::MatmulPrecision::High},
                                        std::pair{"highest on mma.sync", tg::MatmulPrecision::Highest}}) {
    CAPTURE(std::string(name));
    check_power_of_two_scaling(in, scale, s, precision);
  }
}

// Dropout near 1: with p = 1 - 2^-21 and ten valid keys per row (P ~ 0.1), a
// kept element's Pd = P / (1 - p) is ~2e5, beyond fp16's 65504 even halved,
// and dS grows with it: the fp16 path must scale both by 2^-e_keep, e_keep
// taken from p (an interface that left p at 0 scaled them for 1/(1-p) < 2
// and overflowed to Inf). The keep-mask is an input: drawn at rate 0.3 rather
// than 1 - p, so that many elements are kept and every gradient is well away
// from zero. At "high" each output against float64 within 1e-2 of its
// largest element: TF32-level rounding is ~1e-3 there, and a wrong scale, a
// power of two, is off by a factor of 2 or more. At "highest" (split fp16
// operands under the same scales) within 10x of the fp32 graph's error.
TEST_CASE("fused/benchmark interface: dropout near 1 (Pd beyond fp16's range)" * doctest::skip(kNoGpu)) {
  tg::manual_seed(105);
  const Spec s{4, 300, 128, 2, 300, 1 - 0x1p-21};  // 1 - p exact in float too
  std::vector<double> valid(size_t(s.B * s.S));
  for (size_t k = 0; k < valid.size(); ++k) valid[k] = k % 30 == 7;  // keys 7, 37, ..., 277 of every batch
  const tg::Tensor keep = tg::dropout_mask({s.B, s.H, s.S, s.S}, 0.7, {106, 0});
  const BackwardInputs in = make_backward_inputs(s, {}, tg::from_vector(valid, {s.B, s.S}), keep);
  REQUIRE(max_abs(in.attention_probs_dropped) > 2 * 65504.0);
  const double scale = 1 / std::sqrt(double(s.C / s.H));
  const Gradients ref64 = reference_backward(in, scale, s.p, tg::DType::Float64);
  const auto ref = outputs_of(ref64);
  for (const auto& [kernel, grads] : by_kernel(in, scale, s.p, tg::MatmulPrecision::High)) {
    CAPTURE(kernel);
    const auto got = outputs_of(grads);
    for (size_t i = 0; i < got.size(); ++i) {
      CAPTURE(std::string(kOutputNames[i]));
      CHECK(relative_error(got[i], ref[i]) < 1e-2);
    }
  }
  const Gradients ref32 = reference_backward(in, scale, s.p, tg::DType::Float32);
  for (const auto& [kernel, grads] : by_kernel(in, scale, s.p, tg::MatmulPrecision::Highest)) {
    CAPTURE(kernel);
    check_near_fp32(grads, ref32, ref64);
  }
}

namespace {

// The layer's output and every gradient, fused at "highest" and at "high"
// against the decomposed graph, with and without dropout (the same Philox
// draw), a batch whose keys are all masked and random key masks (or the key
// mask `attn`); the edit mask random (edit_fill < 0) or all edit_fill; M =
// S + extra_positions.
void check_training_matches_decomposed(int64_t B, int64_t S, int64_t C, int64_t H, double edit_fill = -1,
                                       const tg::Tensor& attn = {}, int64_t extra_positions = 3) {
  CAPTURE(B);
  CAPTURE(S);
  CAPTURE(extra_positions);
  CAPTURE(edit_fill);
  for (double p : {0.0, 0.1}) {
    CAPTURE(p);
    const tg::RegionAttentionParams host = tg::RegionAttentionParams::init({C, H, S + extra_positions});
    const tg::Tensor x = tg::randn({B, S, C});
    const tg::Tensor e = edit_fill < 0 ? tg::dropout_mask({B, S}, 0.5, {1, 1}) : tg::full({B, S}, edit_fill);
    tg::Tensor a = attn.defined() ? attn : tg::dropout_mask({B, S}, 0.2, {1, 2});
    if (!attn.defined()) a.narrow(0, 0, 1).fill_(0.0);
    const tg::Tensor dy = tg::randn({B, S, C}).cuda();
    const tg::PhiloxState rng{77, 5};
    std::map<std::string, std::vector<tg::Tensor>> results;
    for (const auto& [name, impl, precision] :
         std::vector<std::tuple<std::string, tg::AttentionImpl, std::string>>{
             {"decomposed", tg::AttentionImpl::Decomposed, "highest"},
             {"fused highest", tg::AttentionImpl::Fused, "highest"},
             {"fused high", tg::AttentionImpl::Fused, "high"}}) {
      const PrecisionScope scope(precision);  // restored where a check throws, too
      const tg::RegionAttentionParams params = host.trainable_copy(tg::Device::CUDA);
      tg::Tensor xg = x.cuda().requires_grad_();
      const tg::Tensor y = tg::region_attention(xg, e.cuda(), a.cuda(), params, {p, rng}, impl);
      if (name == "fused high") CHECK(y.grad_fn()->name == "fused_attention_layer");  // one node for the layer
      y.backward(dy);
      std::vector<tg::Tensor> r{y, xg.grad()};
      for (const tg::Tensor& t : params.parameters()) r.push_back(t.grad());
      results[name] = r;
    }
    tg::set_float32_matmul_precision("highest");
    const std::vector<tg::Tensor>& ref = results["decomposed"];
    // With a constant edit mask the edit-bias scalars (7 and 8) are sums of dS
    // that vanish in exact arithmetic (each row of dS sums to 0, or every term
    // has a factor 0), so both sides hold rounding noise: their error is taken
    // against the magnitude of the summed terms, sum |dE| (6), not the noise.
    double summed_terms = 0;
    for (const double v : ref[6].to_vector()) summed_terms += std::abs(v);
    const auto error = [&](const tg::Tensor& got, size_t i) {
      if (edit_fill < 0 || (i != 7 && i != 8)) return relative_error(got, ref[i]);
      return max_abs_diff(got, ref[i]) / summed_terms;
    };
    for (size_t i = 0; i < ref.size(); ++i) {
      CAPTURE(i);
      CHECK(error(results["fused highest"][i], i) < 2e-5);
      CHECK(error(results["fused high"][i], i) < 1e-2);
    }
  }
}

}  // namespace

TEST_CASE("fused/training path through the tape matches the decomposed graph (same Philox draw)" * doctest::skip(kNoGpu)) {
  tg::manual_seed(103);
  // On an H200, {4, 520, 1024, 16} has 576 key-tile CTAs: one per key tile at "highest" (dk and dv stored,
  // 9 query tiles each), split at "high" (3 CTAs per SM); {4, 832, 1024, 16} has 832: one per key tile at both.
  // M = S + 4 at S = 520, a multiple of 4: on compute capability 9.0 the warpgroup forward runs there (its
  // TMA's bias map needs it; 9 key tiles, its stages refilled), with M = S + 3 the mma.sync one.
  for (const auto& [B, S, C, H, extra] : std::vector<std::array<int64_t, 5>>{
           {2, 300, 1024, 16, 3}, {4, 520, 1024, 16, 4}, {4, 832, 1024, 16, 3}})
    check_training_matches_decomposed(B, S, C, H, -1, {}, extra);
}

// Small enough for compute-sanitizer's racecheck over the training kernels.
TEST_CASE("fused/training path at small shapes matches the decomposed graph" * doctest::skip(kNoGpu)) {
  tg::manual_seed(104);
  for (const auto& [B, S, C, H] :
       std::vector<std::array<int64_t, 4>>{{2, 77, 128, 2}, {3, 1, 64, 1}, {2, 2, 64, 1}, {2, 130, 128, 2}})
    check_training_matches_decomposed(B, S, C, H);
  for (const double edit_fill : {0.0, 1.0}) check_training_matches_decomposed(2, 77, 128, 2, edit_fill);
  // Whole key tiles masked before unmasked keys: the forward's online softmax
  // starts at the second or third tile of a row (a running max of -inf).
  tg::Tensor a = tg::ones({2, 150});
  a.narrow(1, 0, 70).fill_(0.0);
  a.narrow(0, 1, 1).narrow(1, 70, 58).fill_(0.0);
  check_training_matches_decomposed(2, 150, 128, 2, -1, a);
}

// On compute capability 9.0 the "high" training kernels run on the warpgroup
// MMA (the forward: two warpgroups of 64 queries sharing K and V tiles,
// loads by the TMA; the backward: ops/fused_attention_backward.cuh's kernel
// with wgmma products), and with enable_warpgroup_attention(false) on
// mma.sync. Both read the same fp16 copies, draw the same dropout and round
// the same values to fp16 for their products, so o and the gradients differ
// by the order of the fp32 sums alone (and, rarely, a value that rounds to
// the other fp16 neighbour). Checked through fused_attention (float dq, dk,
// dv) and fused_qkv_attention (dk and dv stored as fp16 by the backward):
// o and the gradients of every input, E, w_in and w_x included.
// The shapes: one query; rows past S in one warpgroup (77) or in both of a
// CTA's (130 = 128 + 2: the second CTA's second warpgroup has none); more
// key tiles than stages, each stage refilled (300, 600); B, H > 1 and M > S
// (M a multiple of 4, as the warpgroup forward's bias map needs: with M = 4
// k + 2 the mma.sync forward runs in both, and the backwards still differ).
// The bias steps by 3 every 16 keys (row maxima that move across key
// tiles); masks random, with a batch all masked, and whole key tiles masked
// before unmasked keys.
TEST_CASE("cuda/fused_attention: the warpgroup kernels match the mma.sync kernels" *
          doctest::skip(kNoGpu || !tgtest::on_sm90())) {
  tg::manual_seed(108);
  const PrecisionScope scope("high");
  struct Case {
    int64_t B, S, H, M;
    double p;
    bool masked_tiles;
  };
  for (const Case& c : std::vector<Case>{{2, 1, 1, 4, 0.1, false},
                                         {3, 77, 2, 80, 0.1, false},
                                         {2, 130, 2, 132, 0.0, false},
                                         {2, 130, 2, 134, 0.1, false},
                                         {2, 300, 3, 304, 0.1, true},
                                         {1, 600, 2, 1024, 0.25, false}}) {
    CAPTURE(c.B);
    CAPTURE(c.S);
    CAPTURE(c.M);
    CAPTURE(c.p);
    const int64_t C = 64 * c.H;
    std::vector<double> offsets;
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < c.M; ++j) offsets.push_back(3.0 * ((j / 16) % 3));
    const tg::Tensor E =
        tg::add(tg::mul(tg::randn({c.H, c.M, c.M}), 0.3), tg::from_vector(offsets, {1, c.M, c.M})).cuda();
    const tg::Tensor w_in = tg::randn({c.H, 1, 1}).cuda(), w_x = tg::randn({c.H, 1, 1}).cuda();
    const tg::Tensor qkv = tg::randn({c.B, c.S, 3 * C}).cuda(), dout = tg::randn({c.B, c.S, C}).cuda();
    const tg::Tensor x = tg::randn({c.B, c.S, C}).cuda(), w = tg::mul(tg::randn({3 * C, C}), 0.1).cuda();
    const tg::Tensor bias = tg::mul(tg::randn({3 * C}), 0.1).cuda();
    const tg::Tensor e = tg::dropout_mask({c.B, c.S}, 0.5, {5, 1}).cuda();
    tg::Tensor a = tg::dropout_mask({c.B, c.S}, 0.2, {5, 2});
    if (c.B > 1) a.narrow(0, 0, 1).fill_(0.0);
    if (c.masked_tiles) a.narrow(1, 0, 140).fill_(0.0);
    a = a.cuda();
    const tg::DropoutOptions drop{c.p, tg::PhiloxState{41, 3}};
    const auto leaves_of = [](const std::vector<tg::Tensor>& values) {
      std::vector<tg::Tensor> leaves;
      for (const tg::Tensor& v : values) leaves.push_back(v.clone().requires_grad_());
      return leaves;
    };
    // Per kernel: o, then the gradients of qkv, E, w_in, w_x; the node's o, then those of x, W, b, E, w_in, w_x.
    const auto run = [&] {
      const std::vector<tg::Tensor> core = leaves_of({qkv, E, w_in, w_x});
      const tg::Tensor o = tg::fused_attention(core[0], e, a, core[1], core[2], core[3], c.H, drop);
      o.backward(dout);
      const std::vector<tg::Tensor> node = leaves_of({x, w, bias, E, w_in, w_x});
      const tg::Tensor o_node =
          tg::fused_qkv_attention(node[0], node[1], node[2], e, a, node[3], node[4], node[5], c.H, drop);
      o_node.backward(dout);
      std::vector<tg::Tensor> r{o};
      for (const tg::Tensor& t : core) r.push_back(t.grad());
      r.push_back(o_node);
      for (const tg::Tensor& t : node) r.push_back(t.grad());
      return r;
    };
    std::vector<std::vector<tg::Tensor>> runs{run()};  // the warpgroup kernels, then the mma.sync ones
    {
      const MmaSyncAttention mma_sync;
      runs.push_back(run());
    }
    // dE, dw_in and dw_x are sums of dS: at S = 1 every row's dS is the cancellation dP - Delta (rounding
    // noise on both sides), so there only the rest is compared. dw_in and dw_x are judged against the
    // summed terms' size, sum |dE|, not against their own, which cancels.
    const std::set<size_t> edit_bias{2, 3, 4, 9, 10, 11}, scalars{3, 4, 10, 11};
    for (size_t i = 0; i < runs[0].size(); ++i) {
      CAPTURE(i);
      if (c.S == 1 && edit_bias.count(i)) continue;
      if (scalars.count(i)) {
        const size_t dE = i < 5 ? 2 : 9;
        CHECK(max_abs_diff(runs[0][i], runs[1][i]) <= 1e-4 * sum_abs(runs[1][dE]));
        continue;
      }
      CHECK(relative_error(runs[0][i], runs[1][i]) < 2e-3);
      CHECK(mean_relative_error(runs[0][i], runs[1][i]) < 1e-4);
    }
  }
}

// A NaN or infinite input: the fused op's output and gradients are
// non-finite exactly where the decomposed graph's are, at both precisions
// (the forward's row sums carry what its row max passes over; the edit terms
// are products, as the decomposed graph's: 0 NaN is NaN). The CPU test of
// the same name checks the finite elements too.
TEST_CASE("fused/training path: a NaN or Inf in an input shows where the decomposed graph's does" * doctest::skip(kNoGpu)) {
  tg::manual_seed(106);
  const int64_t B = 2, S = 77, C = 128, H = 2;
  const auto poisoned = [&](const std::string& what, auto poison) {
    CAPTURE(what);
    tg::RegionAttentionParams host = tg::RegionAttentionParams::init({C, H, S + 3});
    tg::Tensor x = tg::randn({B, S, C});
    {
      tg::NoGradGuard no_grad;  // the poison is written into leaves
      poison(x, host);
    }
    const tg::Tensor e = tg::dropout_mask({B, S}, 0.5, {1, 1}), a = tg::ones({B, S});
    const tg::Tensor dy = tg::randn({B, S, C}).cuda();
    for (double p : {0.0, 0.1}) {
      CAPTURE(p);
      std::map<std::string, std::vector<std::vector<bool>>> patterns;
      for (const auto& [name, impl, precision] :
           std::vector<std::tuple<std::string, tg::AttentionImpl, std::string>>{
               {"decomposed", tg::AttentionImpl::Decomposed, "highest"},
               {"fused highest", tg::AttentionImpl::Fused, "highest"},
               {"fused high", tg::AttentionImpl::Fused, "high"}}) {
        const PrecisionScope scope(precision);
        const tg::RegionAttentionParams params = host.trainable_copy(tg::Device::CUDA);
        tg::Tensor xg = x.cuda().requires_grad_();
        const tg::Tensor y = tg::region_attention(xg, e.cuda(), a.cuda(), params, {p, tg::PhiloxState{77, 5}}, impl);
        y.backward(dy);
        patterns[name] = {finite_pattern(y), finite_pattern(xg.grad())};
        for (const tg::Tensor& t : params.parameters()) patterns[name].push_back(finite_pattern(t.grad()));
      }
      const auto& ref = patterns["decomposed"];
      CHECK(std::count(ref[0].begin(), ref[0].end(), false) > 0);  // the poison reaches the output
      for (size_t i = 0; i < ref.size(); ++i) {
        CAPTURE(i);
        CHECK(patterns["fused highest"][i] == ref[i]);
        CHECK(patterns["fused high"][i] == ref[i]);
      }
    }
  };
  const auto at = [](tg::Tensor t, std::vector<int64_t> index, double value) {
    for (size_t d = 0; d < index.size(); ++d) t = t.narrow(static_cast<int64_t>(d), index[d], 1);
    t.fill_(value);
  };
  poisoned("x[0, 5, 3] = NaN", [&](tg::Tensor& x, tg::RegionAttentionParams&) { at(x, {0, 5, 3}, NAN); });
  poisoned("x[1, 40, 7] = +inf", [&](tg::Tensor& x, tg::RegionAttentionParams&) { at(x, {1, 40, 7}, INFINITY); });
  poisoned("edit_region_bias[1, 10, 20] = NaN",
           [&](tg::Tensor&, tg::RegionAttentionParams& q) { at(q.edit_region_bias, {1, 10, 20}, NAN); });
  poisoned("within_edit_bias[0] = NaN",
           [&](tg::Tensor&, tg::RegionAttentionParams& q) { at(q.within_edit_bias, {0}, NAN); });
  poisoned("cross_edit_bias[1] = -inf",
           [&](tg::Tensor&, tg::RegionAttentionParams& q) { at(q.cross_edit_bias, {1}, -INFINITY); });
}

TEST_CASE("fused/training path saves O(B H S) beyond the activations" * doctest::skip(kNoGpu || !tg::cuda::caching_enabled())) {
  tg::manual_seed(104);
  const int64_t B = 2, S = 512, C = 1024, H = 16;
  const tg::RegionAttentionParams params = tg::RegionAttentionParams::init({C, H, S}).trainable_copy(tg::Device::CUDA);
  const tg::Tensor x = tg::randn({B, S, C}).cuda().requires_grad_(), e = tg::ones({B, S}).cuda(), a = e;
  for (const std::string precision : {"highest", "high"}) {
    CAPTURE(precision);
    const PrecisionScope scope(precision);
    const size_t before = tg::cuda::memory_stats().allocated;
    const tg::Tensor y = tg::region_attention(x, e, a, params, {0.1}, tg::AttentionImpl::Fused);
    const double held = double(tg::cuda::memory_stats().allocated - before);
    // qkv (fp16 at "high": the kernels' copy, kept in place of the float one), o, y and the
    // log-sum-exp, and at "high" (the layer node) o's and Wo's fp16 copies: no [B,H,S,S]
    // tensor (that alone would be 32 MiB here).
    const bool high = precision == "high";
    const double qkv_bytes = (high ? 2.0 : 4.0) * 3 * B * S * C, half_copies = high ? 2.0 * (B * S * C + C * C) : 0.0;
    CHECK(held <= qkv_bytes + 4.0 * (B * S * C + B * S * C + B * H * S) + half_copies + 64 * 1024);
    y.backward(tg::randn({B, S, C}).cuda());
  }
}

// The point of fused_qkv_attention: at "high" its backward never holds qkv's
// float gradient [B,S,3C] (12 bytes per element of [B,S,C]). Its peak is at
// the kernel: dO's fp16 copy (2 bytes), dq (4) and dk, dv as fp16 (4), with
// dE; the fp16 dqkv comes after q, k, v's fp16 copy and dO's are freed.
TEST_CASE("fused/qkv projection in the node: at high its backward holds no float dqkv" * doctest::skip(kNoGpu || !tg::cuda::caching_enabled())) {
  tg::manual_seed(105);
  const int64_t B = 16, S = 512, C = 128, H = 2;
  const PrecisionScope scope("high");
  const auto param = [](const tg::Shape& shape, double scale) {
    return tg::mul(tg::randn(shape), scale).cuda().requires_grad_();
  };
  const tg::Tensor x = param({B, S, C}, 1.0), w = param({3 * C, C}, 0.1), b = param({3 * C}, 0.1);
  const tg::Tensor E = param({H, S, S}, 0.1), w_in = param({H, 1, 1}, 0.1), w_x = param({H, 1, 1}, 0.1);
  const tg::Tensor e = tg::dropout_mask({B, S}, 0.5, {3, 1}).cuda(), a = tg::dropout_mask({B, S}, 0.1, {3, 2}).cuda();
  const tg::Tensor o = tg::fused_qkv_attention(x, w, b, e, a, E, w_in, w_x, H, {0.1});
  const tg::Tensor dout = tg::randn({B, S, C}).cuda();
  tg::cuda::synchronize();
  const double before = double(tg::cuda::memory_stats().allocated);
  tg::cuda::reset_peak_memory_stats();
  o.backward(dout);
  const double extra = double(tg::cuda::memory_stats().peak_allocated) - before;
  const double elements = double(B * S * C), dE = 4.0 * H * S * S;
  CHECK(extra <= 10 * elements + dE + (1 << 20));
  for (const tg::Tensor& t : {x, w, b, E, w_in, w_x}) CHECK(max_abs(t.grad()) > 0);
}

// The fp16 key gradients against the path they replace: linear_fp16, then
// fused_attention, whose backward converts the float dqkv with to_fp16. With
// linear_to_fp16's fp16 GEMM off (FloatProductCopies: its roundings are not
// to_fp16's; the training-path tests check the node with it against the
// decomposed graph) the forwards are the same code (o equal bit for bit). The fp16 roundings agree
// too where the values stay fp16 normals (a power-of-two scale changes no
// significand), so dx and dW differ only where they meet subnormals; E adds
// 3 ((j / 16) mod 3) to key j's scores, so that neighbouring 16-key groups
// hold dv of different magnitudes and scales (a group read at another's
// scale is off by a power of two). S = 77 leaves a part group of 13 keys;
// batch 0 is fully masked. Each pattern of which leaves want gradients takes
// its own path through the node (x frozen, W frozen, only the biases).
TEST_CASE("fused/qkv projection in the node at high: the same as linear_fp16 then fused_attention" * doctest::skip(kNoGpu)) {
  tg::manual_seed(106);
  const FloatProductCopies float_products;
  const int64_t B = 3, S = 77, C = 128, H = 2;
  const PrecisionScope scope("high");
  const tg::Tensor x = tg::randn({B, S, C}).cuda(), w = tg::mul(tg::randn({3 * C, C}), 0.06).cuda();
  const tg::Tensor bias = tg::mul(tg::randn({3 * C}), 0.1).cuda();
  std::vector<double> offsets;
  for (int64_t i = 0; i < S; ++i)
    for (int64_t j = 0; j < S; ++j) offsets.push_back(3.0 * ((j / 16) % 3));
  const tg::Tensor E = tg::add(tg::mul(tg::randn({H, S, S}), 0.3), tg::from_vector(offsets, {1, S, S})).cuda();
  const tg::Tensor w_in = tg::randn({H, 1, 1}).cuda(), w_x = tg::randn({H, 1, 1}).cuda();
  const tg::Tensor e = tg::dropout_mask({B, S}, 0.5, {4, 1}).cuda(), dout = tg::randn({B, S, C}).cuda();
  tg::Tensor a = tg::dropout_mask({B, S}, 0.2, {4, 2});
  a.narrow(0, 0, 1).fill_(0.0);
  a = a.cuda();
  const tg::DropoutOptions drop{0.1, tg::PhiloxState{31, 7}};
  // x, W, b, E, w_in, w_x
  for (const std::vector<bool>& wants : std::vector<std::vector<bool>>{{true, true, true, true, true, true},
                                                                       {false, true, true, false, false, false},
                                                                       {true, false, false, true, false, false},
                                                                       {false, false, true, false, true, true}}) {
    CAPTURE(wants);
    std::vector<std::vector<tg::Tensor>> runs;
    for (const bool in_node : {true, false}) {
      std::vector<tg::Tensor> leaves;
      size_t k = 0;
      for (const tg::Tensor& t : {x, w, bias, E, w_in, w_x}) leaves.push_back(t.detach().clone().requires_grad_(wants[k++]));
      const tg::Tensor o =
          in_node ? tg::fused_qkv_attention(leaves[0], leaves[1], leaves[2], e, a, leaves[3], leaves[4], leaves[5], H, drop)
                  : tg::fused_attention(tg::linear_fp16(leaves[0], leaves[1], leaves[2]), e, a, leaves[3], leaves[4],
                                        leaves[5], H, drop);
      o.backward(dout);
      std::vector<tg::Tensor> r{o};
      for (const tg::Tensor& t : leaves) r.push_back(t.grad());
      runs.push_back(r);
    }
    CHECK(max_abs_diff(runs[0][0], runs[1][0]) == 0.0);
    for (size_t i = 1; i < runs[0].size(); ++i) {
      CAPTURE(i);
      REQUIRE(runs[0][i].defined() == wants[i - 1]);
      if (!wants[i - 1]) continue;
      CHECK(relative_error(runs[0][i], runs[1][i]) < 1e-4);
    }
    // dbk: exactly 0 in the node (finite inputs); the old path sums the
    // tensor-core dk over B S tokens, rounding noise of ~2^-11 sqrt(B S) |dk|
    // (measured 8e-5 of max |db| on an H200), where a real nonzero dbk would
    // be O(1) of it.
    if (wants[2]) {
      const tg::Tensor dbk_node = runs[0][3].narrow(0, C, C), dbk_old = runs[1][3].narrow(0, C, C);
      CHECK(max_abs(dbk_node) == 0.0);
      CHECK(max_abs(dbk_old) < 1e-3 * max_abs(runs[1][3]));
    }
  }
}

// The layer node against the two nodes it replaces: fused_qkv_attention, then
// linear_fp16, which converts o (and Wo, and again both in its backward)
// with to_fp16. The node's forward kernel writes o's fp16 copy at a scale
// from a bound on v instead (qkv's first scale's); a power-of-two scale
// changes no significand where the values stay fp16 normals, so the
// products agree but where they meet subnormals. Each pattern of which
// leaves want gradients takes its own path through the node's backward (no
// attention gradient: Wo's copy not kept; dWo without dbo; dbo alone: no
// conversion). In batch 1 one key, whose row of x is 4x the others' (its v
// holds qkv's largest values), is every row's only unmasked key: with p =
// 0.74 (1 / (1 - p) just under 4) the rows that keep it have o = v / (1 -
// p), o's largest values (its copy stays well under the bound's 2^13 here:
// qkv's first scale leaves qkv's max far under the 2^15 it guarantees).
// M = 80 lets the warpgroup forward take the bias (M % 4 == 0) on
// compute capability 9.0; the mma.sync kernels run too.
TEST_CASE("fused/layer node at high: the same as fused_qkv_attention then linear_fp16" * doctest::skip(kNoGpu)) {
  tg::manual_seed(108);
  const int64_t B = 3, S = 77, M = 80, C = 128, H = 2;
  const PrecisionScope scope("high");
  const auto normal = [](const tg::Shape& shape, double scale) { return tg::mul(tg::randn(shape), scale).cuda(); };
  tg::Tensor x_cpu = tg::randn({B, S, C});
  x_cpu.narrow(0, 1, 1).narrow(1, 17, 1).mul_(4.0);
  const tg::Tensor x = x_cpu.cuda(), w = normal({3 * C, C}, 0.06), bias = normal({3 * C}, 0.1);
  const tg::Tensor E = normal({H, M, M}, 0.3), w_in = normal({H, 1, 1}, 1.0), w_x = normal({H, 1, 1}, 1.0);
  const tg::Tensor wo = normal({C, C}, 0.06), bo = normal({C}, 0.1), dy = normal({B, S, C}, 1.0);
  const tg::Tensor e = tg::dropout_mask({B, S}, 0.5, {4, 1}).cuda();
  tg::Tensor a = tg::dropout_mask({B, S}, 0.2, {4, 2});
  a.narrow(0, 0, 1).fill_(0.0);                 // batch 0 fully masked
  a.narrow(0, 1, 1).fill_(0.0);
  a.narrow(0, 1, 1).narrow(1, 17, 1).fill_(1.0);  // batch 1: key 17 alone
  a = a.cuda();
  // x, W, b, E, w_in, w_x, Wo, bo
  const std::vector<std::vector<bool>> patterns{{true, true, true, true, true, true, true, true},
                                                {false, false, false, false, false, false, true, true},
                                                {false, true, false, false, false, false, false, true},
                                                {true, false, false, true, false, false, true, false},
                                                {false, false, false, false, false, false, false, true}};
  for (const bool warpgroup : {true, false})
  for (const double p : {0.1, 0.74}) {
    const tg::DropoutOptions drop{p, tg::PhiloxState{31, 9}};
    std::optional<MmaSyncAttention> mma_sync;
    if (!warpgroup) mma_sync.emplace();
    for (const std::vector<bool>& wants : patterns) {
      CAPTURE(warpgroup);
      CAPTURE(p);
      CAPTURE(wants);
      std::vector<std::vector<tg::Tensor>> runs;
      for (const bool in_node : {true, false}) {
        std::vector<tg::Tensor> l;
        size_t k = 0;
        for (const tg::Tensor& t : {x, w, bias, E, w_in, w_x, wo, bo})
          l.push_back(t.detach().clone().requires_grad_(wants[k++]));
        const tg::Tensor y =
            in_node ? tg::fused_attention_layer(l[0], l[1], l[2], e, a, l[3], l[4], l[5], l[6], l[7], H, drop)
                    : tg::linear_fp16(tg::fused_qkv_attention(l[0], l[1], l[2], e, a, l[3], l[4], l[5], H, drop), l[6],
                                      l[7]);
        REQUIRE(y.grad_fn());
        CHECK(y.grad_fn()->name == (in_node ? "fused_attention_layer" : "linear_fp16"));
        y.backward(dy);
        std::vector<tg::Tensor> r{y};
        for (const tg::Tensor& t : l) r.push_back(t.grad());
        runs.push_back(r);
      }
      CHECK(max_abs(runs[0][0]) > 0);
      CHECK(relative_error(runs[0][0], runs[1][0]) < 1e-5);
      for (size_t i = 1; i < runs[0].size(); ++i) {
        CAPTURE(i);
        REQUIRE(runs[0][i].defined() == wants[i - 1]);
        if (!wants[i - 1]) continue;
        CHECK(max_abs(runs[0][i]) > 0);
        CHECK(relative_error(runs[0][i], runs[1][i]) < 1e-4);
      }
    }
  }
}

// At "high" the node adds qkv's bias inside its fp16 conversion, which reads
// a contiguous bias: a view it cannot read as it is (expanded, stride 0) is
// made contiguous first, and the forward equals the one with the copy.
TEST_CASE("fused/qkv projection in the node at high: an expanded qkv bias gives what its copy gives" * doctest::skip(kNoGpu)) {
  tg::manual_seed(107);
  const int64_t B = 2, S = 40, C = 128, H = 2;
  const PrecisionScope scope("high");
  const tg::Tensor x = tg::randn({B, S, C}).cuda(), w = tg::mul(tg::randn({3 * C, C}), 0.06).cuda();
  const tg::Tensor expanded = tg::randn({1}).cuda().expand({3 * C});
  REQUIRE(!expanded.is_contiguous());
  const tg::Tensor E = tg::mul(tg::randn({H, S, S}), 0.3).cuda();
  const tg::Tensor w_in = tg::randn({H, 1, 1}).cuda(), w_x = tg::randn({H, 1, 1}).cuda();
  const tg::Tensor e = tg::dropout_mask({B, S}, 0.5, {4, 1}).cuda(), a = tg::ones({B, S}).cuda();
  const tg::DropoutOptions drop{0.1, tg::PhiloxState{31, 8}};
  const tg::Tensor o_view = tg::fused_qkv_attention(x, w, expanded, e, a, E, w_in, w_x, H, drop);
  const tg::Tensor o_copy = tg::fused_qkv_attention(x, w, expanded.contiguous(), e, a, E, w_in, w_x, H, drop);
  CHECK(max_abs_diff(o_view, o_copy) == 0.0);
}

#ifdef TG_CUDA  // the CUDA kernels' residency, which a CPU-only build lacks
// Each backward kernel keeps the CTAs per SM its layout plans for
// (backward_grid counts waves with them): registers and shared memory, the
// kernel's static block-reduction partials included, leave room for them on
// a device of compute capability 9.0 (227 KB of shared memory per SM), for
// every kernel the interface and the training path run there (the warpgroup
// ones and, with enable_warpgroup_attention(false), the mma.sync ones).
TEST_CASE("fused/backward kernels keep their planned CTAs per SM" * doctest::skip(kNoGpu)) {
  const bool hopper = tgtest::on_sm90();
  for (const bool warpgroup : {true, false}) {
    std::optional<MmaSyncAttention> mma_sync;
    if (!warpgroup) mma_sync.emplace();
    for (const auto precision : {tg::MatmulPrecision::High, tg::MatmulPrecision::Highest}) {
      for (const bool read : {true, false}) {
        CAPTURE(warpgroup);
        CAPTURE(precision == tg::MatmulPrecision::High);
        CAPTURE(read);
        const tg::KernelResidency r = tg::FusedAttentionKernels<tg::Device::CUDA>::backward_residency(precision, read);
        CAPTURE(r.resident);
        CHECK(r.planned >= 2);
        if (hopper) CHECK(r.resident == r.planned);
        else CHECK(r.resident >= 1);
      }
    }
  }
}
#endif

// The kernels' grids hold the (b, h) pairs in blockIdx.y (at most 65535): more
// is a clear error before any output is written.
TEST_CASE("fused/more (b, h) pairs than the CUDA grid holds is an error, outputs untouched" * doctest::skip(kNoGpu)) {
  const int64_t B = 32768, S = 1, C = 128, H = 2, D = 64, M = 1;
  BackwardInputs in;  // zeros of the spec's shapes: the check comes before any value is read
  Gradients out;
  const tg::Shape tokens{B, S, C}, heads{B, H, S, D}, scores{B, H, S, S}, rows{B, S}, scalars{H, 1, 1};
  const std::vector<std::pair<tg::Tensor*, tg::Shape>> shapes = {
      {&in.grad_output, tokens}, {&in.hidden_states, tokens}, {&in.attention_output, tokens},
      {&in.edit_region_mask, rows}, {&in.attention_mask, rows}, {&in.query, heads}, {&in.key, heads},
      {&in.value, heads}, {&in.attention_scores, scores}, {&in.attention_probs, scores},
      {&in.attention_probs_dropped, scores}, {&in.dropout_mask, scores}, {&in.qkv_weight, {3 * C, C}},
      {&in.qkv_bias, {3 * C}}, {&in.out_weight, {C, C}}, {&in.out_bias, {C}}, {&in.edit_region_bias, {H, M, M}},
      {&in.within_edit_bias, scalars}, {&in.cross_edit_bias, scalars}, {&out.qkv_weight, {3 * C, C}},
      {&out.qkv_bias, {3 * C}}, {&out.out_weight, {C, C}}, {&out.out_bias, {C}}, {&out.edit_region_bias, {H, M, M}},
      {&out.within_edit_bias, scalars}, {&out.cross_edit_bias, scalars}};
  for (const auto& [t, shape] : shapes) *t = tg::zeros(shape, {tg::DType::Float32, tg::Device::CUDA});
  out.hidden_states = tg::full(tokens, NAN, {tg::DType::Float32, tg::Device::CUDA});
  const std::string message = error_of([&] {
    tg::fused::region_attention_backward_into(in, 0.125, 0.1, tg::MatmulPrecision::High, out);
  });
  CHECK(contains(message, "region_attention_backward: batch 32768 x heads 2 = 65536 exceeds the CUDA kernels' limit"));
  CHECK(std::isnan(out.hidden_states.to_vector()[0]));
  // The training path refuses it before its projection runs or its dropout draw is taken.
  const tg::Tensor x = tg::zeros(tokens, {tg::DType::Float32, tg::Device::CUDA});
  const tg::PhiloxState before = tg::default_generator().state();
  CHECK(contains(error_of([&] {
                   tg::fused_qkv_attention(x, in.qkv_weight, in.qkv_bias, in.edit_region_mask, in.attention_mask,
                                           in.edit_region_bias, in.within_edit_bias, in.cross_edit_bias, H, {0.1});
                 }),
                 "fused_qkv_attention: batch 32768 x heads 2 = 65536 exceeds the CUDA kernels' limit"));
  const tg::PhiloxState after = tg::default_generator().state();
  CHECK((after.seed == before.seed && after.offset == before.offset));
}

TEST_CASE("fused/an empty batch or sequence runs no kernel and gives zero gradients" * doctest::skip(kNoGpu)) {
  check_empty_fused_attention(tg::Device::CUDA);
}

#ifdef TG_CUDA
TEST_CASE("fused/C API: results, errors that write nothing, a caller's stream, graph capture" * doctest::skip(kNoGpu)) {
  tg::manual_seed(105);
  const Spec s{2, 100, 128, 2, 120};
  const BackwardInputs in = make_backward_inputs(s);
  const double scale = 1 / std::sqrt(64.0);
  const Gradients want = tg::fused::region_attention_backward(in, scale, s.p, tg::MatmulPrecision::High);
  std::vector<tg::Tensor> outs;
  for (const tg::Tensor& t : outputs_of(want)) outs.push_back(tg::full(t.shape(), NAN, {tg::DType::Float32, tg::Device::CUDA}));
  std::vector<const float*> ip;
  for (const tg::Tensor& t : inputs_of(in)) ip.push_back(t.data<float>());
  std::vector<float*> op;
  for (const tg::Tensor& t : outs) op.push_back(t.data<float>());
  auto call = [&](int64_t S, int64_t C, int64_t H, int64_t M, void* stream) {
    return tg_region_attention_backward(ip.data(), float(scale), float(s.p), s.B, S, C, H, M, op.data(),
                                        TG_PRECISION_HIGH, stream);
  };
  CHECK(call(s.S, s.C, s.H, 50, nullptr) != 0);  // S > max_positions
  CHECK(contains(tg_last_error(), "seq_len 100 exceeds max_positions 50"));
  CHECK(call(s.S, 100, 3, s.M, nullptr) != 0);
  CHECK(contains(tg_last_error(), "hidden 100 is not divisible by heads 3"));
  CHECK(call(0, s.C, s.H, s.M, nullptr) != 0);
  CHECK(contains(tg_last_error(), "sizes must be positive"));
  ip[5] = nullptr;
  CHECK(call(s.S, s.C, s.H, s.M, nullptr) != 0);
  CHECK(contains(tg_last_error(), "input 5 (out_weight) is a null pointer"));
  ip[5] = in.out_weight.data<float>();
  for (const tg::Tensor& t : outs) CHECK(std::isnan(t.to_vector()[0]));  // nothing written
  CHECK(std::string(tg_version()).find("tapegrad") == 0);

  cudaStream_t stream;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(call(s.S, s.C, s.H, s.M, stream) == 0);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  CHECK(std::string(tg_last_error()).empty());
  const auto w = outputs_of(want);
  for (size_t i = 0; i < outs.size(); ++i) CHECK(relative_error(outs[i], w[i]) < 1e-5);

  // Captured after the warm-up call above: no allocation, every launch on the
  // stream. Capture needs the caching allocator (not TG_CUDA_NO_CACHING=1, the
  // sanitizer runs, where every tensor is its own cudaMalloc) and no
  // synchronisation after each kernel (not TG_CUDA_SYNC=1).
  if (!tg::cuda::caching_enabled() || tg::cuda::sync_debug()) {
    cudaStreamDestroy(stream);
    return;
  }
  for (const tg::Tensor& t : outs) tg::Tensor(t).fill_(NAN);
  tg::cuda::synchronize();
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  const int rc = call(s.S, s.C, s.H, s.M, stream);
  REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  INFO(tg_last_error());
  REQUIRE(rc == 0);
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  for (size_t i = 0; i < outs.size(); ++i) CHECK(relative_error(outs[i], w[i]) < 1e-5);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Repeated calls with the same arguments (core/cuda.h, GraphReplay): the
// first runs directly, the second on the C API's private stream, the third
// captures a graph and launches it, later ones launch it. Every call gets new
// values in the same input buffers and NaN in its outputs, queued on the
// caller's stream, and is compared with the C++ function on the same values
// in other buffers: a replay must read its inputs anew, write every output,
// and be ordered after and before the caller's stream's work by its events
// (only the caller's stream is synchronised). Between the fourth and fifth
// calls empty_cache runs and a new tensor is filled: the graph's pinned
// blocks must not be handed to it. Then a new scale with the same pointers is
// a new key, run directly. The bound, 1e-3, leaves room for the order of the
// atomic sums (sums that cancel differed by up to 3e-5 between two runs at
// "high", see above); stale inputs or unwritten outputs miss it by orders of
// magnitude.
void check_replayed_calls(const Spec& s, tg_precision precision, cudaStream_t stream) {
  const double scale = 1 / std::sqrt(64.0);
  const tg::MatmulPrecision mp = precision == TG_PRECISION_HIGH ? tg::MatmulPrecision::High : tg::MatmulPrecision::Highest;
  const tg::cuda::StreamGuard guard(stream);  // the inputs, the outputs' poison and the reference on the caller's stream
  const BackwardInputs in = make_backward_inputs(s);
  const std::vector<tg::Tensor> buffers = inputs_of(in);
  std::vector<tg::Tensor> outs;
  for (const tg::Tensor& t : outputs_of(tg::fused::region_attention_backward(in, scale, s.p, mp)))
    outs.push_back(tg::empty(t.shape(), {tg::DType::Float32, tg::Device::CUDA}));
  std::vector<const float*> ip;
  for (const tg::Tensor& t : buffers) ip.push_back(t.data<float>());
  std::vector<float*> op;
  for (const tg::Tensor& t : outs) op.push_back(t.data<float>());
  const std::size_t launches_before = tg::capi::graph_launches();
  tg::Tensor sentinel;
  for (int call = 1; call <= 6; ++call) {
    CAPTURE(call);
    const double call_scale = call < 6 ? scale : 0.5 * scale;
    const BackwardInputs fresh = make_backward_inputs(s);
    const std::vector<tg::Tensor> values = inputs_of(fresh);
    for (size_t i = 0; i < buffers.size(); ++i) tg::Tensor(buffers[i]).copy_(values[i]);
    for (const tg::Tensor& t : outs) tg::Tensor(t).fill_(NAN);
    REQUIRE(tg_region_attention_backward(ip.data(), float(call_scale), float(s.p), s.B, s.S, s.C, s.H, s.M, op.data(),
                                         precision, stream) == 0);
    const auto want = outputs_of(tg::fused::region_attention_backward(fresh, call_scale, s.p, mp));
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    for (size_t i = 0; i < outs.size(); ++i) CHECK(relative_error(outs[i], want[i]) < 1e-3);
    const std::size_t replays = tg::cuda::graph_replay_enabled() ? std::clamp(call - 2, 0, 3) : 0;
    CHECK(tg::capi::graph_launches() - launches_before == replays);
    if (call == 4) {  // dqkv's size: were the graph's blocks released, cudaMalloc would likely hand one back
      tg::cuda::empty_cache();
      sentinel = tg::full({s.B * s.S, 3 * s.C}, 7.0, {tg::DType::Float32, tg::Device::CUDA});
    }
  }
  const std::vector<double> kept = sentinel.to_vector();
  CHECK(std::all_of(kept.begin(), kept.end(), [](double v) { return v == 7.0; }));
}

// A non-blocking stream, destroyed (after its work) however the test ends.
struct OwnStream {
  cudaStream_t stream = nullptr;
  OwnStream() { REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess); }
  ~OwnStream() { cudaStreamDestroy(stream); }
  OwnStream(const OwnStream&) = delete;
  OwnStream& operator=(const OwnStream&) = delete;
};

TEST_CASE("fused/C API: repeated calls replay a CUDA graph that reads each call's inputs" * doctest::skip(kNoGpu)) {
  tg::manual_seed(106);
  const OwnStream own;
  SUBCASE("high, the legacy default stream") { check_replayed_calls({2, 100, 128, 2, 120}, TG_PRECISION_HIGH, nullptr); }
  SUBCASE("high, a non-blocking stream") { check_replayed_calls({2, 100, 128, 2, 120}, TG_PRECISION_HIGH, own.stream); }
  SUBCASE("highest, B = 1, a non-blocking stream") {
    check_replayed_calls({1, 77, 128, 2, 120}, TG_PRECISION_HIGHEST, own.stream);
  }
}
#endif
