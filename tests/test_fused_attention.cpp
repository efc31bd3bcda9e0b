// fused/ on the CPU: the algorithm the fused kernels implement (key blocks
// with an online softmax, P recomputed from the log-sum-exp, Delta from do . o,
// the Philox mask regenerated) against the decomposed graph in float64, and
// the benchmark interface's backward (P read, the careful qkv bias) likewise,
// each at chosen edge cases and at problems drawn at random.
#include <algorithm>
#include <array>
#include <cmath>
#include <ostream>
#include <random>

#include "helpers.h"
#include "ops/fused_attention_kernels.h"

using namespace tgtest;

namespace {

struct Layer {
  tg::RegionAttentionParams params;
  tg::Tensor x, e, a;
};

Layer make_layer(int64_t B, int64_t S, int64_t C, int64_t H, int64_t M, tg::Tensor e, tg::Tensor a) {
  tg::RegionAttentionParams p = tg::RegionAttentionParams::init({C, H, M}, {tg::DType::Float64});
  for (tg::Tensor* t : {&p.qkv_weight, &p.out_weight}) *t = tg::mul(*t, 10.0).detach().requires_grad_();  // O(1) scores
  p.qkv_bias = tg::mul(tg::randn({3 * C}, {tg::DType::Float64}), 0.1).requires_grad_();
  p.edit_region_bias = tg::mul(tg::randn({H, M, M}, {tg::DType::Float64}), 0.5).requires_grad_();
  return {p, randn64({B, S, C}), e, a};
}

// The output and every gradient (x's, then the parameters') of the
// decomposed graph (first) and the fused op (second), on one Philox draw.
std::array<std::vector<tg::Tensor>, 2> run_both(const Layer& L, double p) {
  const tg::PhiloxState rng{17, 4};
  std::array<std::vector<tg::Tensor>, 2> out;
  const tg::Tensor dy = tg::randn(L.x.shape(), {tg::DType::Float64});
  for (int k = 0; k < 2; ++k) {
    const tg::RegionAttentionParams params = L.params.trainable_copy(tg::Device::CPU);
    tg::Tensor x = L.x.detach().clone().requires_grad_();
    const tg::AttentionImpl impl = k == 0 ? tg::AttentionImpl::Decomposed : tg::AttentionImpl::Fused;
    const tg::Tensor y = tg::region_attention(x, L.e, L.a, params, {p, rng}, impl);
    y.backward(dy);
    out[k] = {y, x.grad()};
    for (const tg::Tensor& t : params.parameters()) out[k].push_back(t.grad());
  }
  return out;
}

// Forward and every gradient of both implementations; max |fused - decomposed|.
void check_fused_matches_decomposed(const Layer& L, double p, double tol = 1e-10) {
  const auto [decomposed, fused] = run_both(L, p);
  for (size_t i = 0; i < decomposed.size(); ++i) {
    CAPTURE(i);
    REQUIRE(fused[i].defined());
    CHECK(max_abs_diff(fused[i], decomposed[i]) < tol);
  }
}

tg::Tensor mask64(std::vector<double> v, int64_t B, int64_t S) { return tg::from_vector(v, {B, S}, {tg::DType::Float64}); }

}  // namespace

TEST_CASE("fused/cpu float64: the fused algorithm equals the decomposed graph") {
  tg::manual_seed(31);
  SUBCASE("mixed edit mask, masked keys, p = 0.1, S = 70 (two key blocks, the second partial)") {
    const int64_t B = 2, S = 70;
    tg::Tensor a = tg::dropout_mask({B, S}, 0.2, {5, 5}, {tg::DType::Float64});
    check_fused_matches_decomposed(
        make_layer(B, S, 16, 2, 75, tg::dropout_mask({B, S}, 0.5, {6, 6}, {tg::DType::Float64}), a), 0.1);
  }
  SUBCASE("all inside, p = 0") {
    check_fused_matches_decomposed(make_layer(2, 9, 8, 2, 9, tg::ones({2, 9}, {tg::DType::Float64}),
                                              tg::ones({2, 9}, {tg::DType::Float64})),
                                   0.0);
  }
  SUBCASE("all outside, one batch fully masked, p = 0.1") {
    tg::Tensor a = tg::ones({2, 7}, {tg::DType::Float64});
    a.narrow(0, 0, 1).fill_(0.0);
    check_fused_matches_decomposed(make_layer(2, 7, 12, 3, 8, tg::zeros({2, 7}, {tg::DType::Float64}), a), 0.1);
  }
  SUBCASE("a whole key block masked before unmasked keys (S = 150: the online softmax starts at block 1 or 2)") {
    const int64_t B = 2, S = 150;
    tg::Tensor a = tg::ones({B, S}, {tg::DType::Float64});
    a.narrow(1, 0, 70).fill_(0.0);                   // block 0 and part of block 1, in both batches
    a.narrow(0, 1, 1).narrow(1, 70, 58).fill_(0.0);  // batch 1: the rest of block 1 too
    const tg::Tensor e = tg::dropout_mask({B, S}, 0.5, {7, 7}, {tg::DType::Float64});
    check_fused_matches_decomposed(make_layer(B, S, 8, 2, S, e, a), 0.15);
  }
  SUBCASE("S = 1 and S = 2") {
    check_fused_matches_decomposed(make_layer(3, 1, 8, 2, 4, mask64({1, 0, 1}, 3, 1), mask64({1, 1, 1}, 3, 1)), 0.1);
    check_fused_matches_decomposed(make_layer(1, 2, 8, 1, 2, mask64({1, 0}, 1, 2), mask64({0, 1}, 1, 2)), 0.1);
  }
}

namespace {

// A problem drawn at random for the sweeps below, from std::mt19937 alone
// (its sequence is fixed by the standard, unlike the distributions'), so
// that a failure reproduces anywhere: B 1-max_B, S from the given range,
// heads 1-3 of head dim 2-max_D, M from S to S + 4, p 0 (every third draw)
// or up to 0.6, key and edit masks at random rates up to 0.6, and every
// other draw one batch's keys all masked (when there is another batch).
struct RandomProblem {
  int64_t B, S, H, D, M;
  double p;
  Layer layer;
};

RandomProblem draw_problem(std::mt19937& gen, int draw, int64_t max_B, int64_t min_S, int64_t max_S, int64_t max_D) {
  const auto uniform = [&](int64_t lo, int64_t hi) { return lo + int64_t(gen() % uint64_t(hi - lo + 1)); };
  const auto rate = [&] { return 0.6 * double(gen()) / 0x1p32; };
  const int64_t B = uniform(1, max_B), S = uniform(min_S, max_S), H = uniform(1, 3), D = uniform(2, max_D);
  const int64_t M = S + uniform(0, 4);
  const double p = draw % 3 == 0 ? 0.0 : rate();
  const double key_rate = rate(), edit_rate = rate();
  const uint64_t key_seed = gen(), edit_seed = gen(), layer_seed = gen();
  const tg::TensorOptions f64{tg::DType::Float64};
  tg::Tensor a = tg::dropout_mask({B, S}, key_rate, {key_seed, 1}, f64);
  if (draw % 2 == 1 && B > 1) a.narrow(0, draw % B, 1).fill_(0.0);
  const tg::Tensor e = tg::dropout_mask({B, S}, edit_rate, {edit_seed, 2}, f64);
  tg::manual_seed(layer_seed);
  return {B, S, H, D, M, p, make_layer(B, S, H * D, H, M, e, a)};
}

std::ostream& operator<<(std::ostream& os, const RandomProblem& r) {
  return os << "B " << r.B << " S " << r.S << " H " << r.H << " D " << r.D << " M " << r.M << " p " << r.p;
}

}  // namespace

// The fused op at random problems: S 1-45 or, every fourth draw, 60-70
// (around the key block of 64).
TEST_CASE("fused/cpu float64: random shapes, masks and dropout rates equal the decomposed graph") {
  std::mt19937 gen(2026);
  for (int draw = 0; draw < 12; ++draw) {
    const bool long_rows = draw % 4 == 2;
    const RandomProblem r = draw_problem(gen, draw, 3, long_rows ? 60 : 1, long_rows ? 70 : 45, 9);
    INFO("draw " << draw << ": " << r);
    check_fused_matches_decomposed(r.layer, r.p);
  }
}

namespace {

// The benchmark interface's backward from the saved tensors of a decomposed
// forward (dropout keep-mask m, rate p), against the graph's own backward,
// every output poisoned with NaN first (every element must be written). The
// graph's backward adds into L's parameter gradients: one call per Layer.
void check_interface_matches_graph(const Layer& L, const tg::Tensor& m, double p) {
  const int64_t B = L.x.size(0), S = L.x.size(1), C = L.x.size(2), H = L.params.edit_region_bias.size(0),
                D = C / H, M = L.params.edit_region_bias.size(1);
  const tg::TensorOptions f64{tg::DType::Float64};
  tg::Tensor x = L.x.detach().clone().requires_grad_();
  const tg::RegionAttentionParams& P = L.params;
  const tg::Tensor qkv = tg::linear(x, P.qkv_weight, P.qkv_bias).view({B, S, 3, H, D}).permute({2, 0, 3, 1, 4});
  const tg::Tensor q = qkv.narrow(0, 0, 1).squeeze(0).contiguous(), k = qkv.narrow(0, 1, 1).squeeze(0).contiguous(),
                   v = qkv.narrow(0, 2, 1).squeeze(0).contiguous();
  tg::Tensor s = tg::mul(tg::matmul(q, k.transpose(-1, -2)), 1 / std::sqrt(double(D)));
  s = tg::add(s, tg::edit_bias(P.edit_region_bias, P.within_edit_bias, P.cross_edit_bias, L.e));
  s = tg::masked_fill(s, tg::add(tg::neg(L.a), 1.0).view({B, 1, 1, S}), -INFINITY);
  const tg::Tensor probs = tg::softmax(s), dropped = tg::dropout(probs, {p, std::nullopt, m});
  const tg::Tensor o = tg::matmul(dropped, v).permute({0, 2, 1, 3}).reshape({B, S, C});
  const tg::Tensor y = tg::linear(o, P.out_weight, P.out_bias);
  const tg::Tensor dy = tg::randn({B, S, C}, f64);
  y.backward(dy);
  tg::NoGradGuard no_grad;
  const tg::fused::BackwardInputs in{dy, x.detach(), L.e, P.qkv_weight.detach(), P.qkv_bias.detach(),
                                     P.out_weight.detach(), P.out_bias.detach(), P.edit_region_bias.detach(),
                                     P.within_edit_bias.detach(), P.cross_edit_bias.detach(), L.a, q.detach(),
                                     k.detach(), v.detach(), s.detach(), probs.detach(), dropped.detach(),
                                     o.detach(), m};
  const auto poisoned = [&](const tg::Shape& shape) { return tg::full(shape, std::nan(""), f64); };
  const tg::fused::Gradients g{poisoned({B, S, C}), poisoned({3 * C, C}), poisoned({3 * C}), poisoned({C, C}),
                               poisoned({C}),       poisoned({H, M, M}),  poisoned({H, 1, 1}), poisoned({H, 1, 1})};
  tg::fused::region_attention_backward_into(in, 1 / std::sqrt(double(D)), p, tg::MatmulPrecision::Default, g);
  for (const tg::Tensor& t : tg::fused::outputs_of(g)) CHECK(t.version() == 1);  // written in place, like copy_
  CHECK(max_abs_diff(g.hidden_states, x.grad()) < 1e-10);
  CHECK(max_abs_diff(g.qkv_weight, P.qkv_weight.grad()) < 1e-10);
  CHECK(max_abs_diff(g.qkv_bias, P.qkv_bias.grad()) < 1e-10);
  CHECK(max_abs_diff(g.out_weight, P.out_weight.grad()) < 1e-10);
  CHECK(max_abs_diff(g.out_bias, P.out_bias.grad()) < 1e-10);
  CHECK(max_abs_diff(g.edit_region_bias, P.edit_region_bias.grad()) < 1e-10);
  CHECK(max_abs_diff(g.within_edit_bias, P.within_edit_bias.grad()) < 1e-10);
  CHECK(max_abs_diff(g.cross_edit_bias, P.cross_edit_bias.grad()) < 1e-10);
}

}  // namespace

// The bias sums' chunks of 16 rows: one chunk in all (1, 11), one per batch
// (2, 11), whole and partial ones within each batch (3, 37); no rows (0, 5).
TEST_CASE("fused/cpu float64: the benchmark interface backward equals the decomposed graph's") {
  for (const auto& [B, S] : {std::pair<int64_t, int64_t>{1, 11}, {2, 11}, {3, 37}, {0, 5}}) {
    CAPTURE(S);
    tg::manual_seed(32);
    const int64_t C = 16, H = 2;
    const tg::TensorOptions f64{tg::DType::Float64};
    const Layer L = make_layer(B, S, C, H, S + 2, tg::dropout_mask({B, S}, 0.5, {8, 1}, f64),
                               tg::dropout_mask({B, S}, 0.1, {8, 2}, f64));
    check_interface_matches_graph(L, tg::dropout_mask({B, H, S, S}, 0.1, {9, 9}, f64), 0.1);
  }
}

// The same at random problems (draw_problem): S 1-40.
TEST_CASE("fused/cpu float64: the benchmark interface at random shapes, masks and rates") {
  std::mt19937 gen(2027);
  for (int draw = 0; draw < 10; ++draw) {
    const RandomProblem r = draw_problem(gen, draw, 4, 1, 40, 8);
    INFO("draw " << draw << ": " << r);
    const tg::Tensor m = tg::dropout_mask({r.B, r.H, r.S, r.S}, r.p, {gen(), 3}, {tg::DType::Float64});
    check_interface_matches_graph(r.layer, m, r.p);
  }
}

// The "highest" benchmark interface forms dw_in and dw_x from four row sums
// (ops/fused_attention.cu, kRowSums; docs/derivations.md): the identity, in
// float64 loops, on rows with masked keys and on a fully masked row.
TEST_CASE("fused/cpu float64: the edit-bias scalars from the row sums A, B, m, n") {
  tg::manual_seed(5);
  const int64_t rows = 6, S = 9;
  const std::vector<double> u = tg::rand({S}).to_vector(), dP = tg::randn({rows, S}).to_vector();
  std::vector<double> e(S);
  for (int64_t j = 0; j < S; ++j) e[j] = u[j] < 0.5 ? 1.0 : 0.0;
  std::vector<double> P(rows * S, 0.0);
  for (int64_t i = 0; i + 1 < rows; ++i) {  // the last row: every key masked, P = 0
    double total = 0;
    for (int64_t j = 0; j < S; ++j) total += P[i * S + j] = (j + i) % 4 == 0 ? 0.0 : std::exp(0.3 * double(i - j));
    for (int64_t j = 0; j < S; ++j) P[i * S + j] /= total;
  }
  double in_direct = 0, x_direct = 0, in_rows = 0, x_rows = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const double ei = e[i % S];
    double R = 0, A = 0, B = 0, m = 0, n = 0;
    for (int64_t j = 0; j < S; ++j) R += P[i * S + j] * dP[i * S + j];
    for (int64_t j = 0; j < S; ++j) {
      const double p = P[i * S + j], pdp = p * dP[i * S + j], dS = p * (dP[i * S + j] - R);
      in_direct += dS * ei * e[j];
      x_direct += dS * (ei * (1 - e[j]) + (1 - ei) * e[j]);
      A += pdp * e[j], B += pdp * (1 - e[j]), m += p * e[j], n += p * (1 - e[j]);
    }
    in_rows += ei * (A - (A + B) * m);
    x_rows += ei * (B - (A + B) * n) + (1 - ei) * (A - (A + B) * m);
  }
  CHECK(std::abs(in_direct) > 1e-3);  // not a trivial zero
  CHECK(std::abs(in_rows - in_direct) < 1e-12);
  CHECK(std::abs(x_rows - x_direct) < 1e-12);
}

// The CUDA backward sums dw_in and dw_x per key j, over the queries i a block
// walks: X_j = sum_i dS_ij e_i and T_j = sum_i dS_ij (docs/derivations.md).
TEST_CASE("fused/cpu float64: the edit-bias scalars from the per-key sums X, T") {
  tg::manual_seed(6);
  const int64_t rows = 7, S = 9;
  const std::vector<double> u = tg::rand({rows + S}).to_vector(), dS = tg::randn({rows, S}).to_vector();
  std::vector<double> e_query(rows), e_key(S);
  for (int64_t i = 0; i < rows; ++i) e_query[i] = u[i] < 0.5 ? 1.0 : 0.0;
  for (int64_t j = 0; j < S; ++j) e_key[j] = u[rows + j] < 0.5 ? 1.0 : 0.0;
  double in_direct = 0, x_direct = 0, in_keys = 0, x_keys = 0;
  for (int64_t j = 0; j < S; ++j) {
    const double ej = e_key[j];
    double X = 0, T = 0;
    for (int64_t i = 0; i < rows; ++i) {
      const double ei = e_query[i], ds = dS[i * S + j];
      in_direct += ds * ei * ej;
      x_direct += ds * (ei * (1 - ej) + (1 - ei) * ej);
      X += ds * ei, T += ds;
    }
    in_keys += ej * X;
    x_keys += (1 - ej) * X + ej * (T - X);
  }
  CHECK(std::abs(in_direct) > 1e-3);  // not trivial zeros
  CHECK(std::abs(x_direct) > 1e-3);
  CHECK(std::abs(in_keys - in_direct) < 1e-12);
  CHECK(std::abs(x_keys - x_direct) < 1e-12);
}

// A NaN or +inf in an input: the fused op's output and gradients hold NaN
// (or Inf) exactly where the decomposed graph's do (its online softmax
// passes over NaN in the row max, so the row's sum must carry it), and the
// finite elements agree.
TEST_CASE("fused/cpu float64: a NaN or Inf in an input shows where the decomposed graph's does") {
  const int64_t B = 2, S = 5, C = 8, H = 2, M = 6;
  const tg::Tensor all_keys = tg::ones({B, S}, {tg::DType::Float64});
  const auto poisoned = [&](const std::string& what, auto poison, const tg::Tensor& a) {
    const tg::Tensor e = mask64({1, 0, 1, 1, 0, 0, 0, 1, 1, 0}, B, S);
    Layer L = make_layer(B, S, C, H, M, e, a);
    {
      tg::NoGradGuard no_grad;  // the poison is written into leaves
      poison(L);
    }
    for (double p : {0.0, 0.3}) {
      CAPTURE(what);
      CAPTURE(p);
      const auto [decomposed, fused] = run_both(L, p);
      const std::vector<bool> y_finite = finite_pattern(decomposed[0]);
      CHECK(std::count(y_finite.begin(), y_finite.end(), false) > 0);  // the poison reaches the output
      for (size_t i = 0; i < decomposed.size(); ++i) {
        CAPTURE(i);
        REQUIRE(fused[i].defined());
        const std::vector<bool> finite = finite_pattern(decomposed[i]);
        CHECK(finite_pattern(fused[i]) == finite);
        std::vector<double> spoilt;
        for (bool f : finite) spoilt.push_back(f ? 0.0 : 1.0);
        const tg::Tensor mask = tg::from_vector(spoilt, decomposed[i].shape(), {tg::DType::Float64});
        CHECK(max_abs_diff(tg::masked_fill(fused[i], mask, 0.0), tg::masked_fill(decomposed[i], mask, 0.0)) < 1e-10);
      }
    }
  };
  const auto x_at = [](int64_t b, int64_t i, double v) {
    return [=](Layer& L) { L.x.narrow(0, b, 1).narrow(1, i, 1).narrow(2, 3, 1).fill_(v); };
  };
  const auto E_at = [](int64_t h, int64_t i, int64_t j, double v) {
    return [=](Layer& L) { L.params.edit_region_bias.narrow(0, h, 1).narrow(1, i, 1).narrow(2, j, 1).fill_(v); };
  };
  poisoned("x[0, 0, 3] = NaN", x_at(0, 0, NAN), all_keys);
  poisoned("x[1, 2, 3] = +inf", x_at(1, 2, INFINITY), all_keys);
  poisoned("edit_region_bias[1, 0, 2] = NaN", E_at(1, 0, 2, NAN), all_keys);
  poisoned("within_edit_bias[0] = NaN", [](Layer& L) { L.params.within_edit_bias.narrow(0, 0, 1).fill_(NAN); }, all_keys);
  poisoned("cross_edit_bias[1] = -inf", [](Layer& L) { L.params.cross_edit_bias.narrow(0, 1, 1).fill_(-INFINITY); },
           all_keys);
  // Key 2 masked in batch 0 only: the NaN bias at it spoils row 0 of head 1 in batch 1 alone (on the CPU a
  // masked key's score is -inf whatever its bias; the CUDA kernels differ there: ops/fused_attention.h).
  poisoned("edit_region_bias[1, 0, 2] = NaN at a key masked in batch 0", E_at(1, 0, 2, NAN),
           mask64({1, 1, 0, 1, 1, 1, 1, 1, 1, 1}, B, S));
}

TEST_CASE("fused/cpu: an empty batch or sequence gives zero gradients") { check_empty_fused_attention(tg::Device::CPU); }

TEST_CASE("errors/fused attention") {
  const tg::Tensor qkv = tg::zeros({1, 3, 24}), e = tg::zeros({1, 3}), a = tg::ones({1, 3});
  const tg::Tensor E = tg::zeros({2, 4, 4}), w = tg::zeros({2, 1, 1});
  CHECK(error_of([&] { tg::fused_attention(tg::zeros({1, 3, 25}), e, a, E, w, w, 2); }) ==
        "fused_attention: qkv [1,3,25] does not split into 3 x 2 heads");
  CHECK(error_of([&] { tg::fused_attention(qkv, e, a, tg::zeros({2, 2, 2}), w, w, 2); }) ==
        "fused_attention: sequence length 3 of qkv [1,3,24] exceeds the 2 positions of edit_region_bias [2,2,2]");
  CHECK(contains(error_of([&] { tg::fused_attention(qkv, e, a, E, w, w, 2, {0.1, std::nullopt, tg::ones({1, 2, 3, 3})}); }),
                 "an explicit dropout mask is not supported"));
  CHECK(error_of([&] { tg::fused_attention(qkv, e, tg::from_vector({1, 3, 1}, {1, 3}), E, w, w, 2); }) ==
        "fused_attention: attn_mask [1,3] must hold only 0 and 1; element 1 is 3");
  // p under 1 as a double but 1 as a float, which the kernels' keep threshold cannot express
  CHECK(error_of([&] { tg::fused_attention(qkv, e, a, E, w, w, 2, {0.99999999}); }) ==
        "fused_attention: dropout p must be in [0, 1 - 2^-16] as a float (dropout draws 16 bits), got 0.99999999");
  // past 1 - 2^-16 the 16-bit draws would keep more than 1 - p (at 1 - 1e-7 some 150 times more)
  CHECK(error_of([&] { tg::fused_attention(qkv, e, a, E, w, w, 2, {1.0 - 1e-7}); }) ==
        "fused_attention: dropout p must be in [0, 1 - 2^-16] as a float (dropout draws 16 bits), got 0.9999999");
  CHECK(error_of([&] { tg::fused_attention(qkv, e, a, E, w, w, 2, {1.0 - 0x1p-16}); }).empty());
  // The CUDA grids' limit on (b, h) pairs (checked on any device: no data is needed).
  CHECK(error_of([] { tg::check_cuda_batch_heads("fused_attention", 32768, 2); }) ==
        "fused_attention: batch 32768 x heads 2 = 65536 exceeds the CUDA kernels' limit of 65535 (b, h) pairs");
  CHECK(error_of([] { tg::check_cuda_batch_heads("fused_attention", 4095, 16); }).empty());
}

// The benchmark interface refuses, before writing anything: an output that
// shares memory with an input or another output, a non-finite scale, and on the CPU a mask
// value other than 0 and 1 (on CUDA masks are taken as given: ops/fused_attention.h).
TEST_CASE("errors/benchmark interface: an output over an input or another output, a non-finite scale, masks not 0/1") {
  const int64_t B = 1, S = 3, C = 4, H = 2, D = 2, M = 4;
  const tg::TensorOptions f64{tg::DType::Float64};
  const auto z = [&](const tg::Shape& shape) { return tg::zeros(shape, f64); };
  tg::fused::BackwardInputs in{z({B, S, C}),    z({B, S, C}),    z({B, S}),       z({3 * C, C}),   z({3 * C}),
                               z({C, C}),       z({C}),          z({H, M, M}),    z({H, 1, 1}),    z({H, 1, 1}),
                               tg::ones({B, S}, f64), z({B, H, S, D}), z({B, H, S, D}), z({B, H, S, D}),
                               z({B, H, S, S}), z({B, H, S, S}), z({B, H, S, S}), z({B, S, C}),    z({B, H, S, S})};
  const auto outputs = [&] {
    return tg::fused::Gradients{tg::full({B, S, C}, 7.0, f64), z({3 * C, C}), z({3 * C}), z({C, C}),
                                z({C}),                        z({H, M, M}), z({H, 1, 1}), z({H, 1, 1})};
  };
  const auto run = [&](const tg::fused::Gradients& g, double scale = 0.5) {
    return error_of([&] { tg::fused::region_attention_backward_into(in, scale, 0.1, tg::MatmulPrecision::Default, g); });
  };
  CHECK(run(outputs()).empty());
  tg::fused::Gradients g = outputs();
  g.out_bias = in.qkv_bias.narrow(0, C, C);  // a view into an input
  CHECK(run(g) == "region_attention_backward: output grad_out_bias overlaps input qkv_bias (the inputs must not change)");
  g = outputs();
  g.cross_edit_bias = g.within_edit_bias;  // one buffer for two outputs
  CHECK(run(g) == "region_attention_backward: outputs grad_within_edit_bias [2,1,1] and grad_cross_edit_bias [2,1,1] "
                  "share memory");
  g = outputs();
  g.out_bias = g.out_weight.view({C * C}).narrow(0, 2, C);  // inside another output
  CHECK(run(g) == "region_attention_backward: outputs grad_out_weight [4,4] and grad_out_bias [4] share memory");
  CHECK(g.hidden_states.to_vector() == std::vector<double>(B * S * C, 7.0));  // nothing written
  g = outputs();
  CHECK(run(g, NAN) == "region_attention_backward: scale must be finite, got nan");
  CHECK(error_of([&] { tg::fused::region_attention_backward_into(in, 0.5, 1.0, tg::MatmulPrecision::Default, g); }) ==
        "region_attention_backward: dropout_p must be in [0, 1) as a float, got 1");
  CHECK(g.hidden_states.to_vector() == std::vector<double>(B * S * C, 7.0));  // nothing written
  in.attention_mask = tg::from_vector({1, 0.5, 1}, {B, S}, f64);
  CHECK(run(g) == "region_attention_backward: attention_mask [1,3] must hold only 0 and 1; element 1 is 0.5");
  CHECK(g.hidden_states.to_vector() == std::vector<double>(B * S * C, 7.0));
  for (const tg::Tensor& t : tg::fused::outputs_of(g)) CHECK(t.version() == 0);  // refused: no version bumped
}

TEST_CASE("errors/fused attention layer: both projections' arguments checked, errors naming the layer") {
  const tg::Tensor x = tg::zeros({1, 3, 5}), W = tg::zeros({24, 5}), b = tg::zeros({24}), Wo = tg::zeros({4, 8});
  const tg::Tensor e = tg::zeros({1, 3}), a = tg::ones({1, 3}), E = tg::zeros({2, 4, 4}), w = tg::zeros({2, 1, 1});
  const auto call = [&](const tg::Tensor& xx, const tg::Tensor& WW, const tg::Tensor& bo) {
    return error_of([&] { tg::fused_attention_layer(xx, W, b, e, a, E, w, w, WW, bo, 2); });
  };
  CHECK(call(x, Wo, tg::zeros({4})).empty());
  CHECK(call(x, Wo, tg::Tensor()).empty());
  CHECK(call(tg::zeros({3, 5}), Wo, tg::Tensor()) == "fused_attention_layer: x must be [B,S,C], got [3,5]");
  CHECK(call(x, tg::Tensor(), tg::Tensor()) == "fused_attention_layer: argument 'out_weight' is an undefined tensor");
  CHECK(call(x, tg::zeros({4, 7}), tg::Tensor()) ==
        "fused_attention_layer: out_weight must be [out, 8] for the attention's 8 columns, got [4,7]");
  CHECK(call(x, Wo, tg::zeros({5})) == "fused_attention_layer: out_bias must be [4] for out_weight [4,8], got [5]");
  CHECK(call(x, Wo, tg::zeros({4}, {tg::DType::Float64})) ==
        "fused_attention_layer: tensors have different dtypes (float32 [1,3,5] vs float64 [4])");
}

TEST_CASE("errors/fused qkv attention: every argument checked before the projection runs") {
  const tg::Tensor x = tg::zeros({1, 3, 5}), W = tg::zeros({24, 5}), b = tg::zeros({24});
  const tg::Tensor e = tg::zeros({1, 3}), a = tg::ones({1, 3}), E = tg::zeros({2, 4, 4}), w = tg::zeros({2, 1, 1});
  const auto call = [&](const tg::Tensor& xx, const tg::Tensor& WW, const tg::Tensor& bb, const tg::Tensor& aa,
                        const tg::Tensor& EE, int64_t heads, tg::DropoutOptions drop = {}) {
    return error_of([&] { tg::fused_qkv_attention(xx, WW, bb, e, aa, EE, w, w, heads, drop); });
  };
  CHECK(call(x, W, b, a, E, 2).empty());
  CHECK(call(tg::zeros({3, 5}), W, b, a, E, 2) == "fused_qkv_attention: x must be [B,S,C], got [3,5]");
  CHECK(call(x, tg::zeros({24, 4}), b, a, E, 2) ==
        "fused_qkv_attention: qkv_weight must be [3 H D, 5] for x [1,3,5], got [24,4]");
  CHECK(call(x, W, tg::zeros({23}), a, E, 2) ==
        "fused_qkv_attention: qkv_bias must be [24] for qkv_weight [24,5], got [23]");
  CHECK(call(x, tg::zeros({25, 5}), tg::Tensor(), a, E, 2) ==
        "fused_qkv_attention: the projection x W^T [1,3,25] does not split into 3 x 2 heads");
  CHECK(call(x, W, b, a, tg::zeros({2, 2, 2}), 2) ==
        "fused_qkv_attention: sequence length 3 of the projection x W^T [1,3,24] exceeds the 2 positions of "
        "edit_region_bias [2,2,2]");
  CHECK(call(x, W, b, tg::from_vector({1, 3, 1}, {1, 3}), E, 2) ==
        "fused_qkv_attention: attn_mask [1,3] must hold only 0 and 1; element 1 is 3");
  CHECK(call(x, W, b, a, E, 2, {0.99999999}) ==
        "fused_qkv_attention: dropout p must be in [0, 1 - 2^-16] as a float (dropout draws 16 bits), got 0.99999999");
}
