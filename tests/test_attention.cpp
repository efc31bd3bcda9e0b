// The decomposed region-aware attention layer against a direct float64
// implementation of the spec's forward and backward formulas, written here
// independently of the ops, and gradcheck over the whole layer.
#include <limits>

#include "helpers.h"

using namespace tgtest;

namespace {

struct Dims {
  int64_t B, S, C, H, M;
  int64_t D() const { return C / H; }
};

// Plain arrays, row-major, in the spec's layouts.
struct Problem {
  Dims d;
  std::vector<double> x, e, a, Wqkv, bqkv, Wo, bo, E, win, wx, m, dy;
  double p;
};

struct Result {
  std::vector<double> y, dx, dWqkv, dbqkv, dWo, dbo, dE, dwin, dwx;
};

// The spec, loop by loop.
Result reference(const Problem& pr) {
  const auto [B, S, C, H, M] = pr.d;
  const int64_t D = pr.d.D(), C3 = 3 * C;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D)), keep_scale = 1.0 / (1.0 - pr.p);
  auto qkv_at = [&](const std::vector<double>& t, int64_t b, int64_t s, int64_t j) -> double { return t[(b * S + s) * C3 + j]; };
  std::vector<double> qkv(B * S * C3);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t j = 0; j < C3; ++j) {
        double acc = pr.bqkv[j];
        for (int64_t c = 0; c < C; ++c) acc += pr.x[(b * S + s) * C + c] * pr.Wqkv[j * C + c];
        qkv[(b * S + s) * C3 + j] = acc;
      }
  auto q = [&](int64_t b, int64_t h, int64_t s, int64_t dd) { return qkv_at(qkv, b, s, 0 * C + h * D + dd); };
  auto k = [&](int64_t b, int64_t h, int64_t s, int64_t dd) { return qkv_at(qkv, b, s, 1 * C + h * D + dd); };
  auto v = [&](int64_t b, int64_t h, int64_t s, int64_t dd) { return qkv_at(qkv, b, s, 2 * C + h * D + dd); };
  auto idx4 = [&](int64_t b, int64_t h, int64_t i, int64_t j) { return ((b * H + h) * S + i) * S + j; };

  std::vector<double> P(B * H * S * S), Pd(B * H * S * S), o(B * S * C, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < S; ++i) {
        std::vector<double> row(S);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < S; ++j) {
          const double ei = pr.e[b * S + i], ej = pr.e[b * S + j];
          double s = 0;
          for (int64_t dd = 0; dd < D; ++dd) s += q(b, h, i, dd) * k(b, h, j, dd);
          s = scale * s + pr.E[(h * M + i) * M + j] + pr.win[h] * ei * ej + pr.wx[h] * (ei * (1 - ej) + (1 - ei) * ej);
          row[j] = pr.a[b * S + j] == 0 ? -std::numeric_limits<double>::infinity() : s;
          mx = std::max(mx, row[j]);
        }
        double total = 0;
        for (int64_t j = 0; j < S; ++j) total += std::isinf(mx) ? 0 : std::exp(row[j] - mx);
        for (int64_t j = 0; j < S; ++j) {
          const int64_t n = idx4(b, h, i, j);
          P[n] = std::isinf(mx) ? 0 : std::exp(row[j] - mx) / total;
          Pd[n] = P[n] * pr.m[n] * keep_scale;
          for (int64_t dd = 0; dd < D; ++dd) o[(b * S + i) * C + h * D + dd] += Pd[n] * v(b, h, j, dd);
        }
      }

  Result r;
  r.y.assign(B * S * C, 0.0);
  r.dWo.assign(C * C, 0.0);
  r.dbo.assign(C, 0.0);
  std::vector<double> dO(B * S * C, 0.0);
  for (int64_t t = 0; t < B * S; ++t)
    for (int64_t n = 0; n < C; ++n) {
      double acc = pr.bo[n];
      for (int64_t c = 0; c < C; ++c) {
        acc += o[t * C + c] * pr.Wo[n * C + c];
        r.dWo[n * C + c] += pr.dy[t * C + n] * o[t * C + c];
        dO[t * C + c] += pr.dy[t * C + n] * pr.Wo[n * C + c];
      }
      r.y[t * C + n] = acc;
      r.dbo[n] += pr.dy[t * C + n];
    }

  std::vector<double> dqkv(B * S * C3, 0.0);
  r.dE.assign(H * M * M, 0.0);
  r.dwin.assign(H, 0.0);
  r.dwx.assign(H, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> dS(S * S);
      for (int64_t i = 0; i < S; ++i) {
        std::vector<double> dP(S);
        double rowsum = 0;
        for (int64_t j = 0; j < S; ++j) {
          double dPd = 0;
          for (int64_t dd = 0; dd < D; ++dd) dPd += dO[(b * S + i) * C + h * D + dd] * v(b, h, j, dd);
          dP[j] = dPd * pr.m[idx4(b, h, i, j)] * keep_scale;
          rowsum += dP[j] * P[idx4(b, h, i, j)];
        }
        for (int64_t j = 0; j < S; ++j) {
          const double ds = pr.a[b * S + j] == 0 ? 0 : P[idx4(b, h, i, j)] * (dP[j] - rowsum);
          dS[i * S + j] = ds;
          const double ei = pr.e[b * S + i], ej = pr.e[b * S + j];
          r.dE[(h * M + i) * M + j] += ds;
          r.dwin[h] += ds * ei * ej;
          r.dwx[h] += ds * (ei * (1 - ej) + (1 - ei) * ej);
        }
      }
      for (int64_t i = 0; i < S; ++i)
        for (int64_t dd = 0; dd < D; ++dd) {
          double dq = 0, dk = 0, dv = 0;
          for (int64_t j = 0; j < S; ++j) {
            dq += dS[i * S + j] * k(b, h, j, dd);
            dk += dS[j * S + i] * q(b, h, j, dd);
            dv += Pd[idx4(b, h, j, i)] * dO[(b * S + j) * C + h * D + dd];
          }
          dqkv[(b * S + i) * C3 + 0 * C + h * D + dd] = scale * dq;
          dqkv[(b * S + i) * C3 + 1 * C + h * D + dd] = scale * dk;
          dqkv[(b * S + i) * C3 + 2 * C + h * D + dd] = dv;
        }
    }

  r.dx.assign(B * S * C, 0.0);
  r.dWqkv.assign(C3 * C, 0.0);
  r.dbqkv.assign(C3, 0.0);
  for (int64_t t = 0; t < B * S; ++t)
    for (int64_t j = 0; j < C3; ++j) {
      r.dbqkv[j] += dqkv[t * C3 + j];
      for (int64_t c = 0; c < C; ++c) {
        r.dx[t * C + c] += dqkv[t * C3 + j] * pr.Wqkv[j * C + c];
        r.dWqkv[j * C + c] += dqkv[t * C3 + j] * pr.x[t * C + c];
      }
    }
  return r;
}

std::vector<double> random_values(int64_t n, double scale) {
  return tg::mul(tg::randn({n}, {tg::DType::Float64}), scale).to_vector();
}

Problem make_problem(Dims d, double p, const std::vector<double>& e, const std::vector<double>& a) {
  Problem pr{d, random_values(d.B * d.S * d.C, 1), e, a, random_values(3 * d.C * d.C, 0.2), random_values(3 * d.C, 0.1),
             random_values(d.C * d.C, 0.2), random_values(d.C, 0.1), random_values(d.H * d.M * d.M, 0.5),
             random_values(d.H, 0.5), random_values(d.H, 0.5), {}, random_values(d.B * d.S * d.C, 1), p};
  pr.m = tg::dropout_mask({d.B * d.H * d.S * d.S}, p, {99, 1}, {tg::DType::Float64}).to_vector();
  return pr;
}

tg::Tensor t64(const std::vector<double>& v, const tg::Shape& s, bool grad = false) {
  return tg::from_vector(v, s, {tg::DType::Float64, tg::Device::CPU, grad});
}

void check_against_reference(const Problem& pr) {
  const Dims d = pr.d;
  const Result ref = reference(pr);
  tg::RegionAttentionParams params{t64(pr.Wqkv, {3 * d.C, d.C}, true), t64(pr.bqkv, {3 * d.C}, true),
                                   t64(pr.Wo, {d.C, d.C}, true),       t64(pr.bo, {d.C}, true),
                                   t64(pr.E, {d.H, d.M, d.M}, true),   t64(pr.win, {d.H, 1, 1}, true),
                                   t64(pr.wx, {d.H, 1, 1}, true),      d.H};
  const tg::Tensor x = t64(pr.x, {d.B, d.S, d.C}, true);
  const tg::Tensor mask = t64(pr.m, {d.B, d.H, d.S, d.S});
  const tg::Tensor y = tg::region_attention_decomposed(x, t64(pr.e, {d.B, d.S}), t64(pr.a, {d.B, d.S}), params,
                                                       {pr.p, std::nullopt, mask});
  y.backward(t64(pr.dy, y.shape()));
  auto close = [](const tg::Tensor& t, const std::vector<double>& r) { return max_abs_diff(t, t64(r, t.shape())); };
  CHECK(close(y, ref.y) < 1e-10);
  CHECK(close(x.grad(), ref.dx) < 1e-10);
  CHECK(close(params.qkv_weight.grad(), ref.dWqkv) < 1e-10);
  CHECK(close(params.qkv_bias.grad(), ref.dbqkv) < 1e-10);
  CHECK(close(params.out_weight.grad(), ref.dWo) < 1e-10);
  CHECK(close(params.out_bias.grad(), ref.dbo) < 1e-10);
  CHECK(close(params.edit_region_bias.grad(), ref.dE) < 1e-10);
  CHECK(close(params.within_edit_bias.grad(), ref.dwin) < 1e-10);
  CHECK(close(params.cross_edit_bias.grad(), ref.dwx) < 1e-10);
}

const Dims kDims{2, 7, 32, 4, 9};

std::vector<double> filled(int64_t n, double v) { return std::vector<double>(n, v); }

}  // namespace

TEST_CASE("attention/decomposed matches the float64 reference: masked keys, mixed edit mask, p = 0.1") {
  tg::manual_seed(1);
  std::vector<double> e = {1, 0, 0, 1, 1, 0, 1, /**/ 0, 0, 1, 1, 1, 0, 0};
  std::vector<double> a = {1, 1, 1, 1, 1, 0, 1, /**/ 0, 1, 1, 0, 1, 1, 1};
  check_against_reference(make_problem(kDims, 0.1, e, a));
}

TEST_CASE("attention/decomposed matches the reference: all inside, p = 0") {
  tg::manual_seed(2);
  check_against_reference(make_problem(kDims, 0.0, filled(14, 1), filled(14, 1)));
}

TEST_CASE("attention/decomposed matches the reference: all outside, one batch fully masked") {
  tg::manual_seed(3);
  std::vector<double> a = filled(14, 1);
  for (int j = 0; j < 7; ++j) a[j] = 0;  // batch 0: every key masked, so P = 0 there
  check_against_reference(make_problem(kDims, 0.1, filled(14, 0), a));
}

TEST_CASE("gradcheck/region_attention") {
  tg::manual_seed(4);
  const Dims d{2, 4, 8, 2, 5};
  const Problem pr = make_problem(d, 0.1, {1, 0, 1, 1, 0, 0, 1, 0}, {1, 1, 0, 1, 1, 1, 1, 1});
  const tg::Tensor e = t64(pr.e, {d.B, d.S}), a = t64(pr.a, {d.B, d.S}), m = t64(pr.m, {d.B, d.H, d.S, d.S});
  expect_gradcheck(
      [&](const std::vector<tg::Tensor>& t) {
        tg::RegionAttentionParams p{t[1], t[2], t[3], t[4], t[5], t[6], t[7], d.H};
        return tg::region_attention_decomposed(t[0], e, a, p, {pr.p, std::nullopt, m});
      },
      {t64(pr.x, {d.B, d.S, d.C}, true), t64(pr.Wqkv, {3 * d.C, d.C}, true), t64(pr.bqkv, {3 * d.C}, true),
       t64(pr.Wo, {d.C, d.C}, true), t64(pr.bo, {d.C}, true), t64(pr.E, {d.H, d.M, d.M}, true),
       t64(pr.win, {d.H, 1, 1}, true), t64(pr.wx, {d.H, 1, 1}, true)});
}

TEST_CASE("attention/Philox dropout in the layer equals the explicit mask it regenerates") {
  tg::manual_seed(5);
  const Dims d{1, 5, 8, 2, 5};
  const tg::PhiloxState rng{21, 4};
  auto params = tg::RegionAttentionParams::init({d.C, d.H, d.M}, {tg::DType::Float64});
  const tg::Tensor x = randn64({d.B, d.S, d.C}, false);
  const tg::Tensor e = tg::ones({d.B, d.S}, {tg::DType::Float64}), a = tg::ones({d.B, d.S}, {tg::DType::Float64});
  const tg::Tensor y1 = tg::region_attention_decomposed(x, e, a, params, {0.2, rng});
  const tg::Tensor m = tg::dropout_mask({d.B, d.H, d.S, d.S}, 0.2, rng, {tg::DType::Float64});
  const tg::Tensor y2 = tg::region_attention_decomposed(x, e, a, params, {0.2, std::nullopt, m});
  CHECK(max_abs_diff(y1, y2) == 0.0);
}

// trainable_copy: equal values, new leaves that require grad, memory of their
// own (a step on the copy leaves the source as it was), the head count kept;
// a parameter left undefined is named.
TEST_CASE("attention/RegionAttentionParams::trainable_copy gives leaves of its own") {
  const tg::RegionAttentionParams source = tg::RegionAttentionParams::init({8, 2, 5}, {tg::DType::Float64});
  tg::RegionAttentionParams copy = source.trainable_copy(tg::Device::CPU);
  CHECK(copy.heads == 2);
  const std::vector<tg::Tensor> from = source.parameters(), to = copy.parameters();
  for (size_t i = 0; i < from.size(); ++i) {
    CAPTURE(i);
    CHECK(max_abs_diff(to[i], from[i]) == 0.0);
    CHECK((to[i].is_leaf() && to[i].requires_grad()));
    CHECK(!tg::bytes_overlap(to[i], from[i]));
  }
  const tg::Tensor before = tg::clone(source.edit_region_bias);
  {
    tg::NoGradGuard no_grad;
    copy.edit_region_bias.fill_(3.0);
  }
  CHECK(max_abs_diff(source.edit_region_bias, before) == 0.0);
  tg::RegionAttentionParams missing = source;
  missing.out_bias = tg::Tensor();
  CHECK(error_of([&] { missing.trainable_copy(tg::Device::CPU); }) ==
        "RegionAttentionParams::trainable_copy: argument 'out_bias' is an undefined tensor");
}
