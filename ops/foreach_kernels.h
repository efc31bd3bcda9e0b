// The foreach kernels (ops/foreach.h), written once for both devices: one
// work item per element of the launch's tensors seen end to end (or per lane
// of the sum of squares), each finding its tensor in the launch's table.
#pragma once
#include <cmath>

#include "core/dispatch.h"
#include "core/hd.h"
#include "core/tensor.h"
#include "ops/foreach.h"

namespace tg {

// The tensors of one launch seen end to end: element i is element
// i - start[k] of tensor k, start[k] <= i < start[k + 1].
struct Slot {
  int k;      // the tensor
  int64_t j;  // the element in it
};
struct SlotTable {
  int count = 0;
  int64_t start[kForeachSlots + 1] = {};
  TG_HD int64_t total() const { return start[count]; }
  TG_HD Slot locate(int64_t i) const {  // k: the last with start[k] <= i (empty tensors are never found)
    int lo = 0, hi = count - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (start[mid] <= i) lo = mid;
      else hi = mid - 1;
    }
    return {lo, i - start[lo]};
  }
};

template <class T>
struct AdamWSlots {
  SlotTable table;
  T* p[kForeachSlots];
  const T* g[kForeachSlots];
  T *m[kForeachSlots], *v[kForeachSlots];
  T neg_step_size[kForeachSlots], inv_sqrt_c2[kForeachSlots];  // -lr / c1 and 1 / sqrt(c2) of each tensor's step
  T decay, beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  // PyTorch's order of operations (models/optim.h). The CPU build does not
  // contract them (-ffp-contract=off: the same bits as the step written with
  // the tensor methods before bench/NOTES.md version 40); nvcc fuses the
  // multiply-adds, so the GPU's last bits differ from the CPU's.
  TG_HD void operator()(int64_t i) const {
    const auto [k, j] = table.locate(i);
    const T grad = g[k][j];
    const T mj = m[k][j] * beta1 + one_minus_beta1 * grad;
    const T vj = v[k][j] * beta2 + one_minus_beta2 * (grad * grad);
    m[k][j] = mj;
    v[k][j] = vj;
    p[k][j] = p[k][j] * decay + neg_step_size[k] * (mj / (std::sqrt(vj) * inv_sqrt_c2[k] + eps));
  }
};

// Lanes of the sum of squares: lane l sums x_i^2 over i = l, l + kSquareLanes,
// ... of the list's elements end to end, so that the order of additions
// depends on the sizes alone; the partials are then summed by column sums.
// Each square is rounded before its addition on both devices (nvcc would
// fuse them), so the CPU and the GPU give the same bits.
constexpr int64_t kSquareLanes = int64_t(1) << 16;

// x^2 rounded on its own, never fused into the addition that follows.
TG_HD double square_unfused(double x) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(x, x);
#else
  return x * x;
#endif
}

template <class T>
struct SquareSumSlots {
  SlotTable table;
  const T* x[kForeachSlots];
  double* partial;  // [kSquareLanes], added to (the list's earlier launches)
  int64_t first;    // this launch's first element in the whole list
  TG_HD void operator()(int64_t lane) const {
    // The first of this launch's elements that are lane's: i = first + (lane - first) mod lanes.
    const int64_t offset = ((lane - first) % kSquareLanes + kSquareLanes) % kSquareLanes;
    double acc = 0;
    for (int64_t i = offset; i < table.total(); i += kSquareLanes) {
      const auto [k, j] = table.locate(i);
      acc += square_unfused(static_cast<double>(x[k][j]));
    }
    partial[lane] += acc;
  }
};

template <class T>
struct ScaleSlots {
  SlotTable table;
  T* x[kForeachSlots];
  T s;
  TG_HD void operator()(int64_t i) const {
    const auto [k, j] = table.locate(i);
    x[k][j] *= s;
  }
};

// The launches of one list: for each run of at most kForeachSlots tensors,
// its table (empty tensors skipped) and index in the list, for `launch`.
template <class F>
void for_each_slot_run(const std::vector<Tensor>& first_list, const F& launch) {
  SlotTable table;
  std::vector<size_t> members;
  const auto flush = [&] {
    if (table.count > 0) launch(table, members);
    table = SlotTable{};
    members.clear();
  };
  for (size_t i = 0; i < first_list.size(); ++i) {
    const int64_t n = first_list[i].numel();
    if (n == 0) continue;
    table.start[table.count + 1] = table.start[table.count] + n;
    ++table.count;
    members.push_back(i);
    if (table.count == kForeachSlots) flush();
  }
  flush();
}

template <Device D>
struct ForeachKernels {
  static void adamw(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                    const std::vector<Tensor>& exp_avgs, const std::vector<Tensor>& exp_avg_sqs,
                    const std::vector<int64_t>& steps, const AdamWHyper& h);
  static void square_sums(const std::vector<Tensor>& xs, const Tensor& partial);  // partial [kSquareLanes], zeroed
  static void scale(const std::vector<Tensor>& xs, double s);
};
TG_EXTERN_CUDA_KERNELS(ForeachKernels);

template <Device D>
void ForeachKernels<D>::adamw(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                              const std::vector<Tensor>& exp_avgs, const std::vector<Tensor>& exp_avg_sqs,
                              const std::vector<int64_t>& steps, const AdamWHyper& h) {
  TG_DISPATCH_FLOAT(params[0].dtype(), T, [&] {
    for_each_slot_run(params, [&](const SlotTable& table, const std::vector<size_t>& members) {
      AdamWSlots<T> f{table, {}, {}, {}, {}, {}, {}, static_cast<T>(1 - h.lr * h.weight_decay),
                      static_cast<T>(h.beta1), static_cast<T>(1 - h.beta1), static_cast<T>(h.beta2),
                      static_cast<T>(1 - h.beta2), static_cast<T>(h.eps)};
      for (size_t k = 0; k < members.size(); ++k) {
        const size_t i = members[k];
        const double t = static_cast<double>(steps[i]);
        f.p[k] = params[i].data<T>();
        f.g[k] = grads[i].data<T>();
        f.m[k] = exp_avgs[i].data<T>();
        f.v[k] = exp_avg_sqs[i].data<T>();
        f.neg_step_size[k] = static_cast<T>(-h.lr / (1 - std::pow(h.beta1, t)));
        f.inv_sqrt_c2[k] = static_cast<T>(1 / std::sqrt(1 - std::pow(h.beta2, t)));
      }
      Loop<D>{"foreach_adamw_"}(table.total(), f);
    });
  });
}

template <Device D>
void ForeachKernels<D>::square_sums(const std::vector<Tensor>& xs, const Tensor& partial) {
  TG_DISPATCH_FLOAT(xs[0].dtype(), T, [&] {
    int64_t first = 0;
    for_each_slot_run(xs, [&](const SlotTable& table, const std::vector<size_t>& members) {
      SquareSumSlots<T> f{table, {}, partial.data<double>(), first};
      for (size_t k = 0; k < members.size(); ++k) f.x[k] = xs[members[k]].data<T>();
      Loop<D>{"foreach_sum_of_squares"}(kSquareLanes, f);
      first += table.total();
    });
  });
}

template <Device D>
void ForeachKernels<D>::scale(const std::vector<Tensor>& xs, double s) {
  TG_DISPATCH_FLOAT(xs[0].dtype(), T, [&] {
    for_each_slot_run(xs, [&](const SlotTable& table, const std::vector<size_t>& members) {
      ScaleSlots<T> f{table, {}, static_cast<T>(s)};
      for (size_t k = 0; k < members.size(); ++k) f.x[k] = xs[members[k]].data<T>();
      Loop<D>{"foreach_mul_"}(table.total(), f);
    });
  });
}

}  // namespace tg
