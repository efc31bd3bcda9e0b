#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>
#include <array>
#include <map>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>

#include "core/cuda.h"
#include "core/cuda_allocator.h"
#include "core/cuda_context.h"
#include "core/cuda_loops.cuh"
#include "core/cuda_reduce.cuh"
#include "core/indexing.h"
#include "core/fp16_scale.cuh"
#include "ops/matmul_kernels.h"
#include "ops/matmul_warpgroup.h"
#include "ops/untracked.h"

namespace tg::cuda {

namespace {

// cuBLAS is column-major: a row-major matrix with leading dim ld is its own
// transpose there. Row-major C = A B is computed as column-major C^T = B^T A^T.
struct CublasOperand {
  cublasOperation_t op;
  int64_t ld;
};

CublasOperand as_transposed_operand(const GemmMatrix& m) {
  if (m.col_stride == 1) return {CUBLAS_OP_N, m.row_stride};  // row-major: already X^T in column-major
  return {CUBLAS_OP_T, m.col_stride};                         // column-major X: transpose it
}

cublasComputeType_t compute_type(const GemmProblem& p) {
  if (p.dtype == DType::Float64) return CUBLAS_COMPUTE_64F;
  return p.precision == MatmulPrecision::High ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

// The batch dims of one operand as an indexer over the batch index.
StridedIndexer batch_indexer(const GemmProblem& p, int64_t GemmBatchDim::*stride) {
  Shape sizes, strides;
  for (const GemmBatchDim& d : p.batch) {
    sizes.push_back(d.size);
    strides.push_back(d.*stride);
  }
  return make_indexer("matmul", sizes, strides);
}

// Pointers to every batch's matrices, for cuBLAS's pointer-array batched GEMM:
// [0, n) the first operand (B), [n, 2n) the second (A), [2n, 3n) C.
struct BatchPointers {
  char *a, *b, *c;
  StridedIndexer ia, ib, ic;
  int64_t count, elem;
  void** out;
  TG_HD void operator()(int64_t i) const {
    out[i] = b + ib.offset(i) * elem;
    out[count + i] = a + ia.offset(i) * elem;
    out[2 * count + i] = c + ic.offset(i) * elem;
  }
};

// Device memory for a few pointers, back to the cache when done (stream-ordered reuse).
class DeviceScratch {
 public:
  explicit DeviceScratch(std::size_t bytes) : ptr_(allocate(bytes)) {}
  ~DeviceScratch() { deallocate(ptr_); }
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  void** pointers() const { return static_cast<void**>(ptr_); }

 private:
  void* ptr_;
};

// A group of float32 matrices and their fp16 copies, for one launch of each
// kernel below (blockIdx.y = the matrix). Kernels take it as a
// __grid_constant__ parameter: indexed by blockIdx.y, an ordinary parameter
// would be copied to every thread's local memory first.
struct Fp16Batch {
  const float* x[kMaxFp16Group];
  __half* out[kMaxFp16Group];
  __half* low[kMaxFp16Group];  // where the low parts go, in the kernels' kLow instances (to_fp16_split)
  int64_t n[kMaxFp16Group];
  const float* bias[kMaxFp16Group];  // optional [cols]: x + bias (each row) is converted
  int64_t cols[kMaxFp16Group];
  bool aligned[kMaxFp16Group];  // x (and bias, with cols % 4 == 0) 16-byte aligned: quads load as one vector
  unsigned* amax;               // [group size]: max |x| as bits (ordered like the values when >= 0)
  float* first_scale;           // [group size]: the scale of the first conversion, from a sample
  float* scalars;               // Fp16Group::scalars
  int first_slot, count;        // matrix t here is the group's matrix first_slot + t (a group converted in parts)
  // Fp16HeadDots of matrix 0 (dot_out null: none): other's elements, out [B, H, S], S.
  const float* dot_other;
  float* dot_out;
  int64_t dot_seq;
  // Element i of matrix t as converted: x plus its column's bias, if any (x alone stays x, -0 included).
  __device__ float element(int t, int64_t i) const { return bias[t] ? bias[t][i % cols[t]] + x[t][i] : x[t][i]; }
};

// The scale kept for a matrix whose largest finite |x| is amax and whose
// first conversion used `first`: `first` when it puts amax in [2^8, 2^14)
// (or the matrix holds no finite nonzero), else the scale that puts it in
// [2^13, 2^14).
__device__ __forceinline__ float kept_scale(unsigned amax_bits, float first) {
  const float amax = __uint_as_float(amax_bits), scaled = amax * first;
  if (amax == 0.f || (scaled >= 0x1p8f && scaled < 0x1p14f)) return first;
  return scale_below(amax, 14);
}

// Step 1, one block per matrix: zeroes its max and picks the first scale
// from a sample of kFp16Samples elements spread over it, so that the
// sample's largest |x| lands in [2^8, 2^9): the whole matrix's largest then
// stays in the kept window [2^8, 2^14) while it is under 32 times the sample's.
static_assert(kFp16Samples <= 1024, "the sample kernel reads one element per thread");
__global__ void __launch_bounds__(kFp16Samples) sample_scale_kernel(const __grid_constant__ Fp16Batch batch) {
  after_previous_kernels();
  const int t = blockIdx.y;
  const int64_t n = batch.n[t];
  float m = 0.f;
  for (int64_t k = threadIdx.x; k < kFp16Samples && k < n; k += blockDim.x)
    m = fmaxf(m, finite_abs(batch.element(t, fp16_sample_index(k, n))));
  m = block_max(m);
  if (threadIdx.x == 0) {
    batch.amax[batch.first_slot + t] = 0u;
    batch.first_scale[batch.first_slot + t] = scale_below(m, 9);
  }
}

static_assert(kLowPartFactor == kFp16LowFactor, "the scalars' low alphas undo core/fp16_scale.cuh's split");

// Pair i of out: two scaled elements y (exact: a power-of-two scale)
// rounded to fp16; with kLow pair i of low: their low parts (split_half2).
template <bool kLow>
__device__ __forceinline__ void store_pair(__half* out, __half* low, int64_t i, float y0, float y1) {
  const Half2Split s = half_pair<kLow>(y0, y1);
  reinterpret_cast<__half2*>(out)[i] = s.hi;
  if constexpr (kLow) reinterpret_cast<__half2*>(low)[i] = s.lo;
}

// Fp16HeadDots: adds the dot of quad q of x (v, in column col) with
// other's (o) to its head row's. A head row is 16 quads, held by 16 consecutive
// lanes (the quads of a step are consecutive, and 64-wide head rows start at
// multiples of 16 quads), which sum their parts by shuffles; the first
// stores the sum.
__device__ __forceinline__ void add_head_dot(const Fp16Batch& batch, int64_t q, int64_t col, float4 v, float4 o) {
  float dot = v.x * o.x + v.y * o.y + v.z * o.z + v.w * o.w;
  const unsigned half = 0xffffu << (threadIdx.x & 16);  // this lane's 16 (all take this step together)
#pragma unroll
  for (int lanes = 8; lanes >= 1; lanes /= 2) dot += __shfl_xor_sync(half, dot, lanes);
  if (q % 16 == 0) {
    const int64_t cols = batch.cols[0], row = 4 * q / cols, S = batch.dot_seq, b = row / S;
    batch.dot_out[(b * (cols / 64) + col / 64) * S + row - b * S] = dot;
  }
}

// x scale to fp16, for matrix blockIdx.y (with kLow also the low parts);
// returns the largest finite |x| this thread saw. A thread takes quads q and
// q + step (step: the grid's threads) at a time, both loaded before either
// is stored (two loads in flight per thread; one stalled on its load before
// the next could start). With kDots, matrix 0's head dots too
// (Fp16HeadDots: x aligned, a whole number of head rows, so every quad
// takes the vector path, and the 16 lanes of a head row the same branch).
template <bool kLow, bool kDots = false>
__device__ float convert(const Fp16Batch& batch, int t, float scale) {
  const float* x = batch.x[t];
  const float* bias = batch.bias[t];
  const int64_t n = batch.n[t], cols = batch.cols[t], step = int64_t(gridDim.x) * blockDim.x;
  __half *out = batch.out[t], *low = batch.low[t];
  float m = 0.f;
  // With a bias or dots: the column of element 4q, advanced by step quads
  // modulo cols (one division per thread, not one per quad).
  const bool track = bias || kDots;
  const int64_t col_step = track ? (4 * step) % cols : 0;
  const auto next_col = [&](int64_t col) { return col + col_step < cols ? col + col_step : col + col_step - cols; };
  const auto vector_quad = [&](int64_t q) {  // aligned: cols % 4 == 0 with a bias, so a quad is in one row
    return batch.aligned[t] && 4 * q + 4 <= n;
  };
  // Quad q (at column col), loaded (v, and o with kDots), to fp16.
  const auto finish_quad = [&](int64_t q, int64_t col, float4 v, float4 o) {
    if (bias) {
      const float4 c = *reinterpret_cast<const float4*>(bias + col);
      v = make_float4(c.x + v.x, c.y + v.y, c.z + v.z, c.w + v.w);
    }
    if constexpr (kDots) add_head_dot(batch, q, col, v, o);
    m = fmaxf(m, finite_abs_max(v));
    store_pair<kLow>(out, low, 2 * q, v.x * scale, v.y * scale);
    store_pair<kLow>(out, low, 2 * q + 1, v.z * scale, v.w * scale);
  };
  const auto load = [](const float* p, int64_t q) { return reinterpret_cast<const float4*>(p)[q]; };
  const auto other = [&](int64_t q) { return kDots ? load(batch.dot_other, q) : float4{}; };
  // Quad q alone: a vector, or element by element (x unaligned, or a partial last quad).
  const auto convert_quad = [&](int64_t q, int64_t col) {
    if (vector_quad(q)) return finish_quad(q, col, load(x, q), other(q));
    for (int64_t i = 4 * q; i < n && i < 4 * q + 4; ++i) {
      const float v = batch.element(t, i), y = v * scale;
      const __half hi = __float2half_rn(y);
      m = fmaxf(m, finite_abs(v));
      out[i] = hi;
      if constexpr (kLow) low[i] = __float2half_rn(low_part(y, __half2float(hi)));
    }
  };
  int64_t q = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  int64_t col = track ? (4 * q) % cols : 0;
  for (; 4 * q < n; q += 2 * step, col = next_col(next_col(col))) {
    const int64_t q2 = q + step, col2 = next_col(col);
    if (vector_quad(q2)) {  // then q's too
      const float4 v = load(x, q), v2 = load(x, q2), o = other(q), o2 = other(q2);
      finish_quad(q, col, v, o);
      finish_quad(q2, col2, v2, o2);
    } else {
      convert_quad(q, col);
      if (4 * q2 < n) convert_quad(q2, col2);
    }
  }
  return m;
}

// Step 2: converts with the first scale and finds the true max (a block max,
// then one atomicMax per block).
template <bool kLow, bool kDots>
__global__ void to_fp16_kernel(const __grid_constant__ Fp16Batch batch) {
  after_previous_kernels();
  const int t = blockIdx.y, slot = batch.first_slot + t;
  block_max_into(convert<kLow, kDots>(batch, t, batch.first_scale[slot]), &batch.amax[slot]);
}

// Step 3: converts again the matrices whose first scale is not kept (none,
// for data whose sample is representative; every block then returns at
// once); block (0, 0) writes the group's scalars (Fp16Group::scalars) of
// this part's matrices and of their pairs with the earlier parts' matrices.
template <bool kLow>
__global__ void rescale_fp16_kernel(const __grid_constant__ Fp16Batch batch) {
  after_previous_kernels();
  const auto scale = [&](int i) { return kept_scale(batch.amax[i], batch.first_scale[i]); };
  const int t = blockIdx.y, slot = batch.first_slot + t;
  if (blockIdx.x == 0 && t == 0)
    write_fp16_group_scalars(batch.scalars, batch.first_slot, batch.first_slot + batch.count, threadIdx.x,
                             [&](int i) { return 1.f / scale(i); },
                             [&](int i) { return scale_below(__uint_as_float(batch.amax[i]), 14); });
  const float kept = scale(slot);
  if (kept != batch.first_scale[slot]) convert<kLow>(batch, t, kept);
}

// regroup_fp16's sources as the kernel reads them.
struct ScaleSources {
  const float* scalars[kMaxFp16Group];
  int index[kMaxFp16Group], shift[kMaxFp16Group];
  Fp16ScaleSource::Kind kind[kMaxFp16Group];
  int count;
  // Matrix i's bound scale, and its storage scale s_i as 1 / s_i (exact: a
  // power of two). A kBound or kExponent matrix is stored at its bound scale.
  __device__ float bound(int i) const {
    const float* x = scalars[i];
    switch (kind[i]) {
      case Fp16ScaleSource::kStorage: return x[kFp16BoundScales + index[i]];
      case Fp16ScaleSource::kBound: return fp16_scale_from_bound(x[kFp16BoundScales + index[i]], shift[i]);
      default: return ldexpf(1.f, reinterpret_cast<const int*>(x)[index[i]]);
    }
  }
  __device__ float inverse(int i) const {
    return kind[i] == Fp16ScaleSource::kStorage ? fp16_inverse_scale(scalars[i], index[i]) : 1.f / bound(i);
  }
};

static_assert(kMaxFp16Group * kMaxFp16Group <= 32, "one warp writes a group's alphas");
__global__ void regroup_scalars_kernel(const __grid_constant__ ScaleSources sources, float* out) {
  after_previous_kernels();
  write_fp16_group_scalars(out, 0, sources.count, threadIdx.x, [&](int i) { return sources.inverse(i); },
                           [&](int i) { return sources.bound(i); });
}

// ---- y = x W^T + b straight into fp16 (GemmKernels::product_to_fp16): the
// GEMM's epilogue scales and rounds, so no float y is written or read. Its
// scale comes before y exists: from a sample of y's elements, computed as
// dot products, unless a bound on |y| says that scale could overflow. Until
// y's true max is found, y's scalars describe that first scale (a kernel may
// read y then: start_linear_to_fp16); then the scale is kept or y rescaled
// in place, with to_fp16's window and scalars.

// The output group's scratch (zeroed first): y's largest finite |y| 2^e as
// bits (matrix 0's amax slot, of the scaled values here), the sample's
// largest |y|, the largest squared row norms of x's and W's fp16 copies, the
// first scale 2^e (matrix 0's first-scale slot), the GEMM's alpha and the
// blocks done with step 1.
constexpr int kProductAmax = kFp16Scratch, kSampleAmax = kFp16Scratch + 1, kRowNormX = kFp16Scratch + 2,
              kRowNormW = kFp16Scratch + 3, kProductScale = kFp16Scratch + kMaxFp16Group,
              kProductAlpha = kProductScale + 1, kStepOneBlocksDone = kProductScale + 2;

struct HalfProduct {
  const __half *x, *w;   // [n, k] and [m, k]: matrices 0 and 1 of the group {x, W}
  const float* bias;     // [m], or null
  const float* xw;       // that group's scalars
  float* y;              // the output group's scalars
  __half* scaled_bias;   // [m]: the bias times the first scale, in fp16 (the epilogue's)
  __half* values;        // y [n, m]
  int64_t n, m, k;
};

// sum_c product(a[c], b[c]) over one pair of rows of length k, by a warp (8
// elements per lane and step where rows allow 16-byte loads); every lane
// gets the sum.
template <class Product>
__device__ float warp_row_sum(const __half* a, const __half* b, int64_t k, int lane, const Product& product) {
  float sum = 0.f;
  if (k % 8 == 0) {
    for (int64_t c = 8 * lane; c < k; c += 256) {
      const uint4 va = *reinterpret_cast<const uint4*>(a + c), vb = *reinterpret_cast<const uint4*>(b + c);
      const __half2 *ha = reinterpret_cast<const __half2*>(&va), *hb = reinterpret_cast<const __half2*>(&vb);
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const float2 fa = __half22float2(ha[t]), fb = __half22float2(hb[t]);
        sum += product(fa.x, fb.x) + product(fa.y, fb.y);
      }
    }
  } else {
    for (int64_t c = lane; c < k; c += 32) sum += product(__half2float(a[c]), __half2float(b[c]));
  }
  return warp_sum(sum);
}

// The first scale: the sample's largest |y| put in [2^8, 2^9), as to_fp16's
// sample does. Unless the sample is all of y, a bound caps it: by
// Cauchy-Schwarz |y_ij| <= |x_i| |w_j| + |b_j| (the fp16 copies' row norms,
// times 1 + 2^-8 for their fp32 sums and the GEMM's), and where that bound
// allows |y| 2^e past 2^15 at the sample's scale (fp16's largest finite is
// ~2^16), the bound is put in [2^13, 2^14) instead.
__device__ float first_product_scale(const HalfProduct& p, float sample, float2 norms, float bias_amax) {
  const float first = scale_below(sample, 9);
  if (p.n * p.m <= kFp16Samples) return first;
  // norms: the largest squared row norms of the scaled copies; xw[1] = alpha(0, 1) = 1 / (s_x s_W)
  const double bound = sqrt(double(norms.x) * double(norms.y)) * (1 + 0x1p-8) * double(p.xw[1]) + double(bias_amax);
  if (bound * first < 0x1p15) return first;
  return scale_below(float(fmin(bound, double(FLT_MAX))), 14);
}

// Step 1 (after the zeroing): every warp takes the squared norms of rows of
// x and W (finite elements) and elements of the sample (fp16_sample_index
// over y: y_ij = x_i . w_j times the pair's alpha, plus b_j), the maxima
// into the scratch; the last block done takes the first scale, the GEMM's
// alpha, the scaled bias and y's scalars at the first scale: its inverse,
// and first / 4 as the bound scale (|y| first <= 2^15 by the choice of
// first, the bias's and y's fp16 roundings included, below a max of ~2^78
// where first reaches its 2^-63 floor; so |y| first / 4 <= 2^13).
__global__ void sample_product_kernel(const HalfProduct p) {
  after_previous_kernels();
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
  const int64_t warp = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const float xw_alpha = p.xw[1];  // alpha(0, 1) = 1 / (s_x s_W)
  const auto square = [](float a, float) { return isfinite(a) ? a * a : 0.f; };
  const auto times = [](float a, float b) { return a * b; };
  float norm_x = 0.f, norm_w = 0.f, sample = 0.f;
  for (int64_t r = warp; r < p.n + p.m; r += warps) {
    const __half* row = r < p.n ? p.x + r * p.k : p.w + (r - p.n) * p.k;
    const float norm = warp_row_sum(row, row, p.k, lane, square);
    if (r < p.n) norm_x = fmaxf(norm_x, norm);
    else norm_w = fmaxf(norm_w, norm);
  }
  for (int64_t t = warp; t < kFp16Samples && t < p.n * p.m; t += warps) {  // one sampled element per warp
    const int64_t index = fp16_sample_index(t, p.n * p.m), i = index / p.m, j = index % p.m;
    const float dot = warp_row_sum(p.x + i * p.k, p.w + j * p.k, p.k, lane, times);
    const float y = dot * xw_alpha + (p.bias ? p.bias[j] : 0.f);
    sample = fmaxf(sample, finite_abs(y));
  }
  unsigned* bits = reinterpret_cast<unsigned*>(p.y);
  const float3 m = block_max3(float3{norm_x, norm_w, sample});
  __shared__ bool last;
  if (threadIdx.x == 0) {
    atomicMax(bits + kRowNormX, __float_as_uint(m.x));
    atomicMax(bits + kRowNormW, __float_as_uint(m.y));
    atomicMax(bits + kSampleAmax, __float_as_uint(m.z));
    __threadfence();  // this block's maxima before its count
    last = atomicAdd(bits + kStepOneBlocksDone, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  float bias_amax = 0.f;
  for (int64_t c = threadIdx.x; p.bias && c < p.m; c += blockDim.x) bias_amax = fmaxf(bias_amax, finite_abs(p.bias[c]));
  bias_amax = block_max(bias_amax);
  const auto read = [&](int slot) { return __uint_as_float(atomicOr(bits + slot, 0u)); };  // the atomics' results
  const float first = first_product_scale(p, read(kSampleAmax), float2{read(kRowNormX), read(kRowNormW)}, bias_amax);
  if (threadIdx.x == 0) p.y[kProductScale] = first, p.y[kProductAlpha] = xw_alpha * first;
  write_fp16_group_scalars(p.y, 0, 1, threadIdx.x, [&](int) { return 1.f / first; }, [&](int) { return first / 4; });
  for (int64_t c = threadIdx.x; p.bias && c < p.m; c += blockDim.x)
    p.scaled_bias[c] = __float2half_rn(p.bias[c] * first);
}

// Step 3 (after the GEMM): y's largest finite |y| 2^e into kProductAmax,
// eight values (16 bytes) a load. With one value pair a load the pass took
// 26.5 us for the 8 x 1024 step's 48 MiB on an H100, with eight 19.6 us,
// about its read bandwidth (bench/NOTES.md version 51).
__global__ void product_amax_kernel(const HalfProduct p) {
  after_previous_kernels();
  const int64_t count = p.n * p.m, octets = count / 8, step = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  float m = 0.f;
  for (int64_t i = first; i < octets; i += step) {
    const uint4 v = reinterpret_cast<const uint4*>(p.values)[i];  // values: a float tensor's storage, 16-byte aligned
    const __half2* pairs = reinterpret_cast<const __half2*>(&v);
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const float2 f = __half22float2(pairs[t]);
      m = fmaxf(m, fmaxf(finite_abs(f.x), finite_abs(f.y)));
    }
  }
  for (int64_t i = 8 * octets + first; i < count; i += step) m = fmaxf(m, finite_abs(__half2float(p.values[i])));
  block_max_into(m, reinterpret_cast<unsigned*>(p.y) + kProductAmax);
}

// Step 4: the scale kept (kept_scale of y's true max, as to_fp16's), y
// rescaled in place where it differs from the first (a power of two: exact
// but where values enter or leave fp16's subnormals), and block 0 writes the
// group's scalars.
__global__ void finish_product_kernel(const HalfProduct p) {
  after_previous_kernels();
  const float first = p.y[kProductScale];
  const float amax = __uint_as_float(reinterpret_cast<const unsigned*>(p.y)[kProductAmax]) / first;
  const float kept = kept_scale(__float_as_uint(amax), first);
  if (blockIdx.x == 0)
    write_fp16_group_scalars(p.y, 0, 1, threadIdx.x, [&](int) { return 1.f / kept; },
                             [&](int) { return scale_below(amax, 14); });
  if (kept == first) return;
  const float factor = kept / first;
  const int64_t count = p.n * p.m, step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += step)
    p.values[i] = __float2half_rn(__half2float(p.values[i]) * factor);
}

}  // namespace

}  // namespace tg::cuda

namespace tg {

// One launch per product: batch dims that merge into one stride go to the
// strided-batched GEMM; any others (q k^T on views of a permuted projection,
// say) to the pointer-array batched GEMM, its pointers written by a kernel.
template <>
void GemmKernels<Device::CUDA>::gemm(const GemmProblem& p) {
  using namespace cuda;
  const CublasOperand a = as_transposed_operand(p.a), b = as_transposed_operand(p.b);
  const cudaDataType_t type = p.dtype == DType::Float64 ? CUDA_R_64F : CUDA_R_32F;
  const HostScalar alpha(1.0, p.dtype), beta(p.beta, p.dtype);
  int64_t count = 1;
  for (const GemmBatchDim& d : p.batch) count *= d.size;
  for (const int64_t v : {p.m, p.n, p.k, a.ld, b.ld, p.c.row_stride, count})
    TG_CHECK(v <= INT32_MAX, "matmul: a size or leading dimension of ", v, " exceeds cuBLAS's int (", p.n, " x ", p.k,
             " @ ", p.k, " x ", p.m, ", batch ", count, ")");
  const int m = static_cast<int>(p.m), n = static_cast<int>(p.n), k = static_cast<int>(p.k);
  const int ldc = static_cast<int>(p.c.row_stride);
  if (p.batch.size() <= 1) {
    const GemmBatchDim d = p.batch.empty() ? GemmBatchDim{} : p.batch.back();
    TG_CUDA_CHECK(cublasGemmStridedBatchedEx(cublas(), b.op, a.op, m, n, k, alpha.get(), p.b.ptr, type,
                                             static_cast<int>(b.ld), d.stride_b, p.a.ptr, type, static_cast<int>(a.ld),
                                             d.stride_a, beta.get(), p.c.ptr, type, ldc, d.stride_c,
                                             static_cast<int>(d.size), compute_type(p), CUBLAS_GEMM_DEFAULT),
                  "matmul");
  } else {
    const DeviceScratch scratch(3 * count * sizeof(void*));
    const int64_t elem = static_cast<int64_t>(element_size(p.dtype));
    for_each("matmul (batch pointers)", count,
             BatchPointers{static_cast<char*>(p.a.ptr), static_cast<char*>(p.b.ptr), static_cast<char*>(p.c.ptr),
                           batch_indexer(p, &GemmBatchDim::stride_a), batch_indexer(p, &GemmBatchDim::stride_b),
                           batch_indexer(p, &GemmBatchDim::stride_c), count, elem, scratch.pointers()});
    void** ptrs = scratch.pointers();
    TG_CUDA_CHECK(cublasGemmBatchedEx(cublas(), b.op, a.op, m, n, k, alpha.get(), ptrs, type,
                                      static_cast<int>(b.ld), ptrs + count, type, static_cast<int>(a.ld), beta.get(),
                                      ptrs + 2 * count, type, ldc, static_cast<int>(count), compute_type(p),
                                      CUBLAS_GEMM_DEFAULT),
                  "matmul");
  }
  check_launch("matmul");
}

template <>
void GemmKernels<Device::CUDA>::to_fp16(const std::vector<Tensor>& xs, const std::vector<Tensor>& column_biases,
                                        const Fp16Group& out, int first_slot, const Fp16HeadDots& dots) {
  using namespace cuda;
  const int count = static_cast<int>(xs.size());
  Fp16Batch batch{};
  batch.scalars = out.scalars.data<float>();
  batch.amax = reinterpret_cast<unsigned*>(batch.scalars + kFp16Scratch);
  batch.first_scale = batch.scalars + kFp16Scratch + kMaxFp16Group;
  batch.first_slot = first_slot;
  batch.count = count;
  int64_t largest = 0;
  for (int t = 0; t < count; ++t) {
    batch.x[t] = xs[t].data<float>();
    batch.out[t] = reinterpret_cast<__half*>(out.matrices[first_slot + t].values.data<float>());
    batch.low[t] = out.lows.empty() ? nullptr : reinterpret_cast<__half*>(out.lows[first_slot + t].values.data<float>());
    batch.n[t] = xs[t].numel();
    batch.bias[t] = column_biases[t].defined() ? column_biases[t].data<float>() : nullptr;
    batch.cols[t] = xs[t].size(1);
    batch.aligned[t] =
        aligned16(xs[t].raw_data()) && (!batch.bias[t] || (batch.cols[t] % 4 == 0 && aligned16(batch.bias[t])));
    largest = std::max(largest, batch.n[t]);
  }
  const int quads = grid_for((largest + 3) / 4);
  launch("to_fp16 (sample)", sample_scale_kernel, dim3(1, count), kFp16Samples, 0, batch);  // one load per thread
  const bool with_dots = dots.out.defined();
  if (with_dots) {
    batch.dot_other = dots.other.data<float>();
    batch.dot_out = dots.out.data<float>();
    batch.dot_seq = dots.seq_len;
  }
  const auto convert_and_rescale = [&](auto low) {
    const dim3 grid(std::min(quads, 8 * context().sm_count), count);
    launch("to_fp16", with_dots ? to_fp16_kernel<low.value, true> : to_fp16_kernel<low.value, false>, grid, kThreads, 0,
           batch);
    launch("to_fp16 (rescale)", rescale_fp16_kernel<low.value>, dim3(std::min(quads, 2 * context().sm_count), count),
           kThreads, 0, batch);
  };
  if (out.lows.empty()) convert_and_rescale(std::false_type{});
  else convert_and_rescale(std::true_type{});
}

template <>
void GemmKernels<Device::CUDA>::regroup_scalars(const std::vector<Fp16ScaleSource>& sources, const Tensor& out) {
  cuda::ScaleSources batch{};
  batch.count = static_cast<int>(sources.size());
  for (int i = 0; i < batch.count; ++i) {
    batch.scalars[i] = sources[i].scalars.data<float>();
    batch.index[i] = sources[i].index;
    batch.shift[i] = sources[i].shift;
    batch.kind[i] = sources[i].kind;
  }
  cuda::launch("regroup_fp16", cuda::regroup_scalars_kernel, 1, 32, 0, batch, out.data<float>());
}

namespace cuda {
namespace {

// One fp16 matrix of a GEMM as cuBLAS reads it: its elements and row length.
struct HalfOperand {
  const __half* values;
  int64_t cols;
};

// A transposed operand goes to cuBLAS as T, an untransposed one as N.
cublasOperation_t cublas_op(bool transposed) { return transposed ? CUBLAS_OP_T : CUBLAS_OP_N; }

HalfOperand half_operand(const Fp16Matrix& m) {
  return {reinterpret_cast<const __half*>(m.values.data<float>()), m.cols};
}

// One fp16 GEMM into row-major c [n, m]: c = alpha op(A) op(B) + beta c over
// k = k0 .. k0 + k_len - 1 of the product, as column-major c^T = op(B)^T
// op(A)^T (a row-major matrix is its own transpose to cuBLAS: an
// untransposed operand goes in as N, a transposed one as T, each with its
// stored row length as ld). The k slice starts k0 columns into an
// untransposed A (rows of a transposed one), k0 rows into an untransposed B.
// With count > 1, the count slices k0 + i k_len (each k_len long) into c + i n m.
cublasStatus_t gemm_fp16_slice(cublasHandle_t handle, HalfOperand A, bool ta, HalfOperand B, bool tb, int64_t n,
                               int64_t m, int64_t k0, int64_t k_len, const float* alpha, const float* beta, float* c,
                               int count = 1) {
  const auto start = [&](const HalfOperand& x, bool k_rows, int64_t k) { return k_rows ? k * x.cols : k; };
  const __half* a = A.values + start(A, ta, k0);
  const __half* b = B.values + start(B, !tb, k0);
  if (count == 1)
    return cublasGemmEx(handle, cublas_op(tb), cublas_op(ta), static_cast<int>(m), static_cast<int>(n),
                        static_cast<int>(k_len), alpha, b, CUDA_R_16F, static_cast<int>(B.cols), a, CUDA_R_16F,
                        static_cast<int>(A.cols), beta, c, CUDA_R_32F, static_cast<int>(m), CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT);
  return cublasGemmStridedBatchedEx(handle, cublas_op(tb), cublas_op(ta), static_cast<int>(m), static_cast<int>(n),
                                    static_cast<int>(k_len), alpha, b, CUDA_R_16F, static_cast<int>(B.cols),
                                    start(B, !tb, k_len), a, CUDA_R_16F, static_cast<int>(A.cols), start(A, ta, k_len),
                                    beta, c, CUDA_R_32F, static_cast<int>(m), n * m, count, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT);
}

constexpr const char* kBiasOp = "gemm_fp16 (bias)";

// cuBLASLt's descriptors, destroyed on every path out.
template <class T, cublasStatus_t (*kDestroy)(T)>
struct LtOwned {
  T value = nullptr;
  LtOwned() = default;
  LtOwned(const LtOwned&) = delete;
  LtOwned& operator=(const LtOwned&) = delete;
  ~LtOwned() {
    if (value) report_failure(kDestroy(value), kBiasOp, "destroying a cuBLASLt descriptor");
  }
};
using LtMatmulDesc = LtOwned<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using LtLayout = LtOwned<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using LtPreference = LtOwned<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

template <class T>
void set_desc(const LtMatmulDesc& desc, cublasLtMatmulDescAttributes_t attribute, const T& value) {
  TG_CUDA_CHECK(cublasLtMatmulDescSetAttribute(desc.value, attribute, &value, sizeof value), kBiasOp);
}
template <class T>
void set_preference(const LtPreference& pref, cublasLtMatmulPreferenceAttributes_t attribute, const T& value) {
  TG_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.value, attribute, &value, sizeof value), kBiasOp);
}

// A column-major rows x cols matrix of `type` with leading dimension ld.
void make_layout(LtLayout& layout, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
  TG_CUDA_CHECK(cublasLtMatrixLayoutCreate(&layout.value, type, rows, cols, ld), kBiasOp);
}

// The largest power of two up to 256 that divides p's address: cuBLASLt's
// heuristic assumes 256-byte aligned matrices unless told less.
uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  return a % 256 == 0 ? 256 : static_cast<uint32_t>(a & (~a + 1));
}

// One product as cuBLASLt takes it: the descriptor, the three layouts (c's
// for C and D), the alignments of A, B, c and the bias, and the heuristic's
// algorithm (none: cuBLASLt does not take it).
struct LtProduct {
  LtMatmulDesc desc;
  LtLayout a, b, c;
  uint32_t align_a, align_b, align_c, align_bias;
  std::optional<cublasLtMatmulAlgo_t> algo;
};

// The heuristic's choice for a product, asked once per key (transposes,
// sizes, leading dimensions, alignments, c's type, the epilogue: all it
// depends on; the query costs host time that small products feel); none
// where cuBLASLt has no algorithm. The cache is cleared past kMaxLtAlgos
// keys (a run of many distinct token counts).
using LtKey = std::array<int64_t, 13>;
constexpr size_t kMaxLtAlgos = 4096;
std::optional<cublasLtMatmulAlgo_t> cached_lt_algo(const LtKey& key, const LtProduct& p) {
  static std::mutex mutex;
  static std::map<LtKey, std::optional<cublasLtMatmulAlgo_t>> algos;
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto found = algos.find(key); found != algos.end()) return found->second;
  LtPreference pref;
  TG_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&pref.value), kBiasOp);
  set_preference(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kCublasWorkspace);
  set_preference(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, p.align_a);
  set_preference(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, p.align_b);
  set_preference(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, p.align_c);
  set_preference(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, p.align_c);
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(cublas_lt(), p.desc.value, p.a.value, p.b.value,
                                                               p.c.value, p.c.value, pref.value, 1, &result, &count);
  if (status != CUBLAS_STATUS_NOT_SUPPORTED) TG_CUDA_CHECK(status, kBiasOp);
  const bool found = status == CUBLAS_STATUS_SUCCESS && count > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  if (algos.size() >= kMaxLtAlgos) algos.clear();
  return algos.emplace(key, found ? std::optional(result.algo) : std::nullopt).first->second;
}

// c [n, m] = alpha op(A) op(B) (+ bias [m], added to every row, in the
// epilogue: PyTorch's addmm on CUDA does so) as one cuBLASLt matmul, c of
// c_type: float, or fp16 (then the bias is fp16 too: cuBLASLt's bias has
// D's type). Column-major as gemm_fp16_slice: c^T = op(B)^T op(A)^T, the
// bias a column vector along c^T's m rows. Host work only: run_lt_product
// queues it.
void describe_lt_product(LtProduct& p, HalfOperand A, bool ta, HalfOperand B, bool tb, int64_t n, int64_t m,
                         int64_t k, const void* bias, const void* c, cudaDataType_t c_type) {
  p.align_a = alignment_of(B.values), p.align_b = alignment_of(A.values), p.align_c = alignment_of(c);
  p.align_bias = bias ? alignment_of(bias) : 0;
  TG_CUDA_CHECK(cublasLtMatmulDescCreate(&p.desc.value, CUBLAS_COMPUTE_32F, CUDA_R_32F), kBiasOp);
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, cublas_op(tb));
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, cublas_op(ta));
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, CUBLASLT_POINTER_MODE_DEVICE);  // alpha and beta on the device
  if (bias) {
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(c_type));
  }
  make_layout(p.a, CUDA_R_16F, tb ? k : m, tb ? m : k, B.cols);  // cuBLAS's A is our B, its B our A
  make_layout(p.b, CUDA_R_16F, ta ? n : k, ta ? k : n, A.cols);
  make_layout(p.c, c_type, m, n, m);
  const LtKey key{ta, tb, n, m, k, A.cols, B.cols, p.align_a, p.align_b, p.align_c, p.align_bias, c_type,
                  bias != nullptr};
  p.algo = cached_lt_algo(key, p);
}

// Queues a described product (its algo found); false where cublasLtMatmul
// refuses it (nothing queued).
bool run_lt_product(const LtProduct& p, HalfOperand A, HalfOperand B, const float* alpha, const float* zero, void* c) {
  const cublasStatus_t status = cublasLtMatmul(cublas_lt(), p.desc.value, alpha, B.values, p.a.value, A.values,
                                               p.b.value, zero, c, p.c.value, c, p.c.value, &*p.algo,
                                               cublas_workspace(), kCublasWorkspace, stream());
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  TG_CUDA_CHECK(status, kBiasOp);
  return true;
}

// Whether c [n, m] over depth k has a shape PyTorch's addmm gives cuBLASLt's
// bias epilogue: no depth or output width of 1, no side of 65535 x 32 or more
// (the others go the proven way: the GEMM, then the bias).
bool lt_epilogue_takes(int64_t n, int64_t m, int64_t k) {
  constexpr int64_t kLtLargest = int64_t(65535) * 32;
  return k > 1 && m > 1 && std::max({n, m, k}) < kLtLargest;
}

// c [n, m] = alpha op(A) op(B) + bias as one cuBLASLt matmul (float c and
// bias); false where cuBLASLt has no algorithm for it (nothing queued).
bool gemm_fp16_bias_lt(HalfOperand A, bool ta, HalfOperand B, bool tb, int64_t n, int64_t m, int64_t k,
                       const float* alpha, const float* zero, const float* bias, float* c) {
  LtProduct p;
  describe_lt_product(p, A, ta, B, tb, n, m, k, bias, c, CUDA_R_32F);
  return p.algo && run_lt_product(p, A, B, alpha, zero, c);
}

// c[e] = (((c[e] + w[0][e]) + w[1][e]) + ...) + w[count - 1][e], w's slices
// size apart: the in-order fp32 sum that beta = 1 GEMMs would form one by one.
struct AddSlices {
  float* c;
  const float* w;
  int count;
  int64_t size;
  __device__ void operator()(int64_t e) const {
    float sum = c[e];
    for (int i = 0; i < count; ++i) sum += w[i * size + e];
    c[e] = sum;
  }
};

// How many stretches of k a split group's product c [rows, cols] = op(A)
// op(B) over depth walks on the warpgroup split GEMM
// (ops/matmul_warpgroup.cu), one CTA per tile of c and stretch
// (split_gemm_stretches); 0 (cuBLAS's k slices instead) where it does not
// run. It runs on a device of compute capability 9.0 (sm_90a code runs there
// alone), for products it takes (sizes and alignment: split_gemm_takes),
// unless enable_warpgroup_gemm(false).
int split_gemm_splits(const SplitGemm& g) {
  if (!warpgroup_gemm_enabled() || context().major != 9 || context().minor != 0 || !split_gemm_takes(g)) return 0;
  return split_gemm_stretches(g.rows, g.cols, g.depth, context().sm_count);
}

// The device scalars of the product of the group's matrices a and b
// (Fp16Group::scalars): its alpha, and the alpha of its cross terms hi lo
// and lo hi with a split group.
const float* product_alpha(const Fp16Group& group, int a, int b) {
  return group.scalars.data<float>() + a * kMaxFp16Group + b;
}
const float* product_low_alpha(const Fp16Group& group, int a, int b) {
  return group.scalars.data<float>() + kFp16LowAlphas + a * kMaxFp16Group + b;
}

// The product c = op(A) op(B) of the group's matrices a and b as the split
// GEMM takes it, with its stretches (0: cuBLAS instead; a group without low
// parts always goes to cuBLAS).
SplitGemm split_gemm_of(const Fp16Group& group, int a, bool transpose_a, int b, bool transpose_b, const Tensor& c) {
  const Fp16Matrix &A = group.matrices[a], &B = group.matrices[b];
  const bool split = !group.lows.empty();
  const HalfOperand a_hi = half_operand(A), b_hi = half_operand(B);
  const HalfOperand a_lo = split ? half_operand(group.lows[a]) : a_hi, b_lo = split ? half_operand(group.lows[b]) : b_hi;
  SplitGemm g{a_hi.values, a_lo.values, b_hi.values, b_lo.values, transpose_a, transpose_b, c.data<float>(),
              product_alpha(group, a, b), product_low_alpha(group, a, b),
              c.size(0), c.size(1), transpose_a ? A.rows : A.cols};
  g.splits = split ? split_gemm_splits(g) : 0;
  return g;
}

// cuBLAS's hi hi slices of a split product over depth k.
int64_t split_slices(int64_t k) { return (k + kFp16SplitSlice - 1) / kFp16SplitSlice; }

// Whether those slices go through the workspace (below), and the floats of
// workspace g needs: the split GEMM's stretches after the first, or a batch
// of slices.
bool batched_slices(const SplitGemm& g, bool split) {
  return split && g.splits == 0 && split_slices(g.depth) > 1 && g.rows * g.cols <= kFp16BatchedSliceElements;
}
int64_t workspace_floats(const SplitGemm& g, bool split) {
  const int64_t size = g.rows * g.cols;
  if (g.splits > 1) return (g.splits - 1) * size;
  return batched_slices(g, split) ? std::min(split_slices(g.depth), kFp16BatchedSlices) * size : 0;
}
}  // namespace
}  // namespace cuda

template <>
int64_t GemmKernels<Device::CUDA>::gemm_fp16_workspace(const Fp16Group& group, int a, bool transpose_a, int b,
                                                      bool transpose_b, const Tensor& c) {
  return cuda::workspace_floats(cuda::split_gemm_of(group, a, transpose_a, b, transpose_b, c), !group.lows.empty());
}

template <>
bool GemmKernels<Device::CUDA>::try_gemm_fp16_bias(const Fp16Group& group, int a, bool transpose_a, int b,
                                                   bool transpose_b, const Tensor& bias, const Tensor& c) {
  using namespace cuda;
  if (!group.lows.empty() || !bias.is_contiguous() || !aligned16(bias.raw_data())) return false;
  const Fp16Matrix &A = group.matrices[a], &B = group.matrices[b];
  const int64_t k = transpose_a ? A.rows : A.cols;
  if (!lt_epilogue_takes(c.size(0), c.size(1), k)) return false;
  return gemm_fp16_bias_lt(half_operand(A), transpose_a, half_operand(B), transpose_b, c.size(0), c.size(1), k,
                           product_alpha(group, a, b), group.scalars.data<float>() + kFp16Beta, bias.data<float>(),
                           c.data<float>());
}

template <>
bool GemmKernels<Device::CUDA>::product_to_fp16(const Fp16Group& xw, const Tensor& bias, const Fp16Group& y) {
  using namespace cuda;
  const HalfOperand x = half_operand(xw.matrices[0]), w = half_operand(xw.matrices[1]);
  const int64_t n = xw.matrices[0].rows, m = xw.matrices[1].rows, k = x.cols;
  if (!fp16_product_output_enabled() || !xw.lows.empty() || n == 0 || !lt_epilogue_takes(n, m, k) ||
      !aligned16(y.matrices[0].values.raw_data()))  // product_amax_kernel's 16-byte loads
    return false;
  const Tensor scaled_bias = bias.defined() ? empty({(m + 1) / 2}, {DType::Float32, Device::CUDA}) : Tensor();
  const HalfProduct p{x.values, w.values, bias.defined() ? bias.data<float>() : nullptr, xw.scalars.data<float>(),
                      y.scalars.data<float>(),
                      bias.defined() ? reinterpret_cast<__half*>(scaled_bias.data<float>()) : nullptr,
                      reinterpret_cast<__half*>(y.matrices[0].values.data<float>()), n, m, k};
  LtProduct product;
  describe_lt_product(product, x, false, w, true, n, m, k, p.scaled_bias, p.values, CUDA_R_16F);
  if (!product.algo) return false;
  fill_into(y.scalars, 0.0);  // a kernel, which overlaps its neighbours' launches (a memset would not)
  launch("linear_to_fp16", sample_product_kernel, std::min(grid_for(32 * (n + m)), 4 * context().sm_count), kThreads,
         0, p);
  return run_lt_product(product, x, w, p.y + kProductAlpha, p.y + kFp16Beta, p.values);
}

namespace {

// Step 3 or 4 over y (product_to_fp16's output): `per_thread` elements a
// thread, at most `per_sm` blocks an SM; the kernels read y's values, sizes
// and scalars.
void launch_over_product(void (*kernel)(cuda::HalfProduct), const Fp16Group& y, int64_t per_thread, int per_sm) {
  using namespace cuda;
  const Fp16Matrix& values = y.matrices[0];
  const HalfProduct p{nullptr, nullptr, nullptr, nullptr, y.scalars.data<float>(), nullptr,
                      reinterpret_cast<__half*>(values.values.data<float>()), values.rows, values.cols, 0};
  const int blocks = std::min(grid_for((p.n * p.m + per_thread - 1) / per_thread), per_sm * context().sm_count);
  launch("linear_to_fp16", kernel, blocks, kThreads, 0, p);
}

}  // namespace

template <>
void GemmKernels<Device::CUDA>::product_amax(const Fp16Group& y) {
  launch_over_product(cuda::product_amax_kernel, y, 8, 8);
}

template <>
void GemmKernels<Device::CUDA>::finish_product(const Fp16Group& y) {
  launch_over_product(cuda::finish_product_kernel, y, 2, 2);
}

namespace cuda {
namespace {

// cuBLAS takes alpha and beta from device memory while one lives. The handle
// is shared: restore() returns it to host pointers, and so does the
// destructor where an error leaves the scope first (reporting, not throwing).
class DevicePointerMode {
 public:
  explicit DevicePointerMode(cublasHandle_t handle) : handle_(handle) {
    TG_CUDA_CHECK(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_DEVICE), "gemm_fp16");
  }
  ~DevicePointerMode() {
    if (handle_)
      report_failure(cublasSetPointerMode(handle_, CUBLAS_POINTER_MODE_HOST), "gemm_fp16", "cublasSetPointerMode");
  }
  DevicePointerMode(const DevicePointerMode&) = delete;
  DevicePointerMode& operator=(const DevicePointerMode&) = delete;
  void restore() {
    const cublasHandle_t handle = std::exchange(handle_, nullptr);
    TG_CUDA_CHECK(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST), "gemm_fp16");
  }

 private:
  cublasHandle_t handle_;
};

}  // namespace
}  // namespace cuda

template <>
void GemmKernels<Device::CUDA>::gemm_fp16(const Fp16Group& group, int a, bool transpose_a, int b, bool transpose_b,
                                          const Tensor& c, const Tensor& given_workspace) {
  using namespace cuda;
  const Fp16Matrix &A = group.matrices[a], &B = group.matrices[b];
  const int64_t n = c.size(0), m = c.size(1), k = transpose_a ? A.rows : A.cols;
  for (const int64_t v : {n, m, k, A.cols, B.cols})
    TG_CHECK(v <= INT32_MAX, "gemm_fp16: a size of ", v, " exceeds cuBLAS's int (", n, " x ", k, " @ ", k, " x ", m, ")");
  const bool split = !group.lows.empty();
  SplitGemm g = split_gemm_of(group, a, transpose_a, b, transpose_b, c);
  const int64_t floats = workspace_floats(g, split);
  TG_CHECK(!given_workspace.defined() || given_workspace.numel() >= floats, "gemm_fp16: a workspace of ",
           given_workspace.numel(), " floats for a product that needs ", floats);
  const Tensor workspace = floats == 0 || given_workspace.defined()
                               ? given_workspace
                               : empty({floats}, {DType::Float32, Device::CUDA});
  const float *zero = group.scalars.data<float>() + kFp16Beta, *one = group.scalars.data<float>() + kFp16One;
  const HalfOperand a_hi{g.a_hi, A.cols}, b_hi{g.b_hi, B.cols}, a_lo{g.a_lo, A.cols}, b_lo{g.b_lo, B.cols};
  const float *alpha = g.alpha, *low_alpha = g.low_alpha;
  float* out = g.c;
  if (g.splits > 0) {
    // The stretches after the first into the workspace, added to c in order.
    if (g.splits > 1) g.partials = workspace.data<float>();
    launch_split_gemm_warpgroup(g);
    if (g.splits > 1) for_each("gemm_fp16", n * m, AddSlices{out, g.partials, g.splits - 1, n * m});
    return;
  }
  // A small c (the weight gradients, k = tokens; dx and dout up to 8192
  // tokens): the hi hi slices kFp16BatchedSlices at a time as one
  // strided-batched GEMM into a workspace, then added to c in slice order (the
  // additions the one-by-one beta = 1 GEMMs make, without each small GEMM
  // rereading and rewriting c).
  const int64_t slices = split_slices(k);
  const bool batched = batched_slices(g, split);
  float* slots = batched ? workspace.data<float>() : nullptr;
  cublasHandle_t handle = cublas();
  DevicePointerMode device_scalars(handle);
  const auto product = [&](HalfOperand x, HalfOperand y, int64_t k0, int64_t k_len, const float* f, const float* beta,
                           float* to = nullptr, int count = 1) {
    TG_CUDA_CHECK(
        gemm_fp16_slice(handle, x, transpose_a, y, transpose_b, n, m, k0, k_len, f, beta, to ? to : out, count),
        "gemm_fp16");
  };
  if (!split) {
    product(a_hi, b_hi, 0, k, alpha, zero);
  } else {
    // 2^-11 (hi lo + lo hi) over the whole k (their accumulation's truncation
    // is 2^-11 smaller than hi hi's), then hi hi a fresh accumulation per slice.
    product(a_hi, b_lo, 0, k, low_alpha, zero);
    product(a_lo, b_hi, 0, k, low_alpha, one);
    if (!batched) {
      for (int64_t k0 = 0; k0 < k; k0 += kFp16SplitSlice)
        product(a_hi, b_hi, k0, std::min(kFp16SplitSlice, k - k0), alpha, one);
    } else {
      for (int64_t first = 0; first < slices; first += kFp16BatchedSlices) {
        const int64_t count = std::min(kFp16BatchedSlices, slices - first);
        const int64_t k0 = first * kFp16SplitSlice, last_k0 = (first + count - 1) * kFp16SplitSlice;
        const int64_t whole = k - last_k0 < kFp16SplitSlice ? count - 1 : count;  // slices of the full length
        if (whole > 0) product(a_hi, b_hi, k0, kFp16SplitSlice, alpha, zero, slots, static_cast<int>(whole));
        if (whole < count) product(a_hi, b_hi, last_k0, k - last_k0, alpha, zero, slots + whole * n * m);
        for_each("gemm_fp16", n * m, AddSlices{out, slots, static_cast<int>(count), n * m});
      }
    }
  }
  device_scalars.restore();
  check_launch("gemm_fp16");  // in sync-debug mode, a fault in cuBLAS's kernels raised here
}

}  // namespace tg
