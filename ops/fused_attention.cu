// The fused attention kernels: the forward (one pass over the keys with an
// online softmax) and the backward (one pass per key tile over the queries),
// on fp16 tensor cores (at "high"; at "highest" the benchmark interface's
// backward on split fp16 operands) or 3xTF32 (at "highest") (core/mma.cuh),
// tiles loaded with cp.async (core/async_copy.cuh). docs/derivations.md derives the math;
// the CPU kernels in fused_attention.cpp run the same algorithm as loops.
#include "ops/fused_attention_backward.cuh"
#include "ops/fused_attention_forward.cuh"

namespace tg::cuda {

namespace {
// ---------------------------------------------------------------- forward
// One CTA per (64 queries, b, h), 4 warps of 16 query rows each; key tiles of
// 64. Per warp and tile: S = Q K^T (8 n-tiles; with fp16 tiles each warp
// holds its rows' Q fragments in registers across the key tiles,
// mma::HeldA), the online softmax, dropout, then O += (P times the kept
// mask) V with the accumulator used directly as the A operand, and
// dropout's 1 / (1 - p) applied to o once, at the end (a
// select per element, not a select and a multiply). K, V and the tile's
// corner of edit_region_bias arrive together through cp.async. With fp16
// tiles ("high") q, k, v come from qkv's fp16 copy: the score unscales Q K^T
// with the softmax scale, and the kept P goes in as it is (e^(s - max), at
// most 1 up to the rounding of the shift exp_shifted takes). On a device of
// compute capability 9.0 the "high" forward is the two-warpgroup kernel of
// ops/fused_attention_warpgroup.cu where its loads take the inputs
// (forward_warpgroup_takes); the two share their softmax (SoftmaxRows).

constexpr int kFwdRows = 64, kFwdThreads = 128;

// The forward's shared memory, in bytes: Q, K, V (Mma::Staged), the float
// corner of edit_region_bias, then the keys' edit_terms. kMinCtasPerSm, the
// launch bound: with fp16 tiles four CTAs per SM (45 KB each; ptxas fits the
// kernel in 128 registers without spills, where unbounded it takes a few
// more, which allows three); with 3xTF32 none (0: about 140 registers, three
// per SM; a bound of one or three made ptxas spill).
template <class Mma>
struct ForwardLayout : TileLayout<Mma> {
  using T = TileLayout<Mma>;
  static constexpr int kMinCtasPerSm = T::kHalf ? 4 : 0;
  static constexpr size_t kQ = 0, kK = T::kTile, kV = 2 * T::kTile, kE = 3 * T::kTile,
                          kKeys = kE + T::kFloatTile, kBytes = kKeys + 2 * kFwdKeys * sizeof(float);
};

template <class Mma>
__global__ void __launch_bounds__(kFwdThreads, ForwardLayout<Mma>::kMinCtasPerSm) attention_forward_kernel(ForwardArgs p) {
  after_previous_kernels();
  using Layout = ForwardLayout<Mma>;
  using Staged = typename Layout::Staged;
  constexpr bool kHalf = Layout::kHalf;
  constexpr int kTs = Layout::kTileStride;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  Staged* Qs = reinterpret_cast<Staged*>(smem_bytes + Layout::kQ);  // [query][d]
  Staged* Ks = reinterpret_cast<Staged*>(smem_bytes + Layout::kK);  // [key][d]
  Staged* Vs = reinterpret_cast<Staged*>(smem_bytes + Layout::kV);  // [key][d]
  float* Es = reinterpret_cast<float*>(smem_bytes + Layout::kE);    // [query][key]: edit_region_bias[h, i, j]
  float* key_terms = reinterpret_cast<float*>(smem_bytes + Layout::kKeys);  // KeyFlags::store
  const ScoreArgs& sc = p.sc;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  // b varies fastest in blockIdx.y: the B CTAs of one (h, query tile) run side by side and read each
  // edit_region_bias tile from the L2, not B times from memory.
  const int64_t h = blockIdx.y / sc.B, b = blockIdx.y % sc.B, q0 = int64_t(blockIdx.x) * kFwdRows;
  // This thread's rows (r = 0, 1) and their [B,H,S] index, recomputed where used rather than held across the loop.
  const auto row_of = [&](int r) { return q0 + 16 * warp + g + 8 * r; };
  const auto row_id = [&](int r) { return (b * sc.H + h) * sc.S + row_of(r); };
  SoftmaxRows rows(sc, b, row_of, row_id, t);
  const float w_in = sc.w_in[h], w_x = sc.w_x[h];
  // The score's factor of the Q K^T product, and o's of the P V product (dropout's 1 / (1 - p) included).
  float qk_scale = sc.scale, o_scale = sc.keep_scale;
  if constexpr (kHalf) {
    qk_scale *= p.half.inverse_scale(kHalfQ) * p.half.inverse_scale(kHalfK);
    o_scale *= p.half.inverse_scale(kHalfV);
  }
  const auto q_rows = operand_rows<kHalf>(p.q, p.half.q), k_rows = operand_rows<kHalf>(p.k, p.half.k);
  const auto v_rows = operand_rows<kHalf>(p.v, p.half.v);
  float acc[8][4] = {};
  copy_head_rows<kFwdThreads>(q_rows, b, h, q0, kFwdRows, sc.S, Qs, Layout::place());  // waited for with the first key tile
  const auto warp_row = [&](int r) { return 16 * warp + r; };
  const auto e_pair = [&](int r, int nt) {
    return *reinterpret_cast<const float2*>(Es + warp_row(g + 8 * r) * kStride + 8 * nt + 2 * t);
  };
  constexpr int kDBlocks = kD / 8;  // Q K^T's k blocks
  [[maybe_unused]] std::conditional_t<kHalf, mma::HeldA<Mma, kDBlocks>, char> q_held;

  for (int64_t k0 = 0; k0 < sc.S; k0 += kFwdKeys) {
    __syncthreads();  // the previous tile is no longer read
    const KeyFlags flags = KeyFlags::load(sc, b, k0, kFwdKeys);
    copy_head_rows<kFwdThreads>(k_rows, b, h, k0, kFwdKeys, sc.S, Ks, Layout::place());
    copy_head_rows<kFwdThreads>(v_rows, b, h, k0, kFwdKeys, sc.S, Vs, Layout::place());
    copy_tile<kFwdThreads, kFwdRows, kFwdKeys>(sc.E + (h * sc.M + q0) * sc.M + k0, sc.M, sc.S - q0, sc.S - k0, Es,
                                               kStride);
    async::commit();
    flags.store(kFwdKeys, w_in, w_x, key_terms);
    async::wait<0>();
    __syncthreads();

    float s[8][4] = {};
    if constexpr (kHalf) {  // Q's fragments loaded once, with the first tile (its copy waited for above)
      if (k0 == 0) q_held.load(Qs, kTs, warp_row, lane);
      mma::held_product<Mma, kDBlocks, 8>(s, q_held, Ks, kTs, 0, lane);
    } else {
      mma::tile_product<Mma, kDBlocks, 8>(s, Qs, kTs, warp_row, Ks, kTs, 0, lane);
    }
    float correction[2];
    if (rows.score(s, qk_scale, e_pair, key_terms, t, correction)) rescale_rows(acc, correction);
    rows.keep(s, sc, k0, t);
    mma::accumulator_product<Mma, 8, 8>(acc, s, Vs, kTs, lane);  // O += (P mask) V
  }

  const int64_t C = sc.H * kD;
  rows.store(acc, o_scale, p, row_of, row_id, [&](int r) { return (b * sc.S + row_of(r)) * C + h * kD; }, t);
}

// delta[b, h, i] = dout_row . o_row over the 64 columns of head h: blockIdx.x
// is (b, h), blockIdx.y a block of queries, a warp per query (no division
// of a row index per row).
__global__ void row_dot_kernel(const float* dout, const float* o, float* delta, int64_t S, int64_t H) {
  after_previous_kernels();
  const int64_t bh = blockIdx.x, b = bh / H, h = bh - b * H;
  const int64_t i = int64_t(blockIdx.y) * kRowsPerBlock + threadIdx.x / 32;
  if (i >= S) return;
  const int64_t at = (b * S + i) * H * kD + h * kD + 2 * (threadIdx.x % 32);
  const float2 x = *reinterpret_cast<const float2*>(dout + at), y = *reinterpret_cast<const float2*>(o + at);
  const float v = warp_sum(x.x * y.x + x.y * y.y);
  if (threadIdx.x % 32 == 0) delta[bh * S + i] = v;
}

// ---- qkv's gradient as one fp16 matrix from the float dq and the fp16 dk,
// dv (HalfKeyGradients), for the fp16 GEMMs of the qkv projection's backward.

static_assert(kHalfKeyGroup == kBwdKeys / (kBwdThreads / 32), "a key group is one warp's keys");
constexpr int kNoExponent = 63;  // the largest scale_exponent: a group of zeros sets no bound

// scratch: [0] the smallest exponent (int), [1] dq's largest finite |x|; db [n] zeroed.
__global__ void reset_key_halves_kernel(float* scratch, float* db, int64_t n) {
  after_previous_kernels();
  if (threadIdx.x == 0) {
    reinterpret_cast<int*>(scratch)[0] = kNoExponent;
    scratch[1] = 0.f;
  }
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) db[i] = 0.f;
}

// One pass over dq ([rows, row_quads] quads): scratch[1] = max(scratch[1],
// its largest finite |x|), and its column sums added to dbq. A block holds
// kRowGroups groups of kThreads threads; each thread keeps one column quad
// (blockIdx.x, its place in the group) and sums every (kRowGroups
// gridDim.y)-th row from its group's first, kRowsInFlight loads at a time
// (zeros past the last row); the groups' sums meet in shared memory, then
// one vector atomic add per column quad and block (dq itself is a sum of
// atomic adds: its order is not fixed either). The adds set the kernel's
// time: every block adds to the same C floats, and those adds queue at the
// L2, so more blocks made it slower (bench/NOTES.md versions 41 and 42).
constexpr int kRowsInFlight = 8, kRowGroups = 4;
__global__ void __launch_bounds__(kRowGroups* kThreads)
    reduce_dq_kernel(const float4* dq, int64_t rows, int64_t row_quads, float* scratch, float* dbq) {
  after_previous_kernels();
  const int group = threadIdx.x / kThreads, quad = threadIdx.x % kThreads;
  const int64_t c = blockIdx.x * int64_t(kThreads) + quad, step = int64_t(gridDim.y) * kRowGroups;
  float m = 0.f;
  float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int64_t r = blockIdx.y * int64_t(kRowGroups) + group; c < row_quads && r < rows; r += kRowsInFlight * step) {
    float4 x[kRowsInFlight];
#pragma unroll
    for (int k = 0; k < kRowsInFlight; ++k)
      x[k] = r + k * step < rows ? dq[(r + k * step) * row_quads + c] : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int k = 0; k < kRowsInFlight; ++k) {
      m = fmaxf(m, finite_abs_max(x[k]));
      sum.x += x[k].x, sum.y += x[k].y, sum.z += x[k].z, sum.w += x[k].w;
    }
  }
  block_max_into(m, reinterpret_cast<unsigned*>(scratch + 1));
  __shared__ float4 partial[kRowGroups - 1][kThreads];  // the sums of groups 1 ..
  if (group > 0) partial[group - 1][quad] = sum;
  __syncthreads();
  if (group > 0 || c >= row_quads) return;
#pragma unroll
  for (int g = 0; g < kRowGroups - 1; ++g)
    sum.x += partial[g][quad].x, sum.y += partial[g][quad].y, sum.z += partial[g][quad].z, sum.w += partial[g][quad].w;
  mma::red_add4(dbq + 4 * c, sum.x, sum.y, sum.z, sum.w);
}

// The exponent every part of qkv's gradient is stored at: the smallest of
// the key groups' and dq's own.
__device__ int common_exponent(const float* scratch) {
  const int keys = reinterpret_cast<const int*>(scratch)[0];
  return scratch[1] == 0.f ? keys : min(keys, scale_exponent(scratch[1], 14));
}

struct HalfJoin {
  const float* dq;       // [rows, C]
  const __half* kv;      // [rows, 2C]
  const int* exponents;  // [B H groups]
  float* scratch;
  __half* out;           // [rows, 3C]
  int64_t rows, S, H, groups;
};

// out = 2^e [dq | dk | dv] with e = common_exponent: dq converted, each key
// group's fp16 values (2^e_g dk) multiplied by 2^(e - e_g) <= 1 (exact
// unless they fall into fp16's subnormals). Eight columns (16 bytes) per
// step; e goes back to scratch[0] (every thread computes the same e).
__global__ void join_half_qkv_kernel(const HalfJoin j) {
  after_previous_kernels();
  const int64_t C = j.H * kD, chunks = 3 * C / 8;
  const int e = common_exponent(j.scratch);
  for (int64_t q = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; q < j.rows * chunks;
       q += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = q / chunks, c = 8 * (q - row * chunks);
    float v[8];
    float f;
    if (c < C) {
      const float4* from = reinterpret_cast<const float4*>(j.dq + row * C + c);
      const float4 lo = from[0], hi = from[1];
      v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
      f = ldexpf(1.f, e);
    } else {
      const int64_t kc = c - C, h = (kc % C) / kD, b = row / j.S, s = row - b * j.S;
      const uint4 raw = *reinterpret_cast<const uint4*>(j.kv + row * 2 * C + kc);
      const __half2* pairs = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 x = __half22float2(pairs[k]);
        v[2 * k] = x.x, v[2 * k + 1] = x.y;
      }
      f = ldexpf(1.f, e - j.exponents[(b * j.H + h) * j.groups + s / kHalfKeyGroup]);
    }
    uint4 out;
    __half2* pairs = reinterpret_cast<__half2*>(&out);
#pragma unroll
    for (int k = 0; k < 4; ++k) pairs[k] = __floats2half2_rn(f * v[2 * k], f * v[2 * k + 1]);
    *reinterpret_cast<uint4*>(j.out + row * 3 * C + c) = out;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) reinterpret_cast<int*>(j.scratch)[0] = e;  // min(e, dq's) is e again
}

// A tensor the kernels read or write in vectors of `bytes`.
void check_aligned(const char* what, const Tensor& t, size_t bytes) {
  TG_CHECK(reinterpret_cast<uintptr_t>(t.raw_data()) % bytes == 0, "fused_attention: ", what, " ", t.shape(),
           " must start on a ", bytes, "-byte boundary");
}

// dq [B,S,C] as the passes after the backward read it: contiguous float
// quads, B S rows of C = H D.
void check_float_dq(const char* op, const Tensor& dq, const AttentionDims& d) {
  TG_CHECK(dq.is_contiguous() && dq.numel() == d.B * d.S * d.H * kD && aligned16(dq.raw_data()), op, ": dq ",
           dq.shape(), " must hold B S = ", d.B * d.S, " rows of C = ", d.H * kD,
           " columns, contiguous and 16-byte aligned");
}

// q, k, v (and the gradient views) must allow 16-byte loads of a head row.
void check_rows(const char* what, const Tensor& t) {
  const auto& st = t.strides();
  TG_CHECK(aligned16(t.raw_data()) && st[3] == 1 && st[0] % 4 == 0 && st[1] % 4 == 0 && st[2] % 4 == 0,
           "fused_attention: ", what, " ", t.shape(), " with strides ", st,
           " must have 16-byte aligned rows with a unit last stride");
}

template <class Mma>
void launch_forward(const AttentionInputs& in, const Tensor& o, const Tensor& lse, const Tensor& o_half) {
  using Layout = ForwardLayout<Mma>;
  ForwardArgs args{head_rows<const float>(in.q), head_rows<const float>(in.k), head_rows<const float>(in.v),
                   o.data<float>(), lse.data<float>(), HalfOperands{}, score_args(in), half_output_args(in, o_half)};
  if constexpr (Layout::kHalf) args.half = qkv_half_operands(in);
  allow_shared_memory<attention_forward_kernel<Mma>>(Layout::kBytes, "fused_attention");
  const dim3 grid(static_cast<unsigned>((in.d.S + kFwdRows - 1) / kFwdRows), static_cast<unsigned>(in.d.B * in.d.H));
  launch("fused_attention", attention_forward_kernel<Mma>, grid, kFwdThreads, Layout::kBytes, args);
}

// Whether the warpgroup-MMA kernels run: on a device of compute capability
// 9.0 (sm_90a code runs there alone), unless enable_warpgroup_attention(false).
bool warpgroup_kernels_run() {
  return warpgroup_attention_enabled() && context().major == 9 && context().minor == 0;
}

// Whether the backward runs a warpgroup-MMA kernel: reading P and Pd, or
// in training at "high", where they run. Its grid is the mma.sync kernel's
// of the same precision (the same CTAs per SM), which writes_key_gradients
// reports.
static_assert(BackwardLayout<mma::Fp16Warpgroup, true>::kCtasPerSm == BackwardLayout<Fp16, true>::kCtasPerSm &&
              BackwardLayout<mma::Fp16x3Warpgroup, true>::kCtasPerSm == BackwardLayout<Fp16x3, true>::kCtasPerSm &&
              BackwardLayout<mma::Fp16Warpgroup, false>::kCtasPerSm == BackwardLayout<Fp16, false>::kCtasPerSm);
bool uses_warpgroup_kernel(MatmulPrecision precision, bool read) {
  return (read || precision == MatmulPrecision::High) && warpgroup_kernels_run();
}

// The backward's policy: fp16 tiles at "high"; at "highest" split fp16
// tiles reading P (the benchmark interface, whose caller converts q and
// dout by to_fp16_split; the kernel splits k and v), 3xTF32 in training;
// f(policy, kRead) with kRead: P read, else recomputed (training).
template <class F>
decltype(auto) with_backward_policy(MatmulPrecision precision, bool read, F&& f) {
  const bool high = precision == MatmulPrecision::High;
  if (high && read) return f(Fp16{}, std::true_type{});
  if (high) return f(Fp16{}, std::false_type{});
  if (read) return f(Fp16x3{}, std::true_type{});
  return f(Tf32x3{}, std::false_type{});
}

}  // namespace

}  // namespace tg::cuda

namespace tg {

template <>
void FusedAttentionKernels<Device::CUDA>::forward(const AttentionInputs& in, const Tensor& o, const Tensor& lse,
                                                  MatmulPrecision precision, const Tensor& o_half) {
  using namespace cuda;
  if (in.d.B * in.d.H * in.d.S == 0) return;
  const bool half_qkv = !in.qkv_half.matrices.empty();  // fp16 copies read (in training q, k, v may be undefined)
  TG_CHECK(half_qkv == (precision == MatmulPrecision::High), "fused_attention: the fp16 copy of qkv is read at ",
           "\"high\" and only there");
  for (const auto& [t, name] : {std::pair{&in.q, "q"}, {&in.k, "k"}, {&in.v, "v"}})
    if (!half_qkv || t->defined()) check_rows(name, *t);
  if (precision == MatmulPrecision::High && warpgroup_kernels_run() && forward_warpgroup_takes(in))
    launch_forward_warpgroup(in, o, lse, o_half);
  else if (precision == MatmulPrecision::High) launch_forward<Fp16>(in, o, lse, o_half);
  else launch_forward<Tf32x3>(in, o, lse, o_half);
}

template <>
void FusedAttentionKernels<Device::CUDA>::row_dot(const Tensor& dout, const Tensor& o, const Tensor& delta,
                                                  AttentionDims d) {
  using namespace cuda;
  const int64_t rows = d.B * d.H * d.S;
  if (rows == 0) return;
  check_aligned("dout", dout, 8);
  check_aligned("o", o, 8);
  const dim3 grid(static_cast<unsigned>(d.B * d.H), row_blocks(d.S));
  launch("fused_attention (row dot)", row_dot_kernel, grid, 32 * kRowsPerBlock, 0, dout.data<float>(), o.data<float>(),
         delta.data<float>(), d.S, d.H);
}

namespace {
// Whether backward keeps dw_in's and dw_x's sums as rows: with P read at
// "highest" (launch_backward's row_sums: the Fp16x3 policies with kRead).
bool edit_bias_row_sums(MatmulPrecision precision, bool read) { return read && precision == MatmulPrecision::Highest; }

// The caller's scratch for dw_in's and dw_x's sums (defined): `size` float64
// on CUDA, beside the outputs its finish writes.
void check_edit_bias_sums(const AttentionGradTensors& g, int64_t size) {
  const Tensor& sums = g.edit_bias_sums;
  const bool outputs = g.dw_in.defined() && g.dw_x.defined();
  TG_CHECK(outputs && sums.is_cuda() && sums.dtype() == DType::Float64 && sums.is_contiguous() && sums.numel() == size,
           "fused_attention_backward: edit_bias_sums must be a contiguous float64 [", size,
           "] on CUDA beside dw_in and dw_x; got ", dtype_name(sums.dtype()), " ", sums.shape(), " on ", sums.device(),
           outputs ? "" : " without dw_in or dw_x");
}
}  // namespace

template <>
int64_t FusedAttentionKernels<Device::CUDA>::edit_bias_sums_size(const AttentionDims& d, MatmulPrecision precision,
                                                                 bool read) {
  return cuda::edit_bias_sums_elements(d, edit_bias_row_sums(precision, read));
}

template <>
void FusedAttentionKernels<Device::CUDA>::finish_edit_bias_sums(const AttentionInputs& in, const AttentionGradTensors& g,
                                                                MatmulPrecision precision, bool read) {
  TG_CHECK(g.edit_bias_sums.defined(), "fused_attention_backward: finishing dw_in and dw_x needs their sums' scratch");
  check_edit_bias_sums(g, edit_bias_sums_size(in.d, precision, read));
  cuda::launch_finish_edit_bias_sums(in, g, g.edit_bias_sums, edit_bias_row_sums(precision, read));
}

template <>
void FusedAttentionKernels<Device::CUDA>::backward(const AttentionInputs& in, const AttentionGradTensors& g,
                                                   MatmulPrecision precision) {
  using namespace cuda;
  if (in.d.B * in.d.H * in.d.S == 0) {  // no kernel runs: the written outputs are sums of nothing
    for (const Tensor* t : {&g.dw_in, &g.dw_x})
      if (t->defined()) fill_into(*t, 0.0);
    return;
  }
  const bool half_qkv = !in.qkv_half.matrices.empty();  // fp16 copies read (in training q, k, v undefined then)
  for (const auto& [t, name] : {std::pair{&in.q, "q"}, {&in.k, "k"}, {&in.v, "v"}, {&g.dq, "dq"}, {&g.dk, "dk"},
                                {&g.dv, "dv"}})
    if (!half_qkv || t->defined()) check_rows(name, *t);
  if (g.dout_half.matrices.empty()) check_aligned("dout", g.dout, 16);  // read as float tiles
  TG_CHECK(!g.probs.defined() || (g.colsum_ds.defined() && g.rowsum_pd.defined()),
           "fused_attention_backward: reading P needs the column and row sum outputs");
  if (g.edit_bias_sums.defined()) check_edit_bias_sums(g, edit_bias_sums_size(in.d, precision, g.probs.defined()));
  if (uses_warpgroup_kernel(precision, g.probs.defined()))
    return launch_backward_warpgroup(in, g, precision, g.probs.defined());
  with_backward_policy(precision, g.probs.defined(), [&](auto mma, auto read) {
    launch_backward<decltype(mma), decltype(read)::value>(in, g);
  });
}

template <>
void FusedAttentionKernels<Device::CUDA>::reset_key_halves(const HalfKeyGradients& kv) {
  cuda::launch("fused_attention_backward (fp16 keys)", cuda::reset_key_halves_kernel, 1, cuda::kThreads, 0,
               kv.scratch.data<float>(), kv.db.data<float>(), kv.db.numel());
}

template <>
void FusedAttentionKernels<Device::CUDA>::reduce_dq(const Tensor& dq, const HalfKeyGradients& kv,
                                                    const AttentionDims& d) {
  using namespace cuda;
  const int64_t rows = d.B * d.S, C = d.H * kD;
  check_float_dq("reduce_dq", dq, d);
  TG_CHECK(kv.db.numel() == 3 * C && aligned16(kv.db.raw_data()), "reduce_dq: db ", kv.db.shape(),
           " must hold 3C = ", 3 * C, " biases, 16-byte aligned");
  if (rows == 0) return;
  const int64_t row_quads = C / 4;
  const int64_t column_blocks = (row_quads + kThreads - 1) / kThreads;
  // One block (kRowGroups groups) per SM in all: enough loads in flight, few atomic adds per column.
  const int64_t row_blocks =
      std::clamp<int64_t>(context().sm_count / column_blocks, 1, (rows + kRowGroups - 1) / kRowGroups);
  const dim3 grid(static_cast<unsigned>(column_blocks), static_cast<unsigned>(row_blocks));
  launch("reduce_dq", reduce_dq_kernel, grid, kRowGroups * kThreads, 0, reinterpret_cast<const float4*>(dq.data<float>()),
         rows, row_quads, kv.scratch.data<float>(), kv.db.data<float>());
}

template <>
void FusedAttentionKernels<Device::CUDA>::join_half_qkv(const Tensor& dq, const HalfKeyGradients& kv,
                                                        const AttentionDims& d, const Tensor& dqkv_values) {
  using namespace cuda;
  const int64_t rows = d.B * d.S, C = d.H * kD;
  check_float_dq("join_half_qkv", dq, d);
  TG_CHECK(dqkv_values.numel() == rows * 3 * C / 2 && kv.values.numel() == rows * C, "join_half_qkv: dk and dv ",
           kv.values.shape(), " and dqkv ", dqkv_values.shape(), " do not hold B S = ", rows, " rows of C = ", C,
           " columns each");
  if (rows == 0) return;
  float* scratch = kv.scratch.data<float>();
  const HalfJoin join{dq.data<float>(), reinterpret_cast<const __half*>(kv.values.data<float>()),
                      reinterpret_cast<const int*>(kv.exponents.data<float>()), scratch,
                      reinterpret_cast<__half*>(dqkv_values.data<float>()), rows, d.S, d.H,
                      (d.S + kHalfKeyGroup - 1) / kHalfKeyGroup};
  launch("join_half_qkv", join_half_qkv_kernel, grid_for(rows * 3 * C / 8), kThreads, 0, join);
}

template <>
KernelResidency FusedAttentionKernels<Device::CUDA>::backward_residency(MatmulPrecision precision, bool read) {
  using namespace cuda;
  if (uses_warpgroup_kernel(precision, read)) return backward_warpgroup_residency(precision, read);
  return with_backward_policy(precision, read, [&](auto mma, auto read_p) {
    return cuda::backward_residency<decltype(mma), decltype(read_p)::value>();
  });
}

template <>
bool FusedAttentionKernels<Device::CUDA>::writes_key_gradients(const AttentionDims& d, MatmulPrecision precision,
                                                               bool read) {
  using namespace cuda;
  if (d.B * d.H * d.S == 0) return false;  // no kernel runs
  return with_backward_policy(precision, read, [&](auto mma, auto read_p) {
    return backward_grid<decltype(mma), decltype(read_p)::value>(d).splits == 1;
  });
}

}  // namespace tg

namespace tg {
TG_INSTANTIATE_KERNELS(AttentionBiasKernels, Device::CUDA);
}
