#include "ops/matmul.h"

#include <Eigen/Core>
#include <algorithm>
#include <utility>

#include "autograd/engine.h"
#include "core/cpu_loops.h"
#include "core/indexing.h"
#include "core/pack.h"
#include "ops/elementwise.h"
#include "ops/matmul_kernels.h"
#include "ops/reduce.h"
#include "ops/untracked.h"
#include "ops/views.h"

namespace tg {

namespace {

using Grads = std::vector<Tensor>;
using autograd::grad_if;
using autograd::GradMask;

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

namespace {

// f(an Eigen map of m at offset, rows x cols): row- or column-major as m's
// BLAS layout is (blas_layout_ok), with a unit inner stride known at compile
// time, which Eigen's GEMM reads in place (a map with a run-time inner stride
// it would first copy).
template <class T, class F>
void with_eigen_map(const GemmMatrix& m, int64_t offset, int64_t rows, int64_t cols, const F& f) {
  const auto map = [&](auto order, int64_t ld) {
    using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, decltype(order)::value>;
    return Eigen::Map<const Matrix, 0, Eigen::OuterStride<>>(static_cast<const T*>(m.ptr) + offset, rows, cols,
                                                              Eigen::OuterStride<>(ld));
  };
  if (m.col_stride == 1) return f(map(std::integral_constant<int, Eigen::RowMajor>{}, m.row_stride));
  f(map(std::integral_constant<int, Eigen::ColMajor>{}, m.col_stride));
}

constexpr int64_t kSmallProduct = int64_t(1) << 18;  // n m k of 64 x 64 x 64

template <class T>
void gemm_typed(const GemmProblem& p) {
  using Out = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0, Eigen::OuterStride<>>;
  TG_CHECK(p.c.col_stride == 1, "matmul: the output's matrices must have a unit column stride, got ", p.c.col_stride);
  Shape sizes, sa, sb, sc;
  for (const GemmBatchDim& d : p.batch) {
    sizes.push_back(d.size), sa.push_back(d.stride_a), sb.push_back(d.stride_b), sc.push_back(d.stride_c);
  }
  const StridedIndexer ia = make_indexer("matmul", sizes, sa), ib = make_indexer("matmul", sizes, sb),
                       ic = make_indexer("matmul", sizes, sc);
  const auto product = [&](int64_t i) {
    Out C(static_cast<T*>(p.c.ptr) + ic.offset(i), p.n, p.m, Eigen::OuterStride<>(p.c.row_stride));
    if (p.beta == 0.0) C.setZero();
    else C *= static_cast<T>(p.beta);
    with_eigen_map<T>(p.a, ia.offset(i), p.n, p.k, [&](const auto& A) {
      with_eigen_map<T>(p.b, ib.offset(i), p.k, p.m, [&](const auto& B) { C.noalias() += A * B; });
    });
  };
  // Products run one per thread where the batch fills the threads or each is
  // below kSmallProduct (which Eigen would not split well); else
  // one after another, each on Eigen's own threads. (Not one loop with an `if`
  // clause: its one-thread region made Eigen's threads a nested team, 2x slower.)
  const int64_t batch = numel(sizes);
  const bool per_thread = batch > 1 && (batch >= cpu::threads() || p.n * p.m * p.k < kSmallProduct);
  if (!per_thread) {
    for (int64_t i = 0; i < batch; ++i) product(i);
    return;
  }
#pragma omp parallel for
  for (int64_t i = 0; i < batch; ++i) product(i);
}

}  // namespace

template <>
void GemmKernels<Device::CPU>::gemm(const GemmProblem& p) {
  TG_DISPATCH_FLOAT(p.dtype, T, [&] { gemm_typed<T>(p); });
}

template <>
void GemmKernels<Device::CPU>::to_fp16(const std::vector<Tensor>&, const std::vector<Tensor>&, const Fp16Group&, int,
                                       const Fp16HeadDots&) {
  TG_FAIL("to_fp16: fp16 GEMM operands exist on CUDA only");
}

template <>
void GemmKernels<Device::CPU>::gemm_fp16(const Fp16Group&, int, bool, int, bool, const Tensor&, const Tensor&) {
  TG_FAIL("gemm_fp16: fp16 GEMMs run on CUDA only");
}
template <>
bool GemmKernels<Device::CPU>::try_gemm_fp16_bias(const Fp16Group&, int, bool, int, bool, const Tensor&,
                                                  const Tensor&) {
  return false;  // gemm_fp16 then says it runs on CUDA only
}

template <>
bool GemmKernels<Device::CPU>::product_to_fp16(const Fp16Group&, const Tensor&, const Fp16Group&) {
  return false;  // linear_to_fp16's to_fp16 says it runs on CUDA only first
}

template <>
void GemmKernels<Device::CPU>::product_amax(const Fp16Group&) {
  TG_FAIL("linear_to_fp16: fp16 products run on CUDA only");
}

template <>
void GemmKernels<Device::CPU>::finish_product(const Fp16Group&) {
  TG_FAIL("linear_to_fp16: fp16 products run on CUDA only");
}

template <>
void GemmKernels<Device::CPU>::regroup_scalars(const std::vector<Fp16ScaleSource>&, const Tensor&) {
  TG_FAIL("regroup_fp16: fp16 groups exist on CUDA only");
}

template <>
int64_t GemmKernels<Device::CPU>::gemm_fp16_workspace(const Fp16Group&, int, bool, int, bool, const Tensor&) {
  TG_FAIL("gemm_fp16: fp16 GEMMs run on CUDA only");
}

void gemm_into(const char* op, const Tensor& a_in, const Tensor& b_in, const Tensor& c, double beta,
               MatmulPrecision precision) {
  if (c.numel() == 0) return;
  if (a_in.shape().back() == 0) {  // an empty sum: C = beta C
    if (beta == 0.0) fill_into(c, 0.0);
    else copy_into(c, mul(c, beta));
    return;
  }
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
  TG_DISPATCH_DEVICE(c, GemmKernels, gemm, p);
}

namespace {
// 1 to kMaxFp16Group contiguous 2-D float32 matrices on one device.
void check_fp16_matrices(const char* op, const std::vector<Tensor>& xs) {
  TG_CHECK(!xs.empty() && xs.size() <= size_t(kMaxFp16Group), op, ": takes 1 to ", kMaxFp16Group,
           " matrices, got ", xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    check_defined(op, "x", x);
    TG_CHECK(x.dtype() == DType::Float32 && x.dim() == 2 && x.is_contiguous() && x.device() == xs[0].device(), op,
             ": matrix ", i, " must be contiguous, 2-D, float32 and on ", xs[0].device(), " like matrix 0; got ",
             dtype_name(x.dtype()), " ", x.shape(), " with strides ", x.strides(), " on ", x.device());
  }
}

// The group of xs, checked and allocated, not filled; errors name `op`.
Fp16Group allocate_fp16_group(const char* op, const std::vector<Tensor>& xs, bool with_lows = false) {
  check_fp16_matrices(op, xs);
  Fp16Group group;
  for (const Tensor& x : xs) {
    group.matrices.push_back(allocate_fp16_matrix(x.size(0), x.size(1), x.device()));
    if (with_lows) group.lows.push_back(allocate_fp16_matrix(x.size(0), x.size(1), x.device()));
  }
  group.scalars = empty({kFp16Scalars}, {DType::Float32, xs[0].device()});
  return group;
}

// b undefined, or a contiguous float32 [cols] on `device` (a bias added to
// every row of a matrix of `what`'s cols columns); errors name `op`.
void check_column_bias(const char* op, const std::string& what, const Tensor& b, int64_t cols, Device device) {
  if (!b.defined()) return;
  TG_CHECK(b.dtype() == DType::Float32 && b.is_contiguous() && b.shape() == Shape{cols} && b.device() == device, op,
           ": the column bias of ", what, " must be a contiguous float32 [", cols, "] on ", device, "; got ",
           dtype_name(b.dtype()), " ", b.shape(), " on ", b.device());
}
}  // namespace

Fp16Matrix allocate_fp16_matrix(int64_t rows, int64_t cols, Device device) {
  return {empty({(rows * cols + 1) / 2}, {DType::Float32, device}), rows, cols};
}

Fp16Group fp16_group(const std::vector<Tensor>& xs, bool split) { return allocate_fp16_group("fp16_group", xs, split); }

void convert_to_fp16(const std::vector<Tensor>& xs, const Fp16Group& group, int first_slot) {
  const char* op = "convert_to_fp16";
  check_fp16_matrices(op, xs);
  TG_CHECK(first_slot >= 0 && static_cast<size_t>(first_slot) + xs.size() <= group.matrices.size(), op, ": ", xs.size(),
           " matrices from slot ", first_slot, " into a group of ", group.matrices.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    const Fp16Matrix& m = group.matrices[first_slot + i];
    TG_CHECK(xs[i].size(0) == m.rows && xs[i].size(1) == m.cols && xs[i].device() == group.scalars.device(), op,
             ": matrix ", i, " ", xs[i].shape(), " on ", xs[i].device(), " into slot ", first_slot + i,
             " of a group made for [", m.rows, ", ", m.cols, "] on ", group.scalars.device());
  }
  TG_DISPATCH_DEVICE(xs[0], GemmKernels, to_fp16, xs, std::vector<Tensor>(xs.size()), group, first_slot,
                     Fp16HeadDots{});
}

Fp16Group to_fp16(const std::vector<Tensor>& xs, const std::vector<Tensor>& column_biases) {
  const char* op = "to_fp16";
  Fp16Group group = allocate_fp16_group(op, xs);
  TG_CHECK(column_biases.empty() || column_biases.size() == xs.size(), op, ": ", column_biases.size(),
           " column biases for ", xs.size(), " matrices (none, or one per matrix)");
  std::vector<Tensor> biases(xs.size());
  for (size_t i = 0; i < column_biases.size(); ++i) {
    check_column_bias(op, "matrix " + std::to_string(i) + " " + to_string(xs[i].shape()), column_biases[i],
                      xs[i].size(1), xs[i].device());
    biases[i] = column_biases[i];
  }
  TG_DISPATCH_DEVICE(xs[0], GemmKernels, to_fp16, xs, biases, group, 0, Fp16HeadDots{});
  return group;
}

Fp16Group to_fp16_split(const std::vector<Tensor>& xs) {
  Fp16Group group = allocate_fp16_group("to_fp16_split", xs, true);
  TG_DISPATCH_DEVICE(xs[0], GemmKernels, to_fp16, xs, std::vector<Tensor>(xs.size()), group, 0, Fp16HeadDots{});
  return group;
}

Fp16Group regroup_fp16(const std::vector<Fp16ScaleSource>& sources) {
  const char* op = "regroup_fp16";
  TG_CHECK(!sources.empty() && sources.size() <= size_t(kMaxFp16Group), op, ": takes 1 to ", kMaxFp16Group,
           " matrices, got ", sources.size());
  TG_CHECK(sources[0].scalars.defined(), op, ": matrix 0's values or scalars are undefined");
  const Device device = sources[0].scalars.device();
  Fp16Group group;
  for (size_t i = 0; i < sources.size(); ++i) {
    const Fp16ScaleSource& src = sources[i];
    const Tensor &values = src.matrix.values, &scalars = src.scalars;
    TG_CHECK(values.defined() && scalars.defined(), op, ": matrix ", i, "'s values or scalars are undefined");
    TG_CHECK(values.numel() == (src.matrix.rows * src.matrix.cols + 1) / 2 && values.device() == device &&
                 values.is_contiguous() && values.dtype() == DType::Float32 && scalars.device() == device &&
                 scalars.is_contiguous() && scalars.dtype() == DType::Float32,
             op, ": matrix ", i, " [", src.matrix.rows, ", ", src.matrix.cols, "] with ", values.numel(),
             " values on ", values.device(), ", scalars ", scalars.shape(), " on ", scalars.device(),
             ": needs its fp16 pairs and scalars, contiguous float32, on ", device);
    const int64_t limit = src.kind == Fp16ScaleSource::kExponent ? scalars.numel() : kMaxFp16Group;
    TG_CHECK(src.index >= 0 && src.index < limit && (src.kind == Fp16ScaleSource::kExponent ||
                                                     scalars.numel() == kFp16Scalars),
             op, ": matrix ", i, "'s scale at index ", src.index, " of ", scalars.numel(), " scalars");
    TG_CHECK(src.shift >= 0 && src.shift <= 64, op, ": matrix ", i, "'s shift ", src.shift, " is outside [0, 64]");
    group.matrices.push_back(src.matrix);
  }
  group.scalars = empty({kFp16Scalars}, {DType::Float32, device});
  TG_DISPATCH_DEVICE(group.scalars, GemmKernels, regroup_scalars, sources, group.scalars);
  return group;
}

Fp16Group to_fp16_with_head_dots(const Tensor& x, const Fp16HeadDots& dots, bool split) {
  const char* op = "to_fp16_with_head_dots";
  check_fp16_matrices(op, {x});  // before its sizes are read; the group is allocated once everything is checked
  const Tensor &other = dots.other, &out = dots.out;
  check_defined(op, "other", other);
  check_defined(op, "out", out);
  const int64_t S = dots.seq_len, rows = x.size(0), C = x.size(1);
  TG_CHECK(C % 64 == 0 && S > 0 && rows % S == 0, op, ": x ", x.shape(), " must be [B S, 64 H] for seq_len ", S);
  TG_CHECK(other.shape() == x.shape() && other.dtype() == DType::Float32 && other.is_contiguous() &&
               other.device() == x.device(),
           op, ": other must be a contiguous float32 ", x.shape(), " on ", x.device(), " like x; got ",
           dtype_name(other.dtype()), " ", other.shape(), " on ", other.device());
  const Shape out_shape{rows / S, C / 64, S};
  TG_CHECK(out.shape() == out_shape && out.dtype() == DType::Float32 && out.is_contiguous() &&
               out.device() == x.device(),
           op, ": out must be a contiguous float32 ", out_shape, " on ", x.device(), "; got ",
           dtype_name(out.dtype()), " ", out.shape(), " on ", out.device());
  TG_CHECK(aligned16(x.raw_data()) && aligned16(other.raw_data()), op,
           ": x and other must start on 16-byte boundaries (read as vectors)");
  Fp16Group group = allocate_fp16_group(op, {x}, split);
  TG_DISPATCH_DEVICE(x, GemmKernels, to_fp16, std::vector<Tensor>{x}, std::vector<Tensor>(1), group, 0, dots);
  return group;
}

namespace {

// Matrices a and b of the group, which must hold them.
std::pair<const Fp16Matrix&, const Fp16Matrix&> gemm_fp16_operands(const Fp16Group& group, int a, int b) {
  const int count = static_cast<int>(group.matrices.size());
  TG_CHECK(a >= 0 && a < count && b >= 0 && b < count, "gemm_fp16: matrices ", a, " and ", b, " of a group of ", count);
  TG_CHECK(group.lows.empty() || group.lows.size() == group.matrices.size(), "gemm_fp16: ", group.lows.size(),
           " low parts for ", count, " matrices (none, or one per matrix)");
  return {group.matrices[a], group.matrices[b]};
}

// Checks that c [n, m] is op(A) @ op(B)'s contiguous float32 result; returns the depth k.
int64_t check_fp16_product(const Fp16Group& group, int a, bool transpose_a, int b, bool transpose_b, const Tensor& c) {
  const auto [A, B] = gemm_fp16_operands(group, a, b);
  const int64_t n = transpose_a ? A.cols : A.rows, k = transpose_a ? A.rows : A.cols;
  const int64_t kb = transpose_b ? B.cols : B.rows, m = transpose_b ? B.rows : B.cols;
  TG_CHECK(k == kb && c.dim() == 2 && c.size(0) == n && c.size(1) == m && c.is_contiguous() &&
               c.dtype() == DType::Float32,
           "gemm_fp16: [", n, ", ", k, "] @ [", kb, ", ", m, "] does not give c ", c.shape(), " (contiguous float32)");
  return k;
}

}  // namespace

void gemm_fp16_into(const Fp16Group& group, int a, bool transpose_a, int b, bool transpose_b, const Tensor& c,
                    const Tensor& workspace, const Tensor& bias) {
  const int64_t k = check_fp16_product(group, a, transpose_a, b, transpose_b, c);
  TG_CHECK(!workspace.defined() || (workspace.is_contiguous() && workspace.dtype() == DType::Float32 &&
                                    workspace.device() == c.device()),
           "gemm_fp16: the workspace must be contiguous float32 on c's device (", c.device(), "), got ",
           workspace.shape(), " ", workspace.dtype(), " on ", workspace.device(),
           workspace.is_contiguous() ? "" : ", not contiguous");
  TG_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == c.size(1) && bias.dtype() == DType::Float32 &&
                               bias.device() == c.device()),
           "gemm_fp16: the bias must be float32 [", c.size(1), "] on ", c.device(), " for c ", c.shape(), "; got ",
           dtype_name(bias.dtype()), " ", bias.shape(), " on ", bias.device());
  if (c.numel() == 0) return;
  if (bias.defined() && k > 0 &&
      TG_DISPATCH_DEVICE(c, GemmKernels, try_gemm_fp16_bias, group, a, transpose_a, b, transpose_b, bias, c))
    return;
  if (k == 0) fill_into(c, 0.0);  // an empty sum
  else TG_DISPATCH_DEVICE(c, GemmKernels, gemm_fp16, group, a, transpose_a, b, transpose_b, c, workspace);
  if (bias.defined()) add_into(c, bias);
}

int64_t gemm_fp16_workspace(const Fp16Group& group, int a, bool transpose_a, int b, bool transpose_b, const Tensor& c) {
  const int64_t k = check_fp16_product(group, a, transpose_a, b, transpose_b, c);
  if (c.numel() == 0 || k == 0) return 0;
  return TG_DISPATCH_DEVICE(c, GemmKernels, gemm_fp16_workspace, group, a, transpose_a, b, transpose_b, c);
}

Tensor gemm_fp16(const Fp16Group& group, int a, bool transpose_a, int b, bool transpose_b, const Tensor& bias) {
  const auto [A, B] = gemm_fp16_operands(group, a, b);
  const Tensor c = empty({transpose_a ? A.cols : A.rows, transpose_b ? B.rows : B.cols},
                         {DType::Float32, A.values.device()});
  gemm_fp16_into(group, a, transpose_a, b, transpose_b, c, Tensor(), bias);
  return c;
}

// The split GEMM's time for s stretches, with one CTA per SM (192 KB of
// shared memory): a fixed part, ceil(tiles s / SMs) waves of (ceil(chunks /
// s) chunks + a CTA's prologue and epilogue), plus for s > 1 AddSlices, a
// launch and s + 1 passes over c (s - 1 partials and c read, c written). The
// constants are rounded from a fit to the 64 products of b508663's
// bench/split_gemm on the H200 (bench/results/split_gemm_v27-h200.txt, each
// within 6% of its time; bench/NOTES.md version 28): 3 us fixed, a chunk
// 1.1 us, a CTA's prologue and epilogue 2.5 chunks, AddSlices 2 us and
// 3.5 TB/s. They are used on any device of compute capability 9.0.
double split_gemm_model_us(int64_t rows, int64_t cols, int64_t depth, int64_t stretches, int64_t sms) {
  TG_CHECK(rows > 0 && cols > 0 && depth > 0 && stretches > 0 && sms > 0, "split_gemm_model_us: c [", rows, ", ",
           cols, "] over depth ", depth, " in ", stretches, " stretches on ", sms, " SMs: each must be positive");
  constexpr double kFixedUs = 3.0, kChunkUs = 1.1, kCtaChunks = 2.5, kAddLaunchUs = 2.0, kAddBytesPerUs = 3.5e6;
  const int64_t per_stretch = split_gemm_chunks_per_stretch(split_gemm_chunks(depth), stretches);
  const int64_t waves = (split_gemm_tiles(rows, cols) * stretches + sms - 1) / sms;
  const double c_bytes = double(rows) * double(cols) * sizeof(float);
  const double add = stretches > 1 ? kAddLaunchUs + double(stretches + 1) * c_bytes / kAddBytesPerUs : 0;
  return kFixedUs + double(waves) * (double(per_stretch) + kCtaChunks) * kChunkUs + add;
}

// A split with an empty stretch walks as many chunks per CTA as the fewer
// stretches that hold them, with more CTAs and AddSlices passes: it is never
// the least modelled time, so the kernel's condition (no stretch empty) holds.
int split_gemm_stretches(int64_t rows, int64_t cols, int64_t depth, int64_t sms) {
  TG_CHECK(rows > 0 && cols > 0 && depth > 0 && sms > 0, "split_gemm_stretches: c [", rows, ", ", cols,
           "] over depth ", depth, " on ", sms, " SMs: each must be positive");
  const int64_t most = std::min(split_gemm_chunks(depth), std::max<int64_t>(1, 8 * sms / split_gemm_tiles(rows, cols)));
  int64_t best = 1;
  double best_us = split_gemm_model_us(rows, cols, depth, 1, sms);
  for (int64_t s = 2; s <= most; ++s) {
    const double us = split_gemm_model_us(rows, cols, depth, s, sms);
    if (us < best_us) best = s, best_us = us;
  }
  return static_cast<int>(best);
}

std::pair<Tensor, Tensor> projection_grads_fp16(const Fp16Group& group, int iw, int ix) {
  if (iw < 0 && ix < 0) return {};
  const int n = int(group.matrices.size());
  TG_CHECK(iw < n && ix < n, "projection_grads_fp16: slots ", iw, " (W) and ", ix, " (x) in a group of ", n,
           " matrices");
  if (iw < 0 || ix < 0)
    return {iw < 0 ? Tensor() : gemm_fp16(group, 0, false, iw, false),
            ix < 0 ? Tensor() : gemm_fp16(group, 0, true, ix, false)};
  const Fp16Matrix &g = group.matrices[0], &x = group.matrices[ix];
  const TensorOptions opts{DType::Float32, g.values.device()};
  const Tensor dw = empty({g.cols, x.cols}, opts);
  const int64_t floats = gemm_fp16_workspace(group, 0, true, ix, false, dw);
  const Tensor workspace = floats > 0 ? empty({floats}, opts) : Tensor();
  cuda::Fork weight_grad(dw.is_cuda());
  weight_grad.run([&] { gemm_fp16_into(group, 0, true, ix, false, dw, workspace); });
  Tensor dx = gemm_fp16(group, 0, false, iw, false);
  weight_grad.join();
  return {std::move(dx), dw};
}

Fp16Product start_linear_to_fp16(const Tensor& x2, const Tensor& w, const Tensor& b) {
  const char* op = "linear_to_fp16";
  check_fp16_matrices(op, {x2, w});
  TG_CHECK(x2.size(1) == w.size(1), op, ": x ", x2.shape(), " and W ", w.shape(), " differ in their inner size");
  check_column_bias(op, "x W^T " + to_string(Shape{x2.size(0), w.size(0)}), b, w.size(0), x2.device());
  const Fp16Group xw = to_fp16({x2, w});
  const Fp16Group y{{allocate_fp16_matrix(x2.size(0), w.size(0), x2.device())},
                    empty({kFp16Scalars}, {DType::Float32, x2.device()}),
                    {}};
  if (TG_DISPATCH_DEVICE(x2, GemmKernels, product_to_fp16, xw, b, y)) return {y, true};
  return {to_fp16({gemm_fp16(xw, 0, false, 1, true)}, {b}), false};
}

void find_fp16_product_amax(const Fp16Product& product) {
  if (product.pending) TG_DISPATCH_DEVICE(product.y.scalars, GemmKernels, product_amax, product.y);
}

void finish_fp16_product(const Fp16Product& product) {
  if (product.pending) TG_DISPATCH_DEVICE(product.y.scalars, GemmKernels, finish_product, product.y);
}

Fp16Group linear_to_fp16(const Tensor& x2, const Tensor& w, const Tensor& b) {
  const Fp16Product product = start_linear_to_fp16(x2, w, b);
  find_fp16_product_amax(product);
  finish_fp16_product(product);
  return product.y;
}

Tensor linear_forward(const char* op, const Tensor& x2, const Tensor& w, const Tensor& b, MatmulPrecision precision,
                      bool half) {
  // y = x W^T + b, b in the GEMM's epilogue where cuBLASLt takes it (no pass over y of its own), else added after
  if (half) return gemm_fp16(to_fp16({x2, w}), 0, false, 1, true, b);
  Tensor y2 = empty({x2.size(0), w.size(0)}, {x2.dtype(), x2.device()});
  if (b.defined()) copy_into(y2, broadcast_view(op, b, y2.shape()));  // y = b, then y += x W^T
  gemm_into(op, x2, transposed_view(w), y2, b.defined() ? 1.0 : 0.0, precision);
  return y2;
}

Grads linear_backward(Tensor g2, const Tensor& x2, const Tensor& w, const GradMask& needs, MatmulPrecision precision,
                      bool half) {
  if (!half)
    return Grads{grad_if(needs[0], [&] { return matmul(g2, w, precision); }),
                 grad_if(needs[1], [&] { return matmul(g2.transpose(0, 1), x2, precision); }),
                 grad_if(needs[2], [&] { return sum(g2, {0}); })};  // column sums in g's own dtype, never TF32
  // g, W (for dx) and x (for dW) as needed, converted together
  const int iw = needs[0] ? 1 : -1, ix = needs[1] ? 1 + int(needs[0]) : -1;
  return linear_backward_fp16(std::move(g2), needs, iw, ix, [&](const Tensor& g) {
    std::vector<Tensor> matrices{g};
    if (needs[0]) matrices.push_back(w);
    if (needs[1]) matrices.push_back(x2);
    return to_fp16(matrices);
  });
}

Grads linear_backward_fp16(Tensor g2, const GradMask& needs, int iw, int ix,
                           const std::function<Fp16Group(const Tensor&)>& group_of) {
  // db, the float g's column sums, on a side stream beside group_of's
  // conversion; the float g dropped after both, before the products' outputs exist.
  const TensorOptions opts{g2.dtype(), g2.device()};
  const int64_t scratch = needs[2] ? sum_columns_scratch(g2) : 0;
  const Tensor db = needs[2] ? empty({g2.size(1)}, opts) : Tensor();
  Tensor db_scratch = scratch > 0 ? empty({scratch}, opts) : Tensor();
  cuda::Fork bias_sums(needs[2] && g2.is_cuda());
  if (needs[2]) bias_sums.run([&] { sum_columns_into(db, g2, db_scratch); });
  const Fp16Group group = needs[0] || needs[1] ? group_of(g2) : Fp16Group{};
  bias_sums.join();
  g2 = db_scratch = Tensor();
  auto [dx, dw] = projection_grads_fp16(group, iw, ix);
  return Grads{std::move(dx), std::move(dw), db};
}

Tensor matmul(const Tensor& a, const Tensor& b, MatmulPrecision precision) {
  check_defined("matmul", "a", a);
  check_defined("matmul", "b", b);
  check_same_dtype_device("matmul", a, b);
  Tensor out = empty(matmul_shape(a, b), {a.dtype(), a.device()});
  gemm_into("matmul", a, b, out, 0.0, precision);
  const GradMask m = autograd::grad_mask({a, b});
  return autograd::record(OpId::matmul, out, {a, b}, {autograd::keep_if(m[0], b), autograd::keep_if(m[1], a)},
                          [precision, sa = a.shape(), sb = b.shape()](const Tensor& g, const auto& s, const GradMask& needs) {
    return Grads{grad_if(needs[0], [&] { return sum_to(matmul(g, s[0].transpose(-1, -2), precision), sa); }),
                 grad_if(needs[1], [&] { return sum_to(matmul(s[1].transpose(-1, -2), g, precision), sb); })};
  });
}

namespace {

// x W^T + b, recorded as `op` (linear_forward and linear_backward).
Tensor linear_impl(OpId op, const Tensor& x, const Tensor& w_in, const Tensor& b, MatmulPrecision precision,
                   bool half) {
  const char* name = op_name(op);
  check_defined(name, "x", x);
  check_defined(name, "weight", w_in);
  check_same_dtype_device(name, x, w_in);
  TG_CHECK(w_in.dim() == 2, name, ": weight must be [out, in], got ", w_in.shape());
  TG_CHECK(x.dim() >= 1, name, ": x must have at least one dim [..., in], got ", x.shape());
  TG_CHECK(x.shape().back() == w_in.shape()[1], name, ": x ", x.shape(), " and weight ", w_in.shape(),
           " do not agree on in_features (", x.shape().back(), " vs ", w_in.shape()[1], ")");
  const int64_t in = w_in.shape()[1], out_features = w_in.shape()[0];
  if (b.defined()) {
    check_same_dtype_device(name, x, b);
    TG_CHECK(b.shape() == Shape{out_features}, name, ": bias ", b.shape(), " must be [", out_features,
             "] for weight ", w_in.shape());
  }
  half = half && x.is_cuda() && x.dtype() == DType::Float32;
  const Tensor x2 = rows_view(materialize(x), in), w = half ? materialize(w_in) : w_in;
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  Tensor y = linear_forward(name, x2, w, b, precision, half).view(out_shape);
  const GradMask m = autograd::grad_mask({x, w_in, b});
  return autograd::record(op, y, {x, w_in, b}, {autograd::keep_if(m[1], x2), autograd::keep_if(m[0], w)},
                          [precision, half, x_shape = x.shape(), out_features](Tensor g, const auto& s,
                                                                               const GradMask& needs) {
    Tensor g2 = rows_view(materialize(g), out_features);
    g = Tensor();  // g2 is the only handle: linear_backward may drop it early
    Grads grads = linear_backward(std::move(g2), s[0], s[1], needs, precision, half);
    if (grads[0].defined()) grads[0] = grads[0].view(x_shape);
    return grads;
  });
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, MatmulPrecision precision) {
  return linear_impl(OpId::linear, x, w, b, precision, false);
}

Tensor linear_fp16(const Tensor& x, const Tensor& w, const Tensor& b) {
  return linear_impl(OpId::linear_fp16, x, w, b, MatmulPrecision::High, true);
}

}  // namespace tg
