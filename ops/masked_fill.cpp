#include "ops/masked_fill.h"

#include "autograd/engine.h"
#include "core/cpu_loops.h"
#include "core/dispatch.h"
#include "ops/views.h"

namespace tg {

namespace {
Tensor masked_fill_untracked(const Tensor& x, const Tensor& mask, double value) {
  Tensor out = empty(x.shape(), {x.dtype(), x.device()});
  const Tensor m = broadcast_view("masked_fill", mask.to(x.dtype()), x.shape());
  TG_DISPATCH_DEVICE(x, masked_fill, x, m, value, out);
  return out;
}
}  // namespace

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  check_defined("masked_fill", "x", x);
  check_defined("masked_fill", "mask", mask);
  TG_CHECK(x.device() == mask.device(), "masked_fill: x ", x.shape(), " is on ", x.device(),
           " but mask ", mask.shape(), " is on ", mask.device());
  TG_CHECK(broadcast_shapes("masked_fill", x.shape(), mask.shape()) == x.shape(), "masked_fill: mask ",
           mask.shape(), " does not broadcast to x ", x.shape());
  Tensor out = masked_fill_untracked(x, mask, value);
  return autograd::record("masked_fill", out, {x}, {mask.detach()}, [](const Tensor& g, const auto& s) {
    return std::vector<Tensor>{masked_fill_untracked(g, s[0], 0.0)};
  });
}

namespace cpu {
void masked_fill(const Tensor& x, const Tensor& mask, double value, const Tensor& out) {
  masked_fill_with(Loop{"masked_fill"}, x, mask, value, out);
}
}  // namespace cpu

}  // namespace tg
