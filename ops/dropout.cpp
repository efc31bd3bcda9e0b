#include "ops/dropout.h"

#include <iomanip>

#include "autograd/engine.h"
#include "core/cpu_loops.h"
#include "core/random.h"
#include "ops/binary_mask.h"
#include "ops/dropout_kernels.h"
#include "ops/untracked.h"

namespace tg {

TG_INSTANTIATE_KERNELS(DropoutKernels, Device::CPU);

void check_dropout_p(const char* op, const char* name, double p) {
  TG_CHECK(p >= 0.0 && static_cast<float>(p) <= kMaxDropoutP, op, ": ", name,
           " must be in [0, 1 - 2^-16] as a float (dropout draws 16 bits), got ", std::setprecision(12), p);
}

void check_given_mask_dropout_p(const char* op, const char* name, double p) {
  TG_CHECK(p >= 0.0 && static_cast<float>(p) < 1.0f, op, ": ", name, " must be in [0, 1) as a float, got ",
           std::setprecision(12), p);
}

namespace {
Tensor dropout_untracked(const Tensor& x, const Tensor& mask, PhiloxState rng, double p) {
  Tensor out = empty(x.shape(), {x.dtype(), x.device()});
  TG_DISPATCH_DEVICE(x, DropoutKernels, apply, materialize(x), mask, rng, p, out);
  return out;
}
}  // namespace

Tensor dropout(const Tensor& x, const DropoutOptions& o) {
  check_defined("dropout", "x", x);
  if (o.mask.defined()) {
    check_given_mask_dropout_p("dropout", "p", o.p);
    TG_CHECK(o.mask.shape() == x.shape(), "dropout: mask ", o.mask.shape(), " must have x's shape ", x.shape());
    TG_CHECK(o.mask.device() == x.device(), "dropout: mask is on ", o.mask.device(), ", x on ", x.device());
    check_binary_mask("dropout", "mask", o.mask);
  } else {
    check_dropout_p("dropout", "p", o.p);
  }
  if (o.p == 0.0) return x;
  const Tensor mask = o.mask.defined() ? materialize(o.mask.to(x.dtype())) : Tensor();
  const PhiloxState rng = o.rng ? *o.rng : default_generator().next();
  const double p = o.p;
  Tensor y = dropout_untracked(x, mask, rng, p);
  return autograd::record(OpId::dropout, y, {x}, {mask}, [rng, p](const Tensor& g, const auto& s, const auto&) {
    return std::vector<Tensor>{dropout_untracked(g, s[0], rng, p)};
  });
}

Tensor dropout_mask(const Shape& shape, double p, PhiloxState state, TensorOptions opts) {
  check_dropout_p("dropout_mask", "p", p);
  Tensor out = empty(shape, opts);
  TG_DISPATCH_DEVICE(out, DropoutKernels, apply, Tensor(), Tensor(), state, p, out);
  return out;
}

}  // namespace tg
