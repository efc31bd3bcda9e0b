// gradcheck: compares the tape's gradients with central finite differences in
// float64. With a random projection w of the output, L = sum(w * fn(inputs));
// dL/dx_k from backward() must match (L(x_k + eps) - L(x_k - eps)) / (2 eps)
// for every element k of every input that requires grad. A NaN or Inf on
// either side fails the check.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tg {

// One checked element: input `input`, flat index `index`.
struct GradcheckEntry {
  size_t input;
  int64_t index;
  double analytic, numeric;
};

struct GradcheckResult {
  bool ok = true;
  std::vector<GradcheckEntry> entries;  // every element checked, in order
  std::string report;  // on failure: the worst element (input, index, analytic, numeric)
  double max_error = 0;  // max over elements of |analytic - numeric| / (atol + rtol |numeric|)
  int64_t elements_checked = 0;
};

using GradcheckFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Inputs must be float64 CPU tensors; those with requires_grad are checked.
GradcheckResult gradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs, double eps = 1e-6,
                          double atol = 1e-7, double rtol = 1e-5);

}  // namespace tg
