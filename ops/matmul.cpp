#include "ops/matmul.h"

#include <Eigen/Core>

#include "autograd/engine.h"
#include "core/dispatch.h"
#include "core/indexing.h"
#include "ops/copy.h"
#include "ops/reduce.h"
#include "ops/views.h"

namespace tg {

namespace {

using Grads = std::vector<Tensor>;

// Strides of x's last two dims as BLAS sees them: a unit stride on one side and a
// leading dimension that covers the other. Size-1 dims get the strides BLAS expects.
GemmMatrix matrix_of(const Tensor& x) {
  const int64_t rows = x.shape()[x.dim() - 2], cols = x.shape()[x.dim() - 1];
  int64_t rs = x.strides()[x.dim() - 2], cs = x.strides()[x.dim() - 1];
  if (cols == 1) cs = 1;                                     // a column: row-major, ld = rs
  if (rows == 1) rs = cs == 1 ? std::max<int64_t>(cols, 1) : 1;  // a row: either layout
  return {x.raw_data(), rs, cs};
}

bool blas_layout_ok(const GemmMatrix& m, int64_t rows, int64_t cols) {
  const bool row_major = m.col_stride == 1 && m.row_stride >= std::max<int64_t>(cols, 1);
  const bool col_major = m.row_stride == 1 && m.col_stride >= std::max<int64_t>(rows, 1);
  return row_major || col_major;
}

// x itself when BLAS can read its matrices in place (a transposed view, say); else a contiguous copy.
Tensor blas_compatible(const Tensor& x) {
  const int64_t rows = x.shape()[x.dim() - 2], cols = x.shape()[x.dim() - 1];
  return blas_layout_ok(matrix_of(x), rows, cols) ? x : materialize(x);
}

// Batch dims of the three operands, merging neighbours whose strides allow it.
std::vector<GemmBatchDim> batch_dims(const Tensor& a, const Tensor& b, const Tensor& c) {
  std::vector<GemmBatchDim> dims;
  for (int64_t d = 0; d < c.dim() - 2; ++d) {
    const GemmBatchDim next{c.shape()[d], a.strides()[d], b.strides()[d], c.strides()[d]};
    if (next.size == 1) continue;
    if (!dims.empty()) {
      GemmBatchDim& prev = dims.back();
      const bool mergeable = prev.stride_a == next.stride_a * next.size &&
                             prev.stride_b == next.stride_b * next.size &&
                             prev.stride_c == next.stride_c * next.size;
      if (mergeable) {
        prev = {prev.size * next.size, next.stride_a, next.stride_b, next.stride_c};
        continue;
      }
    }
    dims.push_back(next);
  }
  return dims;
}

Shape matmul_shape(const Tensor& a, const Tensor& b) {
  TG_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul: a ", a.shape(), " and b ", b.shape(),
           " must both have at least 2 dims");
  const int64_t k = a.shape()[a.dim() - 1];
  TG_CHECK(k == b.shape()[b.dim() - 2], "matmul: a ", a.shape(), " and b ", b.shape(),
           " do not agree on the inner dimension (", k, " vs ", b.shape()[b.dim() - 2], ")");
  Shape out = broadcast_shapes("matmul", Shape(a.shape().begin(), a.shape().end() - 2),
                               Shape(b.shape().begin(), b.shape().end() - 2));
  out.push_back(a.shape()[a.dim() - 2]);
  out.push_back(b.shape()[b.dim() - 1]);
  return out;
}

// Batch-broadcast view of x [..., r, c] to out_batch + [r, c].
Tensor with_batch(const char* op, const Tensor& x, const Shape& out_shape) {
  Shape s(out_shape.begin(), out_shape.end() - 2);
  s.push_back(x.shape()[x.dim() - 2]);
  s.push_back(x.shape()[x.dim() - 1]);
  return broadcast_view(op, x, s);
}

}  // namespace

void gemm_into(const char* op, const Tensor& a_in, const Tensor& b_in, const Tensor& c, double beta,
               MatmulPrecision precision) {
  if (c.numel() == 0) return;
  const Tensor a = blas_compatible(with_batch(op, a_in, c.shape()));
  const Tensor b = blas_compatible(with_batch(op, b_in, c.shape()));
  GemmProblem p;
  p.dtype = c.dtype();
  p.n = c.shape()[c.dim() - 2];
  p.m = c.shape()[c.dim() - 1];
  p.k = a.shape()[a.dim() - 1];
  p.a = matrix_of(a);
  p.b = matrix_of(b);
  p.c = matrix_of(c);
  p.batch = batch_dims(a, b, c);
  p.beta = beta;
  p.precision = resolve_precision(precision);
  TG_DISPATCH_DEVICE(c, gemm, p);
}

Tensor matmul(const Tensor& a, const Tensor& b, MatmulPrecision precision) {
  check_defined("matmul", "a", a);
  check_defined("matmul", "b", b);
  check_same_dtype_device("matmul", a, b);
  Tensor out = empty(matmul_shape(a, b), {a.dtype(), a.device()});
  gemm_into("matmul", a, b, out, 0.0, precision);
  return autograd::record("matmul", out, {a, b}, {a, b}, [precision](const Tensor& g, const auto& s) {
    const Tensor& a = s[0];
    const Tensor& b = s[1];
    return Grads{sum_to(matmul(g, b.transpose(-1, -2), precision), a.shape()),
                 sum_to(matmul(a.transpose(-1, -2), g, precision), b.shape())};
  });
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, MatmulPrecision precision) {
  check_defined("linear", "x", x);
  check_defined("linear", "weight", w);
  check_same_dtype_device("linear", x, w);
  TG_CHECK(w.dim() == 2, "linear: weight must be [out, in], got ", w.shape());
  TG_CHECK(x.dim() >= 1 && x.shape().back() == w.shape()[1], "linear: x ", x.shape(),
           " and weight ", w.shape(), " do not agree on in_features (", x.shape().back(), " vs ",
           w.shape()[1], ")");
  const int64_t in = w.shape()[1], out_features = w.shape()[0];
  if (b.defined()) {
    check_same_dtype_device("linear", x, b);
    TG_CHECK(b.shape() == Shape{out_features}, "linear: bias ", b.shape(), " must be [", out_features,
             "] for weight ", w.shape());
  }
  const Tensor x2 = rows_view(materialize(x), in);
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  Tensor y2 = empty({x2.shape()[0], out_features}, {x.dtype(), x.device()});
  if (b.defined()) copy_into(y2, broadcast_view("linear", b, y2.shape()));  // y = b, then y += x W^T
  gemm_into("linear", x2, transposed_view(w), y2, b.defined() ? 1.0 : 0.0, precision);
  Tensor y = y2.view(out_shape);
  const bool has_bias = b.defined();
  return autograd::record("linear", y, {x, w, b}, {x2, w},
                          [precision, has_bias, x_shape = x.shape()](const Tensor& g, const auto& s) {
    const Tensor& x2 = s[0];
    const Tensor& w = s[1];
    const Tensor g2 = rows_view(materialize(g), w.shape()[0]);
    Tensor gx = matmul(g2, w, precision).view(x_shape);
    Tensor gw = matmul(g2.transpose(0, 1), x2, precision);
    return Grads{gx, gw, has_bias ? sum(g2, {0}) : Tensor()};  // column sums in fp32, whatever the precision
  });
}

namespace cpu {

template <class T>
void gemm_typed(const GemmProblem& p) {
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Strides = Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>;
  using ConstMap = Eigen::Map<const Mat, 0, Strides>;
  using Map = Eigen::Map<Mat, 0, Strides>;
  Shape sizes, sa, sb, sc;
  for (const GemmBatchDim& d : p.batch) {
    sizes.push_back(d.size), sa.push_back(d.stride_a), sb.push_back(d.stride_b), sc.push_back(d.stride_c);
  }
  const StridedIndexer ia = make_indexer("matmul", sizes, sa), ib = make_indexer("matmul", sizes, sb),
                       ic = make_indexer("matmul", sizes, sc);
  for (int64_t i = 0; i < numel(sizes); ++i) {
    ConstMap A(static_cast<const T*>(p.a.ptr) + ia.offset(i), p.n, p.k, Strides(p.a.row_stride, p.a.col_stride));
    ConstMap B(static_cast<const T*>(p.b.ptr) + ib.offset(i), p.k, p.m, Strides(p.b.row_stride, p.b.col_stride));
    Map C(static_cast<T*>(p.c.ptr) + ic.offset(i), p.n, p.m, Strides(p.c.row_stride, p.c.col_stride));
    if (p.beta == 0.0) C.setZero();
    else C *= static_cast<T>(p.beta);
    C.noalias() += A * B;
  }
}

void gemm(const GemmProblem& p) {
  TG_DISPATCH_FLOAT(p.dtype, T, [&] { gemm_typed<T>(p); });
}

}  // namespace cpu

}  // namespace tg
