#include "autograd/gradcheck.h"

#include <cmath>
#include <sstream>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"

namespace tg {

namespace {

double projected(const GradcheckFn& fn, const std::vector<Tensor>& inputs, const Tensor& w) {
  NoGradGuard no_grad;
  return sum(mul(fn(inputs), w)).item();
}

}  // namespace

GradcheckResult gradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs_in, double eps, double atol,
                          double rtol) {
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < inputs_in.size(); ++i) {
    const Tensor& t = inputs_in[i];
    check_defined("gradcheck", "input", t);
    TG_CHECK(t.dtype() == DType::Float64 && !t.is_cuda(), "gradcheck: input ", i, " ", t.shape(),
             " must be a float64 CPU tensor, got ", t.dtype(), " on ", t.device());
    // Fresh contiguous leaves, so perturbing one element touches nothing else.
    Tensor leaf = t.detach().clone();
    leaf.requires_grad_(t.requires_grad());
    inputs.push_back(leaf);
  }

  const Tensor out = fn(inputs);
  TG_CHECK(out.dtype() == DType::Float64, "gradcheck: fn must return float64, got ", out.dtype());
  const Tensor w = randn(out.shape(), {DType::Float64});
  out.backward(w);

  GradcheckResult result;
  std::ostringstream worst;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].requires_grad()) continue;
    const Tensor grad = inputs[i].grad();
    const std::vector<double> analytic = grad.defined() ? grad.to_vector() : std::vector<double>(inputs[i].numel(), 0.0);
    double* x = inputs[i].data<double>();
    for (int64_t k = 0; k < inputs[i].numel(); ++k) {
      const double saved = x[k];
      x[k] = saved + eps;
      const double plus = projected(fn, inputs, w);
      x[k] = saved - eps;
      const double minus = projected(fn, inputs, w);
      x[k] = saved;
      const double numeric = (plus - minus) / (2 * eps);
      // A NaN or Inf on either side fails: it never compares as an error below.
      const bool finite = std::isfinite(analytic[k]) && std::isfinite(numeric);
      const double err = finite ? std::abs(analytic[k] - numeric) / (atol + rtol * std::abs(numeric)) : INFINITY;
      ++result.elements_checked;
      result.entries.push_back({i, k, analytic[k], numeric});
      if (err > result.max_error || (!finite && result.max_error != INFINITY)) {
        result.max_error = err;
        worst.str("");
        worst << "input " << i << " " << inputs[i].shape() << ", element " << k << ": analytic " << analytic[k]
              << ", numeric " << numeric << " (|diff| " << std::abs(analytic[k] - numeric) << ")";
      }
    }
  }
  result.ok = result.max_error <= 1.0;
  result.report = worst.str();
  return result;
}

}  // namespace tg
