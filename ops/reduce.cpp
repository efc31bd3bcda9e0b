#include "ops/reduce.h"

#include "autograd/engine.h"
#include "core/cpu_loops.h"
#include "ops/copy.h"
#include "ops/untracked.h"
#include "ops/elementwise.h"
#include "ops/reduce_kernels.h"
#include "ops/views.h"

namespace tg {

template <>
void ReduceKernels<Device::CPU>::sum_rows(const Tensor& x, const Tensor& out, int64_t rows, int64_t cols) {
  TG_DISPATCH_FLOAT(x.dtype(), T, [&] {
    const T* in = x.data<T>();
    T* o = out.data<T>();
    cpu::parallel_for(rows, [&](int64_t r) {
      double acc = 0;
      for (int64_t j = 0; j < cols; ++j) acc += in[r * cols + j];
      o[r] = static_cast<T>(acc);
    });
  });
}

TG_INSTANTIATE_KERNELS(ReduceKernels, Device::CPU);

namespace {

std::vector<bool> reduced_mask(const char* op, const Tensor& x, const std::vector<int64_t>& dims) {
  std::vector<bool> mask(x.dim(), false);
  for (int64_t d : dims) {
    const int n = normalize_dim(op, d, x.dim());
    TG_CHECK(!mask[n], op, ": dim ", d, " repeats in the dims of a tensor of shape ", x.shape());
    mask[n] = true;
  }
  return mask;
}

// x viewed with the dims of one kind (reduced or kept) first, the other last.
Tensor grouped_view(const Tensor& x, const std::vector<bool>& reduced, bool reduced_first, int64_t& lead, int64_t& trail) {
  Shape shape, strides;
  lead = trail = 1;
  for (int pass = 0; pass < 2; ++pass)
    for (int64_t d = 0; d < x.dim(); ++d)
      if (reduced[d] == ((pass == 0) == reduced_first)) {
        shape.push_back(x.shape()[d]);
        strides.push_back(x.strides()[d]);
        (pass == 0 ? lead : trail) *= x.shape()[d];
      }
  return make_view(x, shape, strides, x.offset());
}

// A [kept, reduced] row problem when x is laid out kept-dims-first; a
// [reduced, kept] column problem when it is laid out reduced-first with enough
// columns to spread over (a bias gradient over tokens); otherwise a copy to the
// row layout.
Tensor sum_over(const Tensor& x, const std::vector<bool>& reduced, const Shape& out_shape) {
  Tensor out = empty(out_shape, {x.dtype(), x.device()});
  int64_t rows, cols;
  const Tensor kept_first = grouped_view(x, reduced, false, rows, cols);
  if (!kept_first.is_contiguous()) {
    int64_t reduced_rows, kept_cols;
    const Tensor reduced_first = grouped_view(x, reduced, true, reduced_rows, kept_cols);
    if (reduced_first.is_contiguous() && kept_cols >= 32) {
      sum_columns_into(out.view({kept_cols}), reduced_first.view({reduced_rows, kept_cols}), Tensor());
      return out;
    }
  }
  TG_DISPATCH_DEVICE(x, ReduceKernels, sum_rows, materialize(kept_first), out, rows, cols);
  return out;
}

Shape kept_shape(const Tensor& x, const std::vector<bool>& reduced, bool keepdim) {
  Shape s;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (!reduced[d]) s.push_back(x.shape()[d]);
    else if (keepdim) s.push_back(1);
  }
  return s;
}

}  // namespace

int64_t sum_columns_scratch(const Tensor& x2) {
  TG_CHECK(x2.dim() == 2, "sum_columns_scratch: x must be [rows, cols], got ", x2.shape());
  return column_sums_scratch(x2.size(0), x2.size(1));
}

void sum_columns_into(const Tensor& out, const Tensor& x2, const Tensor& given_scratch) {
  const char* op = "sum_columns_into";
  TG_CHECK(x2.dim() == 2 && x2.is_contiguous(), op, ": x must be a contiguous [rows, cols], got ", x2.shape(),
           x2.is_contiguous() ? "" : " (not contiguous)");
  TG_CHECK(out.shape() == Shape{x2.size(1)} && out.is_contiguous(), op, ": out must be a contiguous [", x2.size(1),
           "] for x ", x2.shape(), ", got ", out.shape());
  check_same_dtype_device(op, x2, out);
  const int64_t n = sum_columns_scratch(x2);
  const Tensor scratch = given_scratch.defined() || n == 0 ? given_scratch : empty({n}, {x2.dtype(), x2.device()});
  TG_DISPATCH_DEVICE(x2, ReduceKernels, sum_columns, x2, out, x2.size(0), x2.size(1), scratch);
}

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  check_defined("sum", "x", x);
  const std::vector<bool> reduced = reduced_mask("sum", x, dims);
  Tensor out = sum_over(x, reduced, kept_shape(x, reduced, keepdim));
  const Shape in_shape = x.shape(), keep_shape = kept_shape(x, reduced, true);
  return autograd::record(OpId::sum, out, {x}, {}, [in_shape, keep_shape](const Tensor& g, const auto&, const auto&) {
    return std::vector<Tensor>{expand(reshape(g, keep_shape), in_shape)};
  });
}

Tensor sum(const Tensor& x) {
  check_defined("sum", "x", x);
  std::vector<int64_t> all(x.dim());
  for (int64_t d = 0; d < x.dim(); ++d) all[d] = d;
  return sum(x, all);
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  check_defined("mean", "x", x);
  const std::vector<bool> reduced = reduced_mask("mean", x, dims);
  int64_t n = 1;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (reduced[d]) n *= x.shape()[d];
  TG_CHECK(n > 0, "mean: reducing dims of size 0 in shape ", x.shape());
  return mul(sum(x, dims, keepdim), 1.0 / static_cast<double>(n));
}

Tensor mean(const Tensor& x) {
  check_defined("mean", "x", x);
  TG_CHECK(x.numel() > 0, "mean: empty tensor of shape ", x.shape());
  return mul(sum(x), 1.0 / static_cast<double>(x.numel()));
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  check_defined("sum_to", "x", x);
  if (x.shape() == shape) return x;
  TG_CHECK(shape.size() <= x.shape().size() && broadcast_shapes("sum_to", shape, x.shape()) == x.shape(),
           "sum_to: cannot sum shape ", x.shape(), " to ", shape, " (", shape, " must broadcast to ", x.shape(), ")");
  const size_t lead = x.shape().size() - shape.size();
  std::vector<int64_t> dims;
  for (size_t d = 0; d < x.shape().size(); ++d)
    if (d < lead || (shape[d - lead] == 1 && x.shape()[d] != 1)) dims.push_back(static_cast<int64_t>(d));
  return reshape(sum(x, dims, true), shape);
}


}  // namespace tg
