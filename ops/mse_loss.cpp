#include "ops/mse_loss.h"

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/cpu_loops.h"
#include "ops/elementwise.h"
#include "ops/mse_loss_kernels.h"
#include "ops/reduce.h"
#include "ops/untracked.h"

namespace tg {

TG_INSTANTIATE_KERNELS(MseKernels, Device::CPU);

Tensor mse_loss(const Tensor& a, const Tensor& b) {
  check_defined("mse_loss", "input", a);
  check_defined("mse_loss", "target", b);
  check_same_dtype_device("mse_loss", a, b);
  TG_CHECK(a.shape() == b.shape(), "mse_loss: input ", a.shape(), " and target ", b.shape(), " differ in shape");
  TG_CHECK(a.numel() > 0, "mse_loss: empty input of shape ", a.shape());
  Tensor sq = empty(a.shape(), {a.dtype(), a.device()});
  TG_DISPATCH_DEVICE(a, MseKernels, forward, a, b, sq);
  Tensor loss;
  {
    NoGradGuard no_grad;
    loss = mul(sum(sq), 1.0 / static_cast<double>(a.numel()));
  }
  return autograd::record(OpId::mse_loss, loss, {a, b}, {a, b},
                          [](const Tensor& g, const auto& s, const autograd::GradMask& needs) {
    Tensor ga = empty(s[0].shape(), {g.dtype(), g.device()});
    TG_DISPATCH_DEVICE(g, MseKernels, backward, s[0], s[1], broadcast_view("mse_loss", g, s[0].shape()), ga);
    return std::vector<Tensor>{needs[0] ? ga : Tensor(), autograd::grad_if(needs[1], [&] { return neg(ga); })};
  });
}

}  // namespace tg
