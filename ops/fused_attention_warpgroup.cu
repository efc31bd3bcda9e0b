// The fused attention kernels on Hopper's warpgroup MMA, in a translation
// unit of their own because wgmma exists in the architecture-specific target
// sm_90a alone (the library is built for sm_90); ops/fused_attention.cu
// dispatches to them on a device of compute capability 9.0 unless
// enable_warpgroup_attention(false):
// - the training forward at "high" (below);
// - the backward: the kernel of ops/fused_attention_backward.cuh with
//   core/wgmma.cuh's products, those of Fp16Warpgroup at "high" (training
//   and the benchmark interface) and of Fp16x3Warpgroup at "highest" (the
//   benchmark interface; uses_warpgroup_kernel).
#include "core/tma.cuh"
#include "core/wgmma.cuh"  // before the kernel template, whose calls find the warpgroup products by ordinary lookup
#include "ops/fused_attention_backward.cuh"
#include "ops/fused_attention_forward.cuh"

namespace tg::cuda {

namespace {
// ------------------------------------------------- forward, two warpgroups
// One CTA per (128 queries, b, h): two warpgroups of 64 queries each (four
// warps of 16 rows, as the mma.sync kernel's CTA) walk the same key tiles
// of 64, which they share. Per warpgroup and key tile j:
//   O += P_{j-1} V_{j-1} four m64n64k16 wgmma, the previous tile's kept P from registers
//   S  = Q K_j^T         four more, Q and K_j read from shared memory
// then, once both are done, the scores and the online softmax of tile j
// (SoftmaxRows, the mma.sync kernel's code), O rescaled and P_j kept for the
// next tile. Two such CTAs share an SM: while one warpgroup waits for its
// products the others' softmax runs. Two refinements of FlashAttention-3
// were measured and not kept (bench/NOTES.md version 48): issuing S first
// and waiting for it alone, so that P V ran under the softmax, kept P's
// registers in flight across it (spills; 5% slower), and making the two
// warpgroups take turns issuing their products (named barriers: 2% slower).
//
// Loads are the TMA's, each completing an mbarrier: both warpgroups' Q once;
// K and V in kStages stages, refilled by whichever warpgroup is the second
// to finish with a stage (a counter per stage); each warpgroup's own
// 64 x 64 corner of edit_region_bias, the next one asked for as soon as
// every warp has scored the current one. The TMA writes zeros past S (the
// maps' sizes), as the cp.async copies do. Each warpgroup writes its keys'
// edit terms (KeyFlags) into a double buffer of its own: the two compute
// the same 128 floats per tile, where one shared buffer would need a barrier
// of both warpgroups per tile.
constexpr int kPairThreads = 256, kPairRows = 128, kStages = 2;
constexpr int kWarpgroupThreads = 128, kWarpgroupRows = 64;
constexpr uint32_t kHalfTileBytes = 64 * kD * sizeof(__half);         // a 64 x 64 fp16 tile: one box
constexpr uint32_t kBiasTileBytes = 64 * kFwdKeys * sizeof(float);    // a 64 x 64 float tile: two boxes of 32 columns
constexpr uint32_t kTermsBytes = 2 * kFwdKeys * sizeof(float);        // one tile's key terms (KeyFlags::store)
constexpr int kWarpgroupBarrier = 1;                                  // a named barrier per warpgroup: + the warpgroup

// Shared memory in bytes from a 1024-byte aligned start (the swizzled
// tiles): Q (a tile per warpgroup), K and V (a tile per stage each), the
// bias corner (a tile per warpgroup), the key terms (two per warpgroup),
// then the mbarriers (Q, K and V per stage, the bias per warpgroup) and the
// stages' release counters.
struct PairLayout {
  static constexpr size_t kQ = 0, kK = kQ + 2 * kHalfTileBytes, kV = kK + kStages * kHalfTileBytes,
                          kBias = kV + kStages * kHalfTileBytes, kTerms = kBias + 2 * kBiasTileBytes,
                          kBarriers = kTerms + 2 * 2 * kTermsBytes, kCounters = kBarriers + (1 + kStages + 2) * 8,
                          kBytes = kCounters + kStages * sizeof(uint32_t) + 1024;  // + the alignment
};

struct ForwardMaps {
  CUtensorMap qkv;   // the fp16 copy [B][S][3C], boxes of 64 rows x 64 columns
  CUtensorMap bias;  // edit_region_bias [H][M][M] cut to [H][S][S], boxes of 64 rows x 32 columns
};

// Element (r, col) of a 64 x 64 float tile that the TMA wrote as two boxes
// of 32 columns with the 128-byte swizzle: row r of box col / 32 at 128 r
// bytes, its 16-byte chunk c at chunk c ^ (r % 8). A warp's float2 loads
// of rows g and columns 8 nt + 2 t (t < 4) then cover all 32 banks twice.
__device__ __forceinline__ int swizzled_bias_offset(int r, int col) {
  return (col / 32) * 64 * 32 + r * 32 + (((col % 32) / 4) ^ (r % 8)) * 4 + col % 4;
}

__global__ void __launch_bounds__(kPairThreads, 2)
    attention_forward_warpgroup_kernel(const __grid_constant__ ForwardMaps maps, const ForwardArgs p) {
  after_previous_kernels();
  using L = PairLayout;
  using KMajor = wgmma::KMajor<wgmma::Swizzle::k128B>;
  extern __shared__ unsigned char raw[];
  unsigned char* smem = async::align_shared<1024>(raw);
  const ScoreArgs& sc = p.sc;
  const int warpgroup = threadIdx.x / kWarpgroupThreads, thread = threadIdx.x % kWarpgroupThreads;
  const int warp = thread / 32, lane = thread % 32, g = lane >> 2, t = lane & 3;
  const bool leader = thread == 0;  // the warpgroup's thread that asks for its loads
  // The i-th fp16 tile from offset `at`: warpgroup i's Q, stage i's K or V.
  const auto half_tile = [&](size_t at, int i) {
    return reinterpret_cast<__half*>(smem + at + i * kHalfTileBytes);
  };
  const __half* Qs = half_tile(L::kQ, warpgroup);
  float* bias = reinterpret_cast<float*>(smem + L::kBias + warpgroup * kBiasTileBytes);
  float* terms = reinterpret_cast<float*>(smem + L::kTerms + warpgroup * 2 * kTermsBytes);  // [2][2 kFwdKeys]
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + L::kBarriers);
  uint64_t* keys_full = q_full + 1;                 // [kStages]
  uint64_t* bias_bars = keys_full + kStages;        // [2]: a warpgroup's bias corner
  uint64_t* bias_full = bias_bars + warpgroup;
  uint32_t* released = reinterpret_cast<uint32_t*>(smem + L::kCounters);  // [kStages]

  // b varies fastest in blockIdx.y (the mma.sync kernel's order: the B CTAs of one bias corner together).
  const int64_t h = blockIdx.y / sc.B, b = blockIdx.y % sc.B;
  const int cta_query = static_cast<int>(blockIdx.x) * kPairRows;  // the CTA's first query
  const int64_t q0 = cta_query + kWarpgroupRows * warpgroup;         // this warpgroup's
  const int tiles = static_cast<int>((sc.S + kFwdKeys - 1) / kFwdKeys);
  const int C = static_cast<int>(sc.H * kD);
  // The TMA's coordinates (int32): this head's column in qkv's parts, this warpgroup's first query, b and h.
  const int head_col = static_cast<int>(h * kD), first_query = static_cast<int>(q0), batch = static_cast<int>(b),
            head = static_cast<int>(h);
  const auto row_of = [&](int r) { return q0 + 16 * warp + g + 8 * r; };
  const auto row_id = [&](int r) { return (b * sc.H + h) * sc.S + row_of(r); };

  // Key tile j's K and V into stage j % kStages, by one thread.
  const auto load_keys = [&](int j) {
    const int stage = j % kStages;
    tma::arrive_expect_bytes(keys_full + stage, 2 * kHalfTileBytes);
    tma::load_3d(half_tile(L::kK, stage), maps.qkv, C + head_col, j * kFwdKeys, batch, keys_full + stage);
    tma::load_3d(half_tile(L::kV, stage), maps.qkv, 2 * C + head_col, j * kFwdKeys, batch, keys_full + stage);
  };
  // This warpgroup's bias corner of key tile j, by its leader.
  const auto load_bias = [&](int j) {
    tma::arrive_expect_bytes(bias_full, kBiasTileBytes);
    for (int half = 0; half < 2; ++half)
      tma::load_3d(bias + half * 64 * 32, maps.bias, j * kFwdKeys + 32 * half, first_query, head,
                   bias_full);
  };
  // By the leader, once its warpgroup is done with tile j's stage (its products waited for, then its warps
  // met at the warpgroup's barrier): the second warpgroup to get here refills it. So both warpgroups walk
  // every tile, rows past S or not: one that skipped a tile would leave the other waiting for its stage.
  const auto release = [&](int j) {
    if ((atomicAdd(released + j % kStages, 1u) & 1u) && j + kStages < tiles) load_keys(j + kStages);
  };

  if (threadIdx.x == 0) {
    tma::init_barrier(q_full, 1);
    for (int i = 0; i < kStages; ++i) tma::init_barrier(keys_full + i, 1);
    for (int w = 0; w < 2; ++w) tma::init_barrier(bias_bars + w, 1);
    for (int i = 0; i < kStages; ++i) released[i] = 0;
    tma::fence_barrier_init();
    tma::arrive_expect_bytes(q_full, 2 * kHalfTileBytes);
    for (int w = 0; w < 2; ++w)
      tma::load_3d(half_tile(L::kQ, w), maps.qkv, head_col, cta_query + kWarpgroupRows * w, batch, q_full);
    for (int j = 0; j < kStages && j < tiles; ++j) load_keys(j);
  }
  __syncthreads();
  if (leader) load_bias(0);

  const float w_in = sc.w_in[h], w_x = sc.w_x[h];
  // The score's factor of the Q K^T product, and o's of the P V product (dropout's 1 / (1 - p) included).
  const float qk_scale = sc.scale * p.half.inverse_scale(kHalfQ) * p.half.inverse_scale(kHalfK);
  const float o_scale = sc.keep_scale * p.half.inverse_scale(kHalfV);
  const auto terms_buffer = [&](int j) { return terms + (j % 2) * 2 * kFwdKeys; };  // tile j's key terms
  KeyFlags::load(sc, b, 0, kFwdKeys, thread).store(kFwdKeys, w_in, w_x, terms_buffer(0), thread);
  wgmma::barrier_sync(kWarpgroupBarrier + warpgroup, kWarpgroupThreads);

  SoftmaxRows rows(sc, b, row_of, row_id, t);
  // Row g + 8 r's bias at columns 8 nt + 2 t: swizzled_bias_offset with its chunk (2 (nt % 4) + t / 2) ^ g
  // split as 2 ((nt % 4) ^ (g / 2)) + ((t / 2) ^ (g % 2)), so that per nt only a box and one XOR remain.
  const float* bias_row = bias + swizzled_bias_offset(16 * warp + g, 2 * t) - 8 * (g >> 1);
  const auto e_pair = [&](int r, int nt) {
    return *reinterpret_cast<const float2*>(bias_row + 8 * r * 32 + (nt / 4) * 64 * 32 + 8 * ((nt % 4) ^ (g >> 1)));
  };
  float acc[8][4] = {};
  uint32_t kept[4][4];  // the previous tile's kept P, the A fragment of P V's k-step s (keys 16 s ..)
  const auto issue_pv = [&](int j) {  // O += P_j V_j
#pragma unroll
    for (int step = 0; step < 4; ++step)
      wgmma::mma_64x64x16<true>(mma::warpgroup::flat(acc), kept[step],
                                wgmma::MnMajor128B::product(half_tile(L::kV, j % kStages), step, kD, kFwdKeys), true);
  };
  // Key tile j: P V of tile j - 1 (with_pv: every tile but the first) and S of tile j. Two instances: with
  // a run-time branch around P V ptxas injects waits for the products (warning C7519).
  const auto tile = [&](int j, auto with_pv) {
    const int64_t k0 = int64_t(j) * kFwdKeys;
    const bool last = j + 1 == tiles;
    const KeyFlags next = last ? KeyFlags{} : KeyFlags::load(sc, b, k0 + kFwdKeys, kFwdKeys, thread);
    tma::wait(keys_full + j % kStages, (j / kStages) & 1);
    wgmma::fence();
    if constexpr (decltype(with_pv)::value) issue_pv(j - 1);
    float s[8][4];
#pragma unroll
    for (int step = 0; step < 4; ++step)
      wgmma::mma_64x64x16(mma::warpgroup::flat(s), KMajor::product(Qs, step, 64, kD),
                          KMajor::product(half_tile(L::kK, j % kStages), step, 64, kD), step > 0);
    wgmma::commit();
    wgmma::wait<0>();  // S, and P V: acc and `kept` free, the previous stage read
    tma::wait(bias_full, j & 1);
    float correction[2];
    const bool moved = rows.score(s, qk_scale, e_pair, terms_buffer(j), t, correction);
    if (!last) next.store(kFwdKeys, w_in, w_x, terms_buffer(j + 1), thread);
    // Every warp has scored tile j (its bias corner and terms read), written tile j + 1's terms and finished P V.
    wgmma::barrier_sync(kWarpgroupBarrier + warpgroup, kWarpgroupThreads);
    if (leader) {
      if (!last) load_bias(j + 1);
      if (j > 0) release(j - 1);
    }
    if (moved) rescale_rows(acc, correction);
    rows.keep(s, sc, k0, t);
#pragma unroll
    for (int step = 0; step < 4; ++step)  // mma.sync's A fragment of keys 16 step .. (core/wgmma.cuh)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float(&c)[4] = s[2 * step + (i >> 1)];
        kept[step][i] = mma::pack_half2(c[2 * (i & 1)], c[2 * (i & 1) + 1]);
      }
  };
  tma::wait(q_full, 0);
  tile(0, std::false_type{});
  for (int j = 1; j < tiles; ++j) tile(j, std::true_type{});
  wgmma::fence();
  issue_pv(tiles - 1);
  wgmma::commit();
  wgmma::wait<0>();
  rows.store(acc, o_scale, p, row_of, row_id, [&](int r) { return (b * sc.S + row_of(r)) * C + h * kD; }, t);
}

// The backward's warpgroup policy, f(policy, kRead) as with_backward_policy
// (ops/fused_attention.cu) calls it: Fp16Warpgroup at "high" (training or
// the interface), Fp16x3Warpgroup at "highest" reading P (the interface).
template <class F>
decltype(auto) with_warpgroup_policy(MatmulPrecision precision, bool read, F&& f) {
  TG_CHECK(read || precision == MatmulPrecision::High,
           "fused_attention_backward (internal): training on the warpgroup MMA is at \"high\" alone");
  if (precision == MatmulPrecision::High && read) return f(mma::Fp16Warpgroup{}, std::true_type{});
  if (precision == MatmulPrecision::High) return f(mma::Fp16Warpgroup{}, std::false_type{});
  return f(mma::Fp16x3Warpgroup{}, std::true_type{});
}
}  // namespace

bool forward_warpgroup_takes(const AttentionInputs& in) {
  // The TMA's maps need 16-byte aligned bases and row strides: the bias's, 4 M bytes, a multiple of 16.
  return in.d.M % 4 == 0 && aligned16(in.edit_region_bias.raw_data()) &&
         aligned16(half_values(in.qkv_half.matrices[0]));
}

void launch_forward_warpgroup(const AttentionInputs& in, const Tensor& o, const Tensor& lse, const Tensor& o_half) {
  const char* op = "fused_attention";
  const AttentionDims& d = in.d;
  const ForwardArgs args{{}, {}, {}, o.data<float>(), lse.data<float>(), qkv_half_operands(in), score_args(in),
                         half_output_args(in, o_half)};
  const auto u = [](int64_t x) { return static_cast<uint64_t>(x); };
  const int64_t C = d.H * kD;
  const tma::TensorShape qkv{3, {u(3 * C), u(d.S), u(d.B)}, {u(3 * C * 2), u(d.S * 3 * C * 2)}, {64, 64, 1}};
  const tma::TensorShape bias{3, {u(d.S), u(d.S), u(d.H)}, {u(d.M * 4), u(d.M * d.M * 4)}, {32, 64, 1}};
  const ForwardMaps maps{
      tma::encode(half_values(in.qkv_half.matrices[0]), CU_TENSOR_MAP_DATA_TYPE_FLOAT16, qkv, op),
      tma::encode(in.edit_region_bias.data<float>(), CU_TENSOR_MAP_DATA_TYPE_FLOAT32, bias, op)};
  allow_shared_memory<attention_forward_warpgroup_kernel>(PairLayout::kBytes, op);
  const dim3 grid(static_cast<unsigned>((d.S + kPairRows - 1) / kPairRows), static_cast<unsigned>(d.B * d.H));
  launch(op, attention_forward_warpgroup_kernel, grid, kPairThreads, PairLayout::kBytes, maps, args);
}

void launch_backward_warpgroup(const AttentionInputs& in, const AttentionGradTensors& g, MatmulPrecision precision,
                               bool read) {
  with_warpgroup_policy(precision, read, [&](auto mma, auto read_p) {
    launch_backward<decltype(mma), decltype(read_p)::value>(in, g);
  });
}

KernelResidency backward_warpgroup_residency(MatmulPrecision precision, bool read) {
  return with_warpgroup_policy(precision, read, [](auto mma, auto read_p) {
    return backward_residency<decltype(mma), decltype(read_p)::value>();
  });
}

}  // namespace tg::cuda
