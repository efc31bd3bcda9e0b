#include "ops/views.h"

#include <numeric>

#include "autograd/engine.h"
#include "ops/copy.h"
#include "ops/untracked.h"
#include "ops/reduce.h"

namespace tg {

namespace {

using Grads = std::vector<Tensor>;
using autograd::GradMask;

// Resolves one -1 in `shape` so that it holds `n` elements.
Shape infer_shape(const char* op, const Shape& shape, int64_t n, const Shape& from) {
  Shape out = shape;
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      TG_CHECK(infer < 0, op, ": more than one -1 in shape ", shape);
      infer = static_cast<int>(i);
    } else {
      TG_CHECK(out[i] >= 0, op, ": negative size in shape ", shape);
      TG_CHECK(!__builtin_mul_overflow(known, out[i], &known), op, ": shape ", shape,
               " has more elements than int64 can count");
    }
  }
  if (infer >= 0) {
    TG_CHECK(known > 0 && n % known == 0, op, ": cannot infer -1 in shape ", shape, " for ", n,
             " elements (input shape ", from, ")");
    out[infer] = n / known;
  }
  TG_CHECK(numel(out) == n, op, ": shape ", shape, " is invalid for an input of shape ", from,
           " (", n, " elements)");
  return out;
}

Tensor permuted_view(const char* op, const Tensor& x, const std::vector<int64_t>& dims) {
  TG_CHECK(static_cast<int64_t>(dims.size()) == x.dim(), op, ": ", dims.size(),
           " dims given for a tensor of shape ", x.shape());
  std::vector<bool> seen(dims.size(), false);
  Shape shape(dims.size()), strides(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    const int d = normalize_dim(op, dims[i], x.dim());
    TG_CHECK(!seen[d], op, ": dim ", dims[i], " repeats in the permutation of a tensor of shape ",
             x.shape());
    seen[d] = true;
    shape[i] = x.shape()[d];
    strides[i] = x.strides()[d];
  }
  return make_view(x, shape, strides, x.offset());
}

}  // namespace

Tensor view(const Tensor& x, const Shape& shape) {
  check_defined("view", "x", x);
  TG_CHECK(x.is_contiguous(), "view: tensor of shape ", x.shape(), " with strides ", x.strides(),
           " is not contiguous; use reshape()");
  const Shape s = infer_shape("view", shape, x.numel(), x.shape());
  Tensor out = make_view(x, s, contiguous_strides(s), x.offset());
  const Shape in_shape = x.shape();
  return autograd::record(OpId::view, out, {x}, {}, [in_shape](const Tensor& g, const auto&, const GradMask&) {
    return Grads{reshape(g, in_shape)};
  });
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  check_defined("reshape", "x", x);
  return view(contiguous(x), shape);
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  check_defined("permute", "x", x);
  Tensor out = permuted_view("permute", x, dims);
  std::vector<int64_t> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) inverse[normalize_dim("permute", dims[i], x.dim())] = i;
  return autograd::record(OpId::permute, out, {x}, {}, [inverse](const Tensor& g, const auto&, const GradMask&) {
    return Grads{permute(g, inverse)};
  });
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  check_defined("transpose", "x", x);
  std::vector<int64_t> dims(x.dim());
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[normalize_dim("transpose", dim0, x.dim())], dims[normalize_dim("transpose", dim1, x.dim())]);
  Tensor out = permuted_view("transpose", x, dims);
  return autograd::record(OpId::transpose, out, {x}, {}, [dim0, dim1](const Tensor& g, const auto&, const GradMask&) {
    return Grads{transpose(g, dim0, dim1)};
  });
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  check_defined("narrow", "x", x);
  const int d = normalize_dim("narrow", dim, x.dim());
  if (!(start >= 0 && length >= 0 && start <= x.shape()[d] && length <= x.shape()[d] - start)) {
    int64_t end = 0;
    const std::string end_text = __builtin_add_overflow(start, length, &end) ? detail::concat(start, " + ", length)
                                                                             : std::to_string(end);
    TG_FAIL("narrow: range [", start, ", ", end_text, ") is out of bounds for dim ", dim, " of shape ", x.shape());
  }
  Shape shape = x.shape();
  shape[d] = length;
  Tensor out = make_view(x, shape, x.strides(), x.offset() + start * x.strides()[d]);
  const Shape in_shape = x.shape();
  return autograd::record(OpId::narrow, out, {x}, {}, [in_shape, d, start, length](const Tensor& g, const auto&, const GradMask&) {
    Tensor gx = zeros(in_shape, {g.dtype(), g.device()});
    copy_into(make_view(gx, g.shape(), gx.strides(), start * gx.strides()[d]), g);
    return Grads{gx};
  });
}

Tensor broadcast_view(const char* op, const Tensor& x, const Shape& shape) {
  TG_CHECK(shape.size() >= x.shape().size(), op, ": cannot expand shape ", x.shape(), " to ", shape);
  checked_numel(op, shape);
  const size_t lead = shape.size() - x.shape().size();
  Shape strides(shape.size(), 0);
  for (size_t i = 0; i < x.shape().size(); ++i) {
    const int64_t have = x.shape()[i], want = shape[lead + i];
    TG_CHECK(have == want || have == 1, op, ": cannot expand shape ", x.shape(), " to ", shape,
             " (dim ", i, ": ", have, " vs ", want, ")");
    strides[lead + i] = have == want ? x.strides()[i] : 0;
  }
  return make_view(x, shape, strides, x.offset());
}

Tensor transposed_view(const Tensor& x) {
  TG_CHECK(x.dim() >= 2, "transposed_view: x must have at least 2 dims, got ", x.shape());
  Shape shape = x.shape(), strides = x.strides();
  std::swap(shape[x.dim() - 1], shape[x.dim() - 2]);
  std::swap(strides[x.dim() - 1], strides[x.dim() - 2]);
  return make_view(x, shape, strides, x.offset());
}

Tensor rows_view(const Tensor& x, int64_t cols) {
  TG_CHECK(x.is_contiguous() && x.dim() >= 1 && x.shape().back() == cols, "rows_view: x ", x.shape(),
           " must be contiguous with a last dim of ", cols);
  return make_view(x, {numel(Shape(x.shape().begin(), x.shape().end() - 1)), cols}, {cols, 1}, x.offset());
}

Tensor expand(const Tensor& x, const Shape& shape_in) {
  check_defined("expand", "x", x);
  TG_CHECK(shape_in.size() >= x.shape().size(), "expand: cannot expand shape ", x.shape(), " to ", shape_in);
  Shape shape = shape_in;  // -1 keeps the size of one of x's dims, as in PyTorch
  const size_t lead = shape.size() - x.shape().size();
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] != -1) continue;
    TG_CHECK(i >= lead, "expand: -1 at dim ", i, " of ", shape_in, " names no dim of x ", x.shape(),
             " (new leading dims need a size)");
    shape[i] = x.shape()[i - lead];
  }
  Tensor out = broadcast_view("expand", x, shape);
  const Shape in_shape = x.shape();
  return autograd::record(OpId::expand, out, {x}, {}, [in_shape](const Tensor& g, const auto&, const GradMask&) {
    return Grads{sum_to(g, in_shape)};
  });
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  check_defined("unsqueeze", "x", x);
  const int d = normalize_dim("unsqueeze", dim, x.dim() + 1);
  Shape shape = x.shape(), strides = x.strides();
  const int64_t stride = d < x.dim() ? x.shape()[d] * x.strides()[d] : 1;
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, stride);
  Tensor out = make_view(x, shape, strides, x.offset());
  const Shape in_shape = x.shape();
  return autograd::record(OpId::unsqueeze, out, {x}, {}, [in_shape](const Tensor& g, const auto&, const GradMask&) {
    return Grads{reshape(g, in_shape)};
  });
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  check_defined("squeeze", "x", x);
  const int d = normalize_dim("squeeze", dim, x.dim());
  TG_CHECK(x.shape()[d] == 1, "squeeze: dim ", dim, " of shape ", x.shape(), " has size ", x.shape()[d], ", not 1");
  Shape shape = x.shape(), strides = x.strides();
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  Tensor out = make_view(x, shape, strides, x.offset());
  const Shape in_shape = x.shape();
  return autograd::record(OpId::squeeze, out, {x}, {}, [in_shape](const Tensor& g, const auto&, const GradMask&) {
    return Grads{reshape(g, in_shape)};
  });
}

Tensor contiguous(const Tensor& x) {
  check_defined("contiguous", "x", x);
  if (x.is_contiguous()) return x;
  return autograd::record(OpId::contiguous, materialize(x), {x}, {}, [](const Tensor& g, const auto&, const GradMask&) {
    return Grads{g};
  });
}

}  // namespace tg
