// The GEMM problem both back ends solve, and its kernels.
#pragma once
#include <cmath>
#include <functional>
#include <vector>

#include "core/cuda.h"
#include "core/hd.h"
#include "core/dispatch.h"
#include "core/tensor.h"

namespace tg {

// One strided matrix of a GEMM: element (r, c) is at ptr[r * row_stride + c * col_stride].
struct GemmMatrix {
  void* ptr = nullptr;
  int64_t row_stride = 0, col_stride = 0;
};

// A batch dim shared by the three operands, with each one's stride.
struct GemmBatchDim {
  int64_t size = 1, stride_a = 0, stride_b = 0, stride_c = 0;
};

// C = A @ B + beta * C for every batch index; A [n,k], B [k,m], C [n,m].
struct GemmProblem {
  DType dtype = DType::Float32;
  int64_t n = 0, m = 0, k = 0;
  GemmMatrix a, b, c;
  std::vector<GemmBatchDim> batch;  // merged where strides allow; the last one is innermost
  double beta = 0.0;
  MatmulPrecision precision = MatmulPrecision::Highest;
};

// Untracked: c = a @ b + beta * c over broadcast batch dims; c is contiguous with the result's shape.
void gemm_into(const char* op, const Tensor& a, const Tensor& b, const Tensor& c, double beta,
               MatmulPrecision precision);

// GEMM operands on fp16 tensor cores (the attention layer's projections at
// "high": fp16 has TF32's 10-bit mantissa and runs at twice its rate). Each
// matrix x is stored as x 2^e rounded to fp16, with e chosen on the device so
// that the largest finite |x| lands in [2^8, 2^14): inside fp16's range, and
// every element within 2^-22 of it keeps TF32's precision (smaller ones
// become fp16 subnormals, off by at most 2^-33 max |x|: one scale per matrix,
// not per row; Inf and NaN stay Inf and NaN). |e| <= 63 keeps every pair's
// alpha a normal float, so this holds for max |x| in [2^-49, 2^77]; outside
// it precision drops gradually below, and above 2^79 the largest elements
// overflow to Inf.
// One pass over x, usually, in three kernels: a one-block kernel takes e
// from a sample of 1024 elements (fp16_sample_index; their max put in
// [2^8, 2^9)), the conversion finds the true max as it goes, and a third
// kernel converts again, with e from the true max (put in [2^13, 2^14)),
// only a matrix whose max left the window. A group of up to kMaxFp16Group
// matrices takes one launch of each kernel; the third also writes the
// cuBLAS alpha 2^-(e_i + e_j) of every pair (converted in parts: every pair
// with a matrix of its part, convert_to_fp16). tapegrad has no fp16
// dtype: the elements are packed two per float32 and are read only by the
// fp16 GEMMs and the attention kernels (ops/fused_attention.cu), which take
// their scales from the scalars.
constexpr int kMaxFp16Group = 4;
// The elements to_fp16's sample reads: k = 0 .. kFp16Samples - 1 of a matrix
// of n elements, spread by a multiplicative hash (not a stride, which on a
// matrix whose row length divides n / kFp16Samples would read one column).
constexpr int kFp16Samples = 1024;
TG_HD int64_t fp16_sample_index(int64_t k, int64_t n) {
  return n > kFp16Samples ? int64_t((uint64_t(k) * 0x9E3779B97F4A7C15ull) % uint64_t(n)) : k;
}
struct Fp16Matrix {
  Tensor values;  // [ceil(rows cols / 2)] float32 storage of the fp16 elements, row-major
  int64_t rows = 0, cols = 0;
};
struct Fp16Group {
  std::vector<Fp16Matrix> matrices;
  // float32: the alpha of pair (i, j) at i kMaxFp16Group + j; 0 (beta) at
  // kFp16Beta; at kFp16BoundScales + i, 2^b_i with max |x_i| 2^b_i under
  // 2^14 (in [2^13, 2^14) where it comes from the true max; lower from a bound:
  // start_linear_to_fp16's), for bounds on products of the kernel's own
  // (ops/fused_attention.cu);
  // from kFp16Scratch the conversion's scratch (two values per matrix, which
  // a later part of a group converted in parts reads: kept until then); 1 at
  // kFp16One (the beta that accumulates); the pairs' alphas times 2^-11 from
  // kFp16LowAlphas (a product with a low part)
  Tensor scalars;
  // to_fp16_split only: matrix i's low part, 2^11 (s_i x_i - hi_i) rounded to
  // fp16 (hi_i = matrices[i]), so that s_i x_i = hi_i + 2^-11 lo_i to 22 bits.
  std::vector<Fp16Matrix> lows;
};
constexpr int kFp16Beta = kMaxFp16Group * kMaxFp16Group, kFp16BoundScales = kFp16Beta + 1,
              kFp16Scratch = kFp16BoundScales + kMaxFp16Group, kFp16One = kFp16Scratch + 2 * kMaxFp16Group,
              kFp16LowAlphas = kFp16One + 1, kFp16Scalars = kFp16LowAlphas + kMaxFp16Group * kMaxFp16Group;
// A low part's factor: lo = kFp16LowFactor (s x - hi).
constexpr float kFp16LowFactor = 2048.f;
// 1 / s_i of matrix i of a group, exactly (alpha(i, i) = 1 / s_i^2, s_i a power of two).
TG_HD float fp16_inverse_scale(const float* scalars, int i) {
  return sqrtf(scalars[(kMaxFp16Group + 1) * i]);
}
// Thread t's part (t < kMaxFp16Group^2) of writing a group's scalars for
// matrices first .. last - 1 from each one's inverse storage scale and
// bound scale: alpha(i, j) = inverse(i) inverse(j) of the pairs with one of
// them there and neither past it (the pairs of the matrices before `first`
// are written already: a GEMM may be reading them), their bound scales,
// and with first = 0 the constants beta (0) and one.
template <class Inverse, class Bound>
TG_HD void write_fp16_group_scalars(float* scalars, int first, int last, int t, const Inverse& inverse,
                                    const Bound& bound) {
  const int i = t / kMaxFp16Group, j = t % kMaxFp16Group;
  if (t < kMaxFp16Group * kMaxFp16Group && i < last && j < last && (i >= first || j >= first)) {
    scalars[t] = inverse(i) * inverse(j);
    scalars[kFp16LowAlphas + t] = inverse(i) * inverse(j) / kFp16LowFactor;
  }
  if (t == 0 && first == 0) scalars[kFp16Beta] = 0.f, scalars[kFp16One] = 1.f;
  if (t >= first && t < last) scalars[kFp16BoundScales + t] = bound(t);
}
// CUDA float32, contiguous 2-D. column_biases: none, or one per matrix
// (undefined, or [cols] float32 added to every row of its matrix before the
// conversion, as if converting x + b, so that a projection's bias needs no
// pass of its own over the float product).
Fp16Group to_fp16(const std::vector<Tensor>& xs, const std::vector<Tensor>& column_biases = {});
// Beside converting one matrix x [B S, C] (to_fp16, or to_fp16_split with
// split), the dots of its 64-wide head rows with another's of the same
// shape: out[b, h, i] = x[b S + i, 64 h .. 64 h + 63] . other[b S + i, ..]
// (the attention backward's Delta = rowsum(dout o), formed by the pass that
// converts dout instead of a pass of its own). C a multiple of 64; x and
// other contiguous and 16-byte aligned; out [B, H, S] contiguous.
struct Fp16HeadDots {
  Tensor other, out;
  int64_t seq_len = 0;
};
Fp16Group to_fp16_with_head_dots(const Tensor& x, const Fp16HeadDots& dots, bool split);
// fp32-level products on fp16 tensor cores ("highest" projections): each
// matrix as a high and a low fp16 part (Fp16Group::lows), which gemm_fp16
// multiplies as hi hi + 2^-11 (hi lo + lo hi) (the dropped lo lo term is
// 2^-22 relative). A non-finite element of a leaves its row of the product
// all NaN (its low part is Inf - Inf), where fp32 gives NaN or +-Inf; of b,
// its column; no other element changes (the scales ignore non-finite values).
// The tensor cores truncate their fp32 accumulation, an
// error that grows with k and has a sign, so hi hi is added up in fresh
// accumulations along k, each added to c in fp32; the cross terms, 2^-11
// smaller, go whole. On compute capability 9.0 the warpgroup split GEMM
// (ops/matmul_warpgroup.h) does so in registers, 64 of k at a time
// (0.16-0.83x cuBLAS's fp32 GEMM's error against fp64 at k up to 4136);
// elsewhere, and for sizes or alignments it does not take, cuBLAS GEMMs in slices of
// kFp16SplitSlice (2.5-3.8x at k = 2952; with slices of 1024, 4.4-5x at
// k = 5000; bench/NOTES.md).
Fp16Group to_fp16_split(const std::vector<Tensor>& xs);
constexpr int64_t kFp16SplitSlice = 512;
// A product with at most kFp16BatchedSliceElements outputs runs its hi hi
// slices kFp16BatchedSlices at a time as one batched GEMM into a workspace
// (at most 8 x 32 MiB), added to c in slice order: the same additions in the
// same order (alpha is a power of two; within a slice cuBLAS may pick another
// kernel). In the layer's backward where the split GEMM does not run: the
// weight gradients, and dx and dout when tokens <= 8192.
constexpr int64_t kFp16BatchedSlices = 8, kFp16BatchedSliceElements = int64_t(1) << 23;
// to_fp16 (to_fp16_split with split) in two steps, for a conversion queued
// where nothing may be allocated (a cuda::Fork's side work): fp16_group
// checks xs and allocates their group, convert_to_fp16 (which allocates
// nothing) fills it. A group may also be converted in parts, in slot order,
// each queued after the one before it (a matrix converted early, beside other
// work, and its GEMM partner once it exists): convert_to_fp16(xs, group,
// first_slot) fills matrices first_slot, first_slot + 1, ... and writes
// their scalars, those of their pairs with the matrices before them too (and
// no others: a GEMM of the earlier matrices may run beside it), so the group
// is whole once its last matrix is converted, with to_fp16's scalars.
Fp16Group fp16_group(const std::vector<Tensor>& xs, bool split = false);
// An unfilled fp16 matrix [rows, cols] on `device`, its elements two per float32.
Fp16Matrix allocate_fp16_matrix(int64_t rows, int64_t cols, Device device);
void convert_to_fp16(const std::vector<Tensor>& xs, const Fp16Group& group, int first_slot = 0);
// Untracked, CUDA: c = op(A) @ op(B) for matrices a and b of the group, op(x) =
// x^T where transposed; fp32 accumulation and output, c [n, m] contiguous.
// With a split group (to_fp16_split): on compute capability 9.0 the
// warpgroup split GEMM where it takes the sizes (ops/matmul.cu,
// split_gemm_splits), with k split where c has few tiles (its stretches
// after the first in a workspace of at most 8 waves of 128 x 128 tiles,
// 66 MiB on an H200); else the cross terms, then hi hi by k slices, with
// at most kFp16BatchedSliceElements outputs and more than one slice through
// a workspace of up to 8 outputs' size (256 MiB at most). The workspace is
// allocated here unless given: a cuda::Fork's side work, which allocates
// nothing, runs the product with one allocated before the fork, of at least
// gemm_fp16_workspace's floats for this c (0: none needed).
// With a bias ([m] float32, on c's device) c = op(A) @ op(B) + bias, the
// bias added to every row: in cuBLASLt's epilogue where it takes the product
// (try_gemm_fp16_bias: a group without low parts, the bias packed on a
// 16-byte boundary, k and m above 1), else by a pass after it.
void gemm_fp16_into(const Fp16Group& group, int a, bool transpose_a, int b, bool transpose_b, const Tensor& c,
                    const Tensor& workspace = Tensor(), const Tensor& bias = Tensor());
// The floats of workspace gemm_fp16_into needs for this product: they depend
// on c's address (the split GEMM's alignment) and on enable_warpgroup_gemm,
// so ask with the same c and setting as the product's.
int64_t gemm_fp16_workspace(const Fp16Group& group, int a, bool transpose_a, int b, bool transpose_b, const Tensor& c);
// The same into a new float32 c [n, m].
Tensor gemm_fp16(const Fp16Group& group, int a, bool transpose_a, int b, bool transpose_b,
                 const Tensor& bias = Tensor());

// A matrix's storage scale from a bound on its values instead of its max:
// 2^(b - shift), for 2^b the bound scale of a matrix (max |x| 2^b < 2^14,
// Fp16Group::scalars) whose values bound this one's times 2^shift, so that
// |y| 2^(b - shift) < 2^14 too. At least 2^-63 (to_fp16's floor: every
// pair's alpha stays a normal float), where a bound past ~2^77 lets the
// largest values overflow fp16 as to_fp16's do past 2^79.
TG_HD float fp16_scale_from_bound(float bound_scale, int shift) {
  return fmaxf(ldexpf(bound_scale, -shift), 0x1p-63f);
}
// A group of fp16 matrices already filled (by to_fp16, a GEMM, a kernel),
// each taking its scale from somewhere else: a new group whose scalars
// (alphas of every pair, bound scales) one small kernel writes, so that
// gemm_fp16 can multiply matrices that were converted apart. A source's
// scale is
// - kStorage: slot `index` of the group whose scalars these are (its storage
//   and bound scales);
// - kBound: fp16_scale_from_bound of that group's bound scale of slot
//   `index`, shifted by `shift` (a matrix written at a scale known before it
//   existed; its bound scale is then that storage scale, an upper bound);
// - kExponent: 2^e for the int32 e stored at scalars[index] (a matrix
//   written at a power of two a kernel chose).
struct Fp16ScaleSource {
  enum Kind { kStorage, kBound, kExponent };
  Fp16Matrix matrix;
  Tensor scalars;
  int index = 0;
  Kind kind = kStorage;
  int shift = 0;
};
Fp16Group regroup_fp16(const std::vector<Fp16ScaleSource>& sources);

// A projection's weight and input gradients from one fp16 group holding g =
// dL/dy2 [rows, out] at slot 0, W [out, in] at iw and x2 [rows, in] at ix
// (-1: not wanted): {dx2 = g W, dW = g^T x2}. Where both are wanted, dW runs
// on a side stream beside dx (cuda::Fork; its output and workspace
// allocated before).
std::pair<Tensor, Tensor> projection_grads_fp16(const Fp16Group& group, int iw, int ix);

// Untracked, CUDA: y2 = x2 W^T + b (x2 [rows, in], w [out, in] contiguous
// float32, b [out] or undefined) as an fp16 group of one matrix, to_fp16's
// format and scalars: x2 and W converted (to_fp16), then one cuBLASLt GEMM
// whose epilogue adds the bias and rounds y 2^e to fp16, so that no float y
// is written or read (a projection whose only reader is an fp16 kernel).
// e is chosen before y exists: from a sample of kFp16Samples elements of y (dot
// products), their max put in [2^8, 2^9) as to_fp16's sample is, unless the
// Cauchy-Schwarz bound max|x_i| max|w_j| + max|b| (row norms) allows
// |y| 2^e past 2^15 there: then from the bound. y's true max then keeps e
// or rescales y in place (to_fp16's window [2^8, 2^14)). Against to_fp16 of
// the float product: the bias is rounded to fp16 (at 2^e) before it is
// added (cuBLASLt's bias has the output's type), ~2^-12 |b| more error; a
// rescale down moves values already rounded (those under 2^-22 max |y| lose
// bits); and where the bound sets e (the sample's max more than 64x under
// it: rows of large norm whose products cancel, or a sample that misses
// y's largest rows) elements under 2^-38 of the bound are flushed to 0
// before the rescale up. Where cuBLASLt does not take the product (or off:
// tg::cuda::enable_fp16_product_output(false)): the float product, then
// to_fp16 with the bias.
Fp16Group linear_to_fp16(const Tensor& x2, const Tensor& w, const Tensor& b);
// linear_to_fp16 in its three steps, for a caller whose kernel reads y while
// y's true max is found beside it (the fused attention's forward kernel).
// start_linear_to_fp16 leaves y at its first scale 2^e, its scalars
// describing that scale, with 2^(e - 2) as its bound scale (|y| 2^e <= 2^15);
// find_fp16_product_amax (any stream, after the start) finds y's true max;
// finish_fp16_product (after every reader of the first scale and after the
// amax) keeps e or rescales y in place and writes linear_to_fp16's scalars.
// Where the fp16 GEMM does not run, y is final at the start (pending false)
// and the other two steps do nothing.
struct Fp16Product {
  Fp16Group y;
  bool pending = false;  // the amax and finish steps still to run
};
Fp16Product start_linear_to_fp16(const Tensor& x2, const Tensor& w, const Tensor& b);
void find_fp16_product_amax(const Fp16Product& product);
void finish_fp16_product(const Fp16Product& product);

// linear's two halves, untracked, for ops that hold a projection too: y2 =
// x2 W^T + b (x2 [rows, in], w [out, in], b [out] or undefined), with half
// (CUDA float32) on fp16 tensor cores, else at `precision`; errors name `op`.
Tensor linear_forward(const char* op, const Tensor& x2, const Tensor& w, const Tensor& b, MatmulPrecision precision,
                      bool half);
// From g2 = dL/dy2 [rows, out]: {dx2, dW, db} where needs says (db a column
// sum in g2's dtype). With half, g2's float values are freed once converted
// when the caller hands over its only handle.
std::vector<Tensor> linear_backward(Tensor g2, const Tensor& x2, const Tensor& w, const std::vector<bool>& needs,
                                    MatmulPrecision precision, bool half);
// linear_backward's fp16 path (CUDA float32) with its fp16 group made by
// group_of(g2): g at slot 0, W at iw and x at ix (-1: not wanted), made
// where needs[0] or needs[1] asks (converted together, or g converted and
// regrouped with copies a forward kept). db (needs[2]), g2's column sums,
// runs on a side stream beside group_of.
std::vector<Tensor> linear_backward_fp16(Tensor g2, const std::vector<bool>& needs, int iw, int ix,
                                         const std::function<Fp16Group(const Tensor&)>& group_of);

// The "highest" warpgroup split GEMM (ops/matmul_warpgroup.cu) computes c
// in tiles of kSplitGemmRows x kSplitGemmCols, one CTA per tile and stretch
// of k, a stretch a whole number of chunks of kSplitGemmDepth.
constexpr int64_t kSplitGemmRows = 128, kSplitGemmCols = 128, kSplitGemmDepth = 64;
constexpr int64_t split_gemm_tiles(int64_t rows, int64_t cols) {
  return (rows + kSplitGemmRows - 1) / kSplitGemmRows * ((cols + kSplitGemmCols - 1) / kSplitGemmCols);
}
constexpr int64_t split_gemm_chunks(int64_t depth) { return (depth + kSplitGemmDepth - 1) / kSplitGemmDepth; }
// The chunks of each stretch but the last (which holds the rest) when `chunks` go in `stretches`.
constexpr int64_t split_gemm_chunks_per_stretch(int64_t chunks, int64_t stretches) {
  return (chunks + stretches - 1) / stretches;
}
// Its stretches for c [rows, cols] over depth on a device of `sms` SMs: the
// count of least modelled time (split_gemm_model_us, ops/matmul.cpp), none
// left empty, at most 8 waves of CTAs (which bounds the partials'
// workspace), the fewest on a tie.
int split_gemm_stretches(int64_t rows, int64_t cols, int64_t depth, int64_t sms);
double split_gemm_model_us(int64_t rows, int64_t cols, int64_t depth, int64_t stretches, int64_t sms);

template <Device D>
struct GemmKernels {
  static void gemm(const GemmProblem& p);  // k >= 1
  // CUDA only; column_biases: one per matrix, undefined for none; xs into out's matrices first_slot, first_slot
  // + 1, ...; dots: of xs[0], if dots.out is defined
  static void to_fp16(const std::vector<Tensor>& xs, const std::vector<Tensor>& column_biases, const Fp16Group& out,
                      int first_slot, const Fp16HeadDots& dots);
  // CUDA only; workspace: undefined (allocated here) or of at least gemm_fp16_workspace's floats
  static void gemm_fp16(const Fp16Group& group, int a, bool transpose_a, int b, bool transpose_b, const Tensor& c,
                        const Tensor& workspace);
  static int64_t gemm_fp16_workspace(const Fp16Group& group, int a, bool transpose_a, int b, bool transpose_b,
                                     const Tensor& c);  // CUDA only
  // CUDA: c = op(A) op(B) + bias in one cuBLASLt GEMM with the bias in its epilogue; false (nothing queued)
  // where it does not take the product: a group with low parts, a bias not contiguous or not on a 16-byte
  // boundary, a shape PyTorch keeps from that epilogue (k or m of 1, a side of 65535 x 32 or more), no
  // cuBLASLt algorithm for it (and always on the CPU)
  static bool try_gemm_fp16_bias(const Fp16Group& group, int a, bool transpose_a, int b, bool transpose_b,
                                 const Tensor& bias, const Tensor& c);
  // CUDA: y's one fp16 matrix = x W^T + bias from xw = {x, W} by one cuBLASLt GEMM writing fp16, at its
  // first scale, with scalars for that scale (start_linear_to_fp16); false where it does not take the product: xw with low parts, no rows, the shapes of
  // try_gemm_fp16_bias's rule, no cuBLASLt algorithm, enable_fp16_product_output(false) (and always on the CPU)
  static bool product_to_fp16(const Fp16Group& xw, const Tensor& bias, const Fp16Group& y);
  // CUDA only: product_to_fp16's y, its true max found (find_fp16_product_amax), then its scale kept or y
  // rescaled and its scalars written (finish_fp16_product)
  static void product_amax(const Fp16Group& y);
  static void finish_product(const Fp16Group& y);
  // CUDA only: regroup_fp16's scalars into out ([kFp16Scalars] float32), sources checked
  static void regroup_scalars(const std::vector<Fp16ScaleSource>& sources, const Tensor& out);
};

}  // namespace tg
