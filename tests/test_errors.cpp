// Bad input gives a tg::Error naming the op, the argument and the shapes.
#include "helpers.h"
#include "ops/matmul_kernels.h"
#include "ops/untracked.h"

using namespace tgtest;

TEST_CASE("errors/matmul inner dimension") {
  CHECK(error_of([] { tg::matmul(tg::zeros({2, 3}), tg::zeros({4, 5})); }) ==
        "matmul: a [2,3] and b [4,5] do not agree on the inner dimension (3 vs 4)");
  CHECK(contains(error_of([] { tg::matmul(tg::zeros({3}), tg::zeros({3, 2})); }), "must both have at least 2 dims"));
  CHECK(contains(error_of([] { tg::matmul(tg::zeros({2, 2, 3}), tg::zeros({3, 3, 2})); }),
                 "matmul: shapes [2] and [3] cannot be broadcast"));
}

// sum_columns_into (ops/untracked.h) takes its scratch from the caller; a
// short or missing one is refused before anything runs.
TEST_CASE("errors/sum_columns_into checks out and its scratch") {
  const tg::Tensor x = tg::ones({40, 40}), out = tg::zeros({40});
  CHECK(tg::sum_columns_scratch(x) == 120);  // 3 chunks of 16 rows, one level
  CHECK(error_of([&] { tg::sum_columns_into(out, x, tg::zeros({119})); }) ==
        "sum: the column sums of [40, 40] need 120 contiguous float32 elements of scratch on cpu, got float32 [119]");
  CHECK(error_of([&] { tg::sum_columns_into(out, x, tg::zeros({120}, {tg::DType::Float64})); }) ==
        "sum: the column sums of [40, 40] need 120 contiguous float32 elements of scratch on cpu, got float64 [120]");
  CHECK(error_of([&] { tg::sum_columns_into(tg::zeros({4, 10}), x, tg::zeros({120})); }) ==
        "sum_columns_into: out must be a contiguous [40] for x [40,40], got [4,10]");
  tg::sum_columns_into(out, x, tg::zeros({120}));
  CHECK(out.to_vector() == std::vector<double>(40, 40.0));
}

// projection_grads_fp16 with neither gradient wanted does nothing (a
// projection whose bias alone needs its gradient); a slot past its group is refused.
TEST_CASE("errors/projection_grads_fp16 checks its slots") {
  const auto [dx, dw] = tg::projection_grads_fp16(tg::Fp16Group{}, -1, -1);
  CHECK((!dx.defined() && !dw.defined()));
  CHECK(error_of([] { tg::projection_grads_fp16(tg::Fp16Group{}, 1, -1); }) ==
        "projection_grads_fp16: slots 1 (W) and -1 (x) in a group of 0 matrices");
}

TEST_CASE("errors/regroup_fp16 checks its sources") {
  const tg::Tensor scalars = tg::zeros({tg::kFp16Scalars}), exponent = tg::zeros({2});
  const tg::Fp16Matrix m{tg::zeros({6}), 3, 4};
  using S = tg::Fp16ScaleSource;
  const auto call = [](const std::vector<S>& sources) { return error_of([&] { tg::regroup_fp16(sources); }); };
  CHECK(call({}) == "regroup_fp16: takes 1 to 4 matrices, got 0");
  CHECK(call({{m, scalars, 0}}) == "regroup_fp16: fp16 groups exist on CUDA only");
  CHECK(call({{m, exponent, 1, S::kExponent}}) == "regroup_fp16: fp16 groups exist on CUDA only");
  CHECK(call({{m, scalars, 0}, {{tg::zeros({5}), 3, 4}, scalars, 1}}) ==
        "regroup_fp16: matrix 1 [3, 4] with 5 values on cpu, scalars [" + std::to_string(tg::kFp16Scalars) +
            "] on cpu: needs its fp16 pairs and scalars, contiguous float32, on cpu");
  CHECK(call({{m, scalars, 0}, {{tg::zeros({6}, {tg::DType::Float64}), 3, 4}, scalars, 1}}) ==
        "regroup_fp16: matrix 1 [3, 4] with 6 values on cpu, scalars [" + std::to_string(tg::kFp16Scalars) +
            "] on cpu: needs its fp16 pairs and scalars, contiguous float32, on cpu");
  CHECK(call({{m, scalars, 0}, {{tg::Tensor(), 3, 4}, scalars, 1}}) ==
        "regroup_fp16: matrix 1's values or scalars are undefined");
  CHECK(call({{m, scalars, 4}}) ==
        "regroup_fp16: matrix 0's scale at index 4 of " + std::to_string(tg::kFp16Scalars) + " scalars");
  CHECK(call({{m, exponent, 0}}) == "regroup_fp16: matrix 0's scale at index 0 of 2 scalars");
  CHECK(call({{m, exponent, 2, S::kExponent}}) == "regroup_fp16: matrix 0's scale at index 2 of 2 scalars");
  CHECK(call({{m, scalars, 0, S::kBound, 65}}) == "regroup_fp16: matrix 0's shift 65 is outside [0, 64]");
  CHECK(call({{m, tg::Tensor(), 0}}) == "regroup_fp16: matrix 0's values or scalars are undefined");
}

TEST_CASE("errors/dtype mismatch names both tensors") {
  const std::string msg = error_of([] { tg::add(tg::zeros({2}), tg::zeros({2}, {tg::DType::Float64})); });
  CHECK(msg == "add: tensors have different dtypes (float32 [2] vs float64 [2])");
}

TEST_CASE("errors/broadcasting") {
  CHECK(error_of([] { tg::mul(tg::zeros({2, 3}), tg::zeros({4})); }) ==
        "mul: shapes [2,3] and [4] cannot be broadcast (dim 1: 3 vs 4)");
}

TEST_CASE("errors/linear") {
  CHECK(error_of([] { tg::linear(tg::zeros({2, 3}), tg::zeros({4, 5})); }) ==
        "linear: x [2,3] and weight [4,5] do not agree on in_features (3 vs 5)");
  CHECK(error_of([] { tg::linear(tg::zeros({2, 3}), tg::zeros({4, 3}), tg::zeros({3})); }) ==
        "linear: bias [3] must be [4] for weight [4,3]");
  CHECK(error_of([] { tg::linear_fp16(tg::zeros({2, 3}), tg::zeros({4, 5})); }) ==
        "linear_fp16: x [2,3] and weight [4,5] do not agree on in_features (3 vs 5)");
  CHECK(error_of([] { tg::linear_fp16(tg::zeros({2, 3}), tg::zeros({4, 3}), tg::zeros({3})); }) ==
        "linear_fp16: bias [3] must be [4] for weight [4,3]");
  CHECK(error_of([] { tg::linear_fp16(tg::zeros({2, 3}), tg::Tensor()); }) ==
        "linear_fp16: argument 'weight' is an undefined tensor");
}

TEST_CASE("errors/views") {
  CHECK(error_of([] { tg::zeros({2, 3}).view({4, 2}); }) ==
        "view: shape [4,2] is invalid for an input of shape [2,3] (6 elements)");
  CHECK(contains(error_of([] { tg::zeros({2, 3}).transpose(0, 1).view({6}); }), "is not contiguous; use reshape()"));
  CHECK(error_of([] { tg::zeros({2, 3}).narrow(1, 2, 2); }) == "narrow: range [2, 4) is out of bounds for dim 1 of shape [2,3]");
  CHECK(error_of([] { tg::zeros({2, 3}).permute({0, 0}); }) == "permute: dim 0 repeats in the permutation of a tensor of shape [2,3]");
  CHECK(error_of([] { tg::zeros({2, 3}).transpose(0, 2); }) == "transpose: dim 2 is out of range for a tensor of rank 2");
  CHECK(error_of([] { tg::zeros({2, 3}).expand({4, 3}); }) == "expand: cannot expand shape [2,3] to [4,3] (dim 0: 2 vs 4)");
  CHECK(error_of([] { tg::zeros({2, 3}).squeeze(0); }) == "squeeze: dim 0 of shape [2,3] has size 2, not 1");
}

TEST_CASE("errors/edit_bias") {
  const tg::Tensor E = tg::zeros({4, 8, 8}), w = tg::zeros({4, 1, 1});
  CHECK(error_of([&] { tg::edit_bias(tg::zeros({4, 8, 7}), w, w, tg::zeros({2, 5})); }) ==
        "edit_bias: edit_region_bias must be [H,M,M], got [4,8,7]");
  CHECK(error_of([&] { tg::edit_bias(E, tg::zeros({4}), w, tg::zeros({2, 5})); }) ==
        "edit_bias: within_edit_bias must be [4,1,1], got [4]");
  CHECK(error_of([&] { tg::edit_bias(E, w, w, tg::zeros({2, 9})); }) ==
        "edit_bias: sequence length 9 of edit_mask [2,9] exceeds the 8 positions of edit_region_bias [4,8,8]");
}

TEST_CASE("errors/other ops") {
  CHECK(error_of([] { tg::byte_range(tg::Tensor()); }) == "byte_range: argument 't' is an undefined tensor");
  CHECK(error_of([] { tg::dropout(tg::zeros({2}), {1.0}); }) ==
        "dropout: p must be in [0, 1 - 2^-16] as a float (dropout draws 16 bits), got 1");
  // below 1 as a double, 1 as a float: its keep threshold would wrap to "keep all"
  CHECK(error_of([] { tg::dropout(tg::zeros({2}), {0.99999999}); }) ==
        "dropout: p must be in [0, 1 - 2^-16] as a float (dropout draws 16 bits), got 0.99999999");
  CHECK(error_of([] { tg::dropout_mask({2}, -0.5, {1, 1}); }) ==
        "dropout_mask: p must be in [0, 1 - 2^-16] as a float (dropout draws 16 bits), got -0.5");
  CHECK(error_of([] { tg::mse_loss(tg::zeros({2}), tg::zeros({3})); }) == "mse_loss: input [2] and target [3] differ in shape");
  CHECK(error_of([] { tg::layer_norm(tg::zeros({2, 3}), tg::zeros({2})); }) == "layer_norm: weight must be [3] for x [2,3], got [2]");
  CHECK(error_of([] { tg::sum(tg::zeros({2, 3}), {2}); }) == "sum: dim 2 is out of range for a tensor of rank 2");
  CHECK(error_of([] { tg::masked_fill(tg::zeros({2, 3}), tg::zeros({2, 2}), 0); }) ==
        "masked_fill: shapes [2,3] and [2,2] cannot be broadcast (dim 1: 3 vs 2)");
  CHECK(error_of([] { tg::zeros({2}).item(); }) == "item: tensor of shape [2] has 2 elements, not 1");
  CHECK(error_of([] { tg::nn::uniform({2}, std::nan("")); }) == "uniform: bound must be finite and >= 0, got nan");
  CHECK(error_of([] { tg::nn::uniform({2}, -1); }) == "uniform: bound must be finite and >= 0, got -1");
  CHECK(error_of([] { tg::Tensor().shape(); }) == "Tensor: use of an undefined tensor");
  CHECK(error_of([] { tg::add(tg::Tensor(), tg::zeros({1})); }) == "add: argument 'a' is an undefined tensor");
  CHECK(error_of([] { tg::from_vector({1, 2, 3}, {2, 2}); }) == "from_vector: 3 values do not fill shape [2,2] (4 elements)");
  CHECK(contains(error_of([] { tg::set_float32_matmul_precision("medium"); }), "precision 'medium' is not one of"));
  CHECK(contains(error_of([] { tg::gradcheck([](const std::vector<tg::Tensor>& t) { return t[0]; }, {tg::zeros({2})}); }),
                 "gradcheck: input 0 [2] must be a float64 CPU tensor"));
}

TEST_CASE("errors/region_attention") {
  auto p = tg::RegionAttentionParams::init({8, 2, 4});
  CHECK(error_of([&] { tg::region_attention_decomposed(tg::zeros({1, 3, 8}), tg::zeros({1, 2}), tg::ones({1, 3}), p); }) ==
        "region_attention: edit_mask must be [1,3], got [1,2]");
  CHECK(error_of([&] { tg::region_attention_decomposed(tg::zeros({1, 5, 8}), tg::zeros({1, 5}), tg::ones({1, 5}), p); }) ==
        "edit_bias: sequence length 5 of edit_mask [1,5] exceeds the 4 positions of edit_region_bias [2,4,4]");
  CHECK(error_of([] { tg::RegionAttentionParams::init({10, 3, 4}); }) ==
        "RegionAttentionParams::init: hidden 10 must be a positive multiple of heads 3, and max_positions 4 positive");
  CHECK(error_of([] { tg::RegionAttentionParams::init({0, 1, 4}); }) ==
        "RegionAttentionParams::init: hidden 0 must be a positive multiple of heads 1, and max_positions 4 positive");
  CHECK(error_of([] { tg::RegionAttentionParams::init({8, 2, 0}); }) ==
        "RegionAttentionParams::init: hidden 8 must be a positive multiple of heads 2, and max_positions 0 positive");
  // Parameters of another head count or hidden size: errors before anything
  // broadcasts (a one-head bias would otherwise be shared by both heads).
  for (const tg::AttentionImpl impl : {tg::AttentionImpl::Decomposed, tg::AttentionImpl::Fused}) {
    const auto run = [&](const tg::RegionAttentionParams& q) {
      return error_of([&] { tg::region_attention(tg::zeros({1, 3, 8}), tg::zeros({1, 3}), tg::ones({1, 3}), q, {}, impl); });
    };
    auto q = p;
    q.edit_region_bias = tg::zeros({1, 4, 4});
    CHECK(run(q) == "region_attention: edit_region_bias must be [2,M,M], got [1,4,4]");
    q = p;
    q.within_edit_bias = tg::zeros({1, 1, 1});
    CHECK(run(q) == "region_attention: within_edit_bias must be [2,1,1], got [1,1,1]");
    q = p;
    q.out_weight = tg::zeros({8, 6});
    CHECK(run(q) == "region_attention: out_weight must be [8,8], got [8,6]");
    q = p;
    q.heads = 4;
    CHECK(run(q) == "region_attention: edit_region_bias must be [4,M,M], got [2,4,4]");
  }
}

TEST_CASE("errors/devices without CUDA" * doctest::skip(tg::cuda::is_available())) {
  if (tg::built_with_cuda()) {
    CHECK(contains(error_of([] { tg::zeros({2}).cuda(); }), "no CUDA device is available"));
  } else {
    CHECK(contains(error_of([] { tg::zeros({2}).cuda(); }), "built without CUDA"));
    float host[4] = {1, 2, 3, 4};  // not device memory, and no CUDA to tell: refused, not copied from later
    CHECK(contains(error_of([&] { tg::from_blob(host, {4}, {tg::DType::Float32, tg::Device::CUDA}); }),
                   "built without CUDA"));
  }
}

// to_fp16 checks its arguments before dispatching, so a CPU call reaches the
// column-bias check (and only a valid one reaches the CPU's "CUDA only").
TEST_CASE("errors/to_fp16 checks each column bias before the device") {
  const tg::Tensor x = tg::zeros({3, 5});
  CHECK(error_of([&] { tg::to_fp16({x}, {tg::zeros({3})}); }) ==
        "to_fp16: the column bias of matrix 0 [3,5] must be a contiguous float32 [5] on cpu; got float32 [3] on cpu");
  CHECK(contains(error_of([&] { tg::to_fp16({x}, {tg::zeros({5}, {tg::DType::Float64})}); }), "got float64 [5]"));
  CHECK(contains(error_of([&] { tg::to_fp16({x}, {tg::zeros({1, 5})}); }), "got float32 [1,5]"));
  CHECK(contains(error_of([&] { tg::to_fp16({x, x}, {tg::zeros({5})}); }), "1 column biases for 2 matrices"));
  CHECK(contains(error_of([&] { tg::to_fp16({x}, {tg::zeros({5})}); }), "exist on CUDA only"));
}

// linear_to_fp16 checks x, W and the bias before anything runs, so a CPU call
// reaches them (and only valid arguments reach to_fp16's "CUDA only").
TEST_CASE("errors/linear_to_fp16 checks its arguments before the device") {
  const tg::Tensor x = tg::zeros({4, 6}), w = tg::zeros({5, 6});
  CHECK(error_of([&] { tg::linear_to_fp16(x, w, tg::zeros({6})); }) ==
        "linear_to_fp16: the column bias of x W^T [4,5] must be a contiguous float32 [5] on cpu; got float32 [6] on cpu");
  CHECK(contains(error_of([&] { tg::linear_to_fp16(x, tg::zeros({5, 7}), {}); }),
                 "linear_to_fp16: x [4,6] and W [5,7] differ in their inner size"));
  CHECK(contains(error_of([&] { tg::linear_to_fp16(x, w.to(tg::DType::Float64), {}); }),
                 "linear_to_fp16: matrix 1 must be contiguous, 2-D, float32"));
  CHECK(contains(error_of([&] { tg::linear_to_fp16(x, w, {}); }), "exist on CUDA only"));
}

// gemm_fp16 checks the group's indices and sizes its product from the
// operands as op(A) op(B) would be: a consistent product gets past the
// checks to the device (on the CPU, its "CUDA only"); an inconsistent one
// names both sides.
TEST_CASE("errors/gemm_fp16 checks its operands and sizes its product") {
  const auto matrix = [](int64_t rows, int64_t cols) {
    return tg::Fp16Matrix{tg::zeros({(rows * cols + 1) / 2}), rows, cols};
  };
  const tg::Fp16Group group{{matrix(6, 4), matrix(4, 3), matrix(6, 3)}, tg::zeros({tg::kFp16Scalars}), {}};
  CHECK(error_of([&] { tg::gemm_fp16(group, 0, false, 3, false); }) == "gemm_fp16: matrices 0 and 3 of a group of 3");
  for (const auto& [a, transpose_a, b, transpose_b] : std::vector<std::tuple<int, bool, int, bool>>{
           {0, false, 1, false}, {0, true, 2, false}, {2, true, 0, false}, {1, true, 0, true}, {2, false, 1, true}}) {
    CAPTURE(a);
    CAPTURE(b);
    CHECK(error_of([&] { tg::gemm_fp16(group, a, transpose_a, b, transpose_b); }) ==
          "gemm_fp16: fp16 GEMMs run on CUDA only");
  }
  CHECK(error_of([&] { tg::gemm_fp16(group, 0, false, 2, false); }) ==
        "gemm_fp16: [6, 4] @ [6, 3] does not give c [6,3] (contiguous float32)");
  tg::Fp16Group split = group;  // low parts: none, or one per matrix
  split.lows = {matrix(6, 4)};
  CHECK(error_of([&] { tg::gemm_fp16(split, 0, false, 1, false); }) ==
        "gemm_fp16: 1 low parts for 3 matrices (none, or one per matrix)");
  split.lows = group.matrices;
  CHECK(error_of([&] { tg::gemm_fp16(split, 0, false, 1, false); }) == "gemm_fp16: fp16 GEMMs run on CUDA only");
}

// to_fp16_with_head_dots checks x, other and out before the device.
TEST_CASE("errors/to_fp16_with_head_dots checks its shapes before the device") {
  const tg::Tensor x = tg::zeros({6, 128});  // B = 2, S = 3, H = 2
  const auto dots = [&](const tg::Tensor& other, const tg::Tensor& out, int64_t S) {
    return error_of([&] { tg::to_fp16_with_head_dots(x, {other, out, S}, false); });
  };
  const tg::Tensor out = tg::zeros({2, 2, 3});
  CHECK(dots(tg::zeros({6, 64}), out, 3) ==
        "to_fp16_with_head_dots: other must be a contiguous float32 [6,128] on cpu like x; got float32 [6,64] on cpu");
  CHECK(dots(x, tg::zeros({2, 3, 2}), 3) ==
        "to_fp16_with_head_dots: out must be a contiguous float32 [2,2,3] on cpu; got float32 [2,3,2] on cpu");
  CHECK(dots(x, out, 4) == "to_fp16_with_head_dots: x [6,128] must be [B S, 64 H] for seq_len 4");
  CHECK(contains(error_of([&] { tg::to_fp16_with_head_dots(tg::zeros({6, 96}), {tg::zeros({6, 96}), out, 3}, false); }),
                 "x [6,96] must be [B S, 64 H]"));
  CHECK(contains(error_of([&] { tg::to_fp16_with_head_dots(tg::zeros({768}), {tg::zeros({768}), out, 3}, false); }),
                 "to_fp16_with_head_dots: matrix 0 must be contiguous, 2-D, float32"));
  CHECK(contains(dots(x, out, 3), "exist on CUDA only"));
}

// to_fp16_split checks its matrices as to_fp16 does, before the device.
TEST_CASE("errors/to_fp16_split checks its matrices") {
  CHECK(contains(error_of([] { tg::to_fp16_split({}); }), "to_fp16_split: takes 1 to 4 matrices, got 0"));
  CHECK(contains(error_of([] { tg::to_fp16_split({tg::zeros({3, 5}, {tg::DType::Float64})}); }),
                 "to_fp16_split: matrix 0 must be contiguous, 2-D, float32"));
  CHECK(contains(error_of([] { tg::to_fp16_split({tg::zeros({3, 5})}); }), "exist on CUDA only"));
}
