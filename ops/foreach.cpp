#include "ops/foreach.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/cpu_loops.h"
#include "ops/foreach_kernels.h"
#include "ops/reduce_kernels.h"
#include "ops/untracked.h"

namespace tg {

TG_INSTANTIATE_KERNELS(ForeachKernels, Device::CPU);

namespace {

using Lists = std::vector<std::pair<const char*, const std::vector<Tensor>*>>;  // (name, list)

// Every tensor of every list defined, contiguous, of the first one's dtype
// and device, and of its list-mate's shape in the first list.
void check_lists(const char* op, const Lists& lists) {
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

// The tensors a call writes follow the in-place rules (core/tensor.h's
// check_inplace), and no two of them, or one of them and a tensor it
// reads, share memory (one launch writes them all at once).
void check_writes(const char* op, const Lists& written, const Lists& read) {
  struct Range {
    uintptr_t begin, end;
    const char* name;
    size_t index;
    bool writes;
  };
  std::vector<Range> ranges;
  const auto add = [&](const Lists& lists, bool writes) {
    for (const auto& [name, list] : lists)
      for (size_t i = 0; i < list->size(); ++i) {
        const Tensor& t = (*list)[i];
        if (writes) check_inplace(op, t);
        const auto begin = reinterpret_cast<uintptr_t>(t.raw_data());
        const auto bytes = static_cast<uintptr_t>(t.numel()) * element_size(t.dtype());
        if (bytes > 0) ranges.push_back({begin, begin + bytes, name, i, writes});
      }
  };
  add(written, true);
  add(read, false);
  std::stable_sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  // Each range against the furthest-reaching written range before it, and,
  // when it writes, against the furthest-reaching range of any kind.
  const Range* written_reach = nullptr;
  const Range* any_reach = nullptr;
  for (const Range& b : ranges) {
    const Range* clash = written_reach && b.begin < written_reach->end ? written_reach
                         : b.writes && any_reach && b.begin < any_reach->end ? any_reach
                                                                              : nullptr;
    TG_CHECK(!clash, op, ": ", clash->name, "[", clash->index, "] and ", b.name, "[", b.index,
             "] share memory; a tensor a call writes must share it with no other tensor of the call");
    if (b.writes && (!written_reach || b.end > written_reach->end)) written_reach = &b;
    if (!any_reach || b.end > any_reach->end) any_reach = &b;
  }
}

}  // namespace

void check_adamw_hyper(const char* op, const AdamWHyper& h) {
  const auto finite_nonnegative = [](double v) { return std::isfinite(v) && v >= 0; };
  TG_CHECK(finite_nonnegative(h.lr), op, ": lr must be finite and >= 0, got ", h.lr);
  TG_CHECK(h.beta1 >= 0 && h.beta1 < 1 && h.beta2 >= 0 && h.beta2 < 1, op, ": betas must be in [0, 1), got (",
           h.beta1, ", ", h.beta2, ")");
  TG_CHECK(finite_nonnegative(h.eps) && finite_nonnegative(h.weight_decay), op, ": eps ", h.eps, " and weight_decay ",
           h.weight_decay, " must be finite and >= 0");
}

void foreach_adamw_(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                    const std::vector<Tensor>& exp_avgs, const std::vector<Tensor>& exp_avg_sqs,
                    const std::vector<int64_t>& steps, const AdamWHyper& hyper) {
  const char* op = "foreach_adamw_";
  check_lists(op, {{"params", &params}, {"grads", &grads}, {"exp_avgs", &exp_avgs}, {"exp_avg_sqs", &exp_avg_sqs}});
  TG_CHECK(steps.size() == params.size(), op, ": steps holds ", steps.size(), " counts, params ", params.size(),
           " tensors");
  for (size_t i = 0; i < steps.size(); ++i)
    TG_CHECK(steps[i] >= 1, op, ": steps[", i, "] is ", steps[i], "; a step counts itself, so it is at least 1");
  check_adamw_hyper(op, hyper);
  check_writes(op, {{"params", &params}, {"exp_avgs", &exp_avgs}, {"exp_avg_sqs", &exp_avg_sqs}},
               {{"grads", &grads}});
  if (params.empty()) return;
  TG_DISPATCH_DEVICE(params[0], ForeachKernels, adamw, params, grads, exp_avgs, exp_avg_sqs, steps, hyper);
  for (const auto* list : {&params, &exp_avgs, &exp_avg_sqs})
    for (const Tensor& t : *list) bump_version(t);
}

Tensor foreach_sum_of_squares(const std::vector<Tensor>& xs) {
  if (xs.empty()) return zeros({}, {DType::Float64});
  check_lists("foreach_sum_of_squares", {{"xs", &xs}});
  const Device device = xs[0].device();
  const Tensor partial = zeros({kSquareLanes}, {DType::Float64, device});
  TG_DISPATCH_DEVICE(xs[0], ForeachKernels, square_sums, xs, partial);
  const Tensor total = empty({}, {DType::Float64, device});
  // The lanes' partials summed by the column sums' fixed tree (one column).
  sum_columns_into(total.view({1}), partial.view({kSquareLanes, 1}), Tensor());
  return total;
}

void foreach_mul_(const std::vector<Tensor>& xs, double s) {
  if (xs.empty()) return;
  check_lists("foreach_mul_", {{"xs", &xs}});
  check_writes("foreach_mul_", {{"xs", &xs}}, {});
  TG_DISPATCH_DEVICE(xs[0], ForeachKernels, scale, xs, s);
  for (const Tensor& t : xs) bump_version(t);
}

}  // namespace tg
