// Updates on lists of tensors in a few launches, for the optimizers and
// gradient clipping (PyTorch's torch._foreach_* and its fused AdamW): a
// model of ~100 parameters took ~11 kernels per parameter for an AdamW step
// and ~5 for clipping, each launch longer than its work (bench/NOTES.md,
// version 40). Each function takes tensors of any sizes on one device, of
// one floating dtype and contiguous, and runs one kernel per kForeachSlots
// tensors over all their elements. The tensors it writes follow the rules of
// the in-place methods (core/tensor.h's check_inplace; their version
// counters are bumped) and share memory with no other tensor of the call.
//
//   adamw:            p <- p (1 - lr wd)
//                     m <- beta1 m + (1 - beta1) g
//                     v <- beta2 v + (1 - beta2) g^2
//                     p <- p - (lr / c1) m / (sqrt(v) / sqrt(c2) + eps),  c_k = 1 - beta_k^step
//   sum_of_squares:   sum over every element of every tensor of x^2, squared and summed in float64
//   mul:              x <- s x
#pragma once
#include <vector>

#include "core/tensor.h"

namespace tg {

constexpr int kForeachSlots = 48;  // tensors per launch (their table travels as the kernel's argument)

struct AdamWHyper {
  double lr, beta1, beta2, eps, weight_decay;
};

// lr, eps and weight_decay finite and >= 0, betas in [0, 1); errors name op.
void check_adamw_hyper(const char* op, const AdamWHyper& hyper);

// One AdamW step of params[i] with gradient grads[i], moments exp_avgs[i]
// and exp_avg_sqs[i] (all of one shape per i), steps[i] counting this one.
void foreach_adamw_(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                    const std::vector<Tensor>& exp_avgs, const std::vector<Tensor>& exp_avg_sqs,
                    const std::vector<int64_t>& steps, const AdamWHyper& hyper);
// A float64 0-d tensor on the tensors' device (the CPU for an empty list).
// Deterministic: the same order of additions for the same sizes on any device.
Tensor foreach_sum_of_squares(const std::vector<Tensor>& xs);
void foreach_mul_(const std::vector<Tensor>& xs, double s);

}  // namespace tg
