#include "ops/foreach.h"

#include "core/cpu_loops.h"
#include "ops/foreach_kernels.h"
#include "ops/reduce_kernels.h"
#include "ops/untracked.h"

namespace tg {

TG_INSTANTIATE_KERNELS(ForeachKernels, Device::CPU);

namespace {

// Every tensor of every list defined, contiguous, of the first one's dtype
// and device, and of its list-mate's shape in the first list.
void check_lists(const char* op, const std::vector<std::pair<const char*, const std::vector<Tensor>*>>& lists) {
  const auto& [first_name, first] = lists.front();
  for (const auto& [name, list] : lists) {
    TG_CHECK(list->size() == first->size(), op, ": ", name, " holds ", list->size(), " tensors, ", first_name,
             " holds ", first->size());
    for (size_t i = 0; i < list->size(); ++i) {
      const Tensor& t = (*list)[i];
      TG_CHECK(t.defined(), op, ": ", name, "[", i, "] is an undefined tensor");
      const Tensor& mate = (*first)[i];
      const Tensor& lead = first->front();
      TG_CHECK(t.dtype() == lead.dtype() && t.device() == lead.device(), op, ": ", name, "[", i, "] is ", t.dtype(),
               " on ", t.device(), ", ", first_name, "[0] is ", lead.dtype(), " on ", lead.device(),
               " (one dtype and one device per call)");
      TG_CHECK(t.is_contiguous(), op, ": ", name, "[", i, "] ", t.shape(), " with strides ", t.strides(),
               " is not contiguous");
      TG_CHECK(t.shape() == mate.shape(), op, ": ", name, "[", i, "] is ", t.shape(), ", ", first_name, "[", i,
               "] is ", mate.shape());
    }
  }
}

}  // namespace

void foreach_adamw_(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                    const std::vector<Tensor>& exp_avgs, const std::vector<Tensor>& exp_avg_sqs,
                    const std::vector<int64_t>& steps, const AdamWHyper& hyper) {
  const char* op = "foreach_adamw_";
  check_lists(op, {{"params", &params}, {"grads", &grads}, {"exp_avgs", &exp_avgs}, {"exp_avg_sqs", &exp_avg_sqs}});
  TG_CHECK(steps.size() == params.size(), op, ": steps holds ", steps.size(), " counts, params ", params.size(),
           " tensors");
  for (size_t i = 0; i < steps.size(); ++i)
    TG_CHECK(steps[i] >= 1, op, ": steps[", i, "] is ", steps[i], "; a step counts itself, so it is at least 1");
  if (params.empty()) return;
  TG_DISPATCH_DEVICE(params[0], ForeachKernels, adamw, params, grads, exp_avgs, exp_avg_sqs, steps, hyper);
}

Tensor foreach_sum_of_squares(const std::vector<Tensor>& xs) {
  if (xs.empty()) return zeros({}, {DType::Float64});
  check_lists("foreach_sum_of_squares", {{"xs", &xs}});
  const Device device = xs[0].device();
  const Tensor partial = zeros({kSquareLanes}, {DType::Float64, device});
  TG_DISPATCH_DEVICE(xs[0], ForeachKernels, square_sums, xs, partial);
  const Tensor total = empty({}, {DType::Float64, device});
  // The lanes' partials summed by the column sums' fixed tree (one column).
  TG_DISPATCH_DEVICE(partial, ReduceKernels, sum_columns, partial, total, kSquareLanes, 1);
  return total;
}

void foreach_mul_(const std::vector<Tensor>& xs, double s) {
  if (xs.empty()) return;
  check_lists("foreach_mul_", {{"xs", &xs}});
  TG_DISPATCH_DEVICE(xs[0], ForeachKernels, scale, xs, s);
}

}  // namespace tg
