// tg::nn: module registration, naming, modes and state_dict (with every
// error), and each layer's shapes, values and gradcheck.
#include <cmath>

#include "helpers.h"

using namespace tgtest;
namespace nn = tg::nn;

namespace {

const tg::TensorOptions kF64{tg::DType::Float64};

// A model with a parameter, a buffer, a list of submodules and a layer
// without bias, for the naming tests.
struct Net : nn::Module {
  Net()
      : scale(register_parameter("scale", tg::ones({1}))),
        count(register_buffer("count", tg::zeros({2}))),
        blocks(register_module("blocks", std::make_shared<nn::ModuleList<nn::MLP>>())),
        head(register_module("head", std::make_shared<nn::Linear>(3, 2, false))) {
    blocks->push_back(std::make_shared<nn::MLP>(3, 4, 3));
    blocks->push_back(std::make_shared<nn::MLP>(3, 4, 3));
  }
  tg::Tensor& scale;
  tg::Tensor& count;
  std::shared_ptr<nn::ModuleList<nn::MLP>> blocks;
  std::shared_ptr<nn::Linear> head;
};

std::vector<std::string> mlp_names(const std::string& prefix) {
  return {prefix + "fc1.weight", prefix + "fc1.bias", prefix + "fc2.weight", prefix + "fc2.bias"};
}

std::vector<std::string> joined(std::vector<std::vector<std::string>> parts) {
  std::vector<std::string> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// Every tensor of `b` equals the same-named one of `a`, bit for bit.
void check_same_values(const tg::StateDict& a, const tg::StateDict& b) {
  REQUIRE(keys_of(a) == keys_of(b));
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].first);
    CHECK(a[i].second.to_vector() == b[i].second.to_vector());
  }
}

// gradcheck of `forward` with respect to `inputs` and to the module's
// parameters, listed in `params` (all of them: checked). Each parameter is
// first set to N(0,1) / 2 so that zero-initialised ones get a real test; the
// check then hands its perturbed copies to the module through the references.
void expect_module_gradcheck(const nn::Module& module, const std::vector<tg::Tensor*>& params,
                             const std::vector<tg::Tensor>& inputs,
                             const std::function<tg::Tensor(const std::vector<tg::Tensor>&)>& forward) {
  REQUIRE(params.size() == module.parameters().size());
  std::vector<tg::Tensor> all = inputs;
  for (tg::Tensor* p : params) all.push_back(tg::mul(randn64(p->shape(), false), 0.5).requires_grad_());
  expect_gradcheck(
      [&](const std::vector<tg::Tensor>& t) {
        for (size_t i = 0; i < params.size(); ++i) *params[i] = t[inputs.size() + i];
        return forward(std::vector<tg::Tensor>(t.begin(), t.begin() + static_cast<int64_t>(inputs.size())));
      },
      all);
}

const tg::RegionAttentionConfig kTinyAttention{4, 2, 3};  // C = 4, H = 2, M = 3

// A float64 attention module of kTinyAttention and an input with mixed edit and attention masks.
struct AttentionCase {
  explicit AttentionCase(double dropout) : attn(kTinyAttention, dropout, tg::AttentionImpl::Decomposed, kF64) {}
  nn::RegionAwareSelfAttention attn;
  tg::Tensor x = randn64({2, 3, 4}, false);
  tg::Tensor e = tg::from_vector({1, 0, 1, 0, 0, 1}, {2, 3}, kF64);
  tg::Tensor a = tg::from_vector({1, 1, 0, 1, 1, 1}, {2, 3}, kF64);
};

}  // namespace

// ---- Module

TEST_CASE("module/named_parameters and state_dict use dotted names in registration order") {
  Net net;
  const auto blocks = joined({mlp_names("blocks.0."), mlp_names("blocks.1.")});
  CHECK(keys_of(net.named_parameters()) == joined({{"scale"}, blocks, {"head.weight"}}));
  CHECK(keys_of(net.state_dict()) == joined({{"scale", "count"}, blocks, {"head.weight"}}));
  CHECK(keys_of(net.named_buffers()) == std::vector<std::string>{"count"});
  const auto params = net.parameters();
  const auto named = net.named_parameters();
  REQUIRE(params.size() == named.size());
  for (size_t i = 0; i < params.size(); ++i) {
    CHECK(params[i].impl() == named[i].second.impl());
    CHECK(params[i].requires_grad());
    CHECK(params[i].is_leaf());
  }
  CHECK_FALSE(net.count.requires_grad());
  CHECK(net.head->bias.defined() == false);
  CHECK(net.blocks->size() == 2);
  CHECK(net.named_children().size() == 2);
}

TEST_CASE("module/a DiT block's parameters have the reference names and shapes") {
  nn::ModuleList<nn::DiTBlock> blocks;
  blocks.push_back(std::make_shared<nn::DiTBlock>(kTinyAttention, 2.0));
  // As in PyTorch, a module's own parameters come before its submodules'.
  std::vector<std::pair<std::string, tg::Shape>> expected = {
      {"0.attn.edit_region_bias", {2, 3, 3}}, {"0.attn.within_edit_bias", {2, 1, 1}},
      {"0.attn.cross_edit_bias", {2, 1, 1}},  {"0.attn.qkv.weight", {12, 4}},
      {"0.attn.qkv.bias", {12}},              {"0.attn.out.weight", {4, 4}},
      {"0.attn.out.bias", {4}},               {"0.mlp.fc1.weight", {8, 4}},
      {"0.mlp.fc1.bias", {8}},                {"0.mlp.fc2.weight", {4, 8}},
      {"0.mlp.fc2.bias", {4}},                {"0.adaLN_modulation.weight", {24, 4}},
      {"0.adaLN_modulation.bias", {24}}};
  const auto named = blocks.named_parameters();
  REQUIRE(named.size() == expected.size());
  for (size_t i = 0; i < named.size(); ++i) {
    CHECK(named[i].first == expected[i].first);
    CHECK(named[i].second.shape() == expected[i].second);
  }
}

TEST_CASE("module/registration errors") {
  nn::Module m;
  m.register_parameter("w", tg::zeros({2}));
  CHECK(error_of([&] { m.register_parameter("", tg::zeros({1})); }) ==
        "register_parameter: name '' must be non-empty and hold no '.'");
  CHECK(error_of([&] { m.register_buffer("a.b", tg::zeros({1})); }) ==
        "register_buffer: name 'a.b' must be non-empty and hold no '.'");
  CHECK(error_of([&] { m.register_buffer("w", tg::zeros({1})); }) == "register_buffer: name 'w' is already registered");
  CHECK(error_of([&] { m.register_module("w", std::make_shared<nn::Module>()); }) ==
        "register_module: name 'w' is already registered");
  CHECK(error_of([&] { m.register_module("child", std::shared_ptr<nn::Module>()); }) ==
        "register_module: module 'child' is null");
  const tg::Tensor leaf = tg::ones({3}).requires_grad_();
  CHECK(error_of([&] { m.register_parameter("v", tg::mul(leaf, 2.0)); }) ==
        "register_parameter: 'v' [3] is the output of an op, not a leaf; pass detach() of it");
  // A cycle would make every walk of the tree endless.
  auto a = std::make_shared<nn::Module>(), b = std::make_shared<nn::Module>();
  a->register_module("b", b);
  CHECK(error_of([&] { b->register_module("a", a); }) == "register_module: module 'a' is this module or contains it (a cycle)");
  CHECK(error_of([&] { a->register_module("self", a); }) ==
        "register_module: module 'self' is this module or contains it (a cycle)");
  nn::ModuleList<nn::Module> list;
  list.push_back(std::make_shared<nn::Module>());
  CHECK(error_of([&] { list[1]; }) == "ModuleList: index 1 is out of range for a list of 1 modules");
}

// Tied weights (one tensor in two slots) and a submodule shared by two parents:
// parameters() lists each tensor once, under its first name, as PyTorch does,
// so an optimizer takes them and clipping counts each gradient once;
// state_dict() keeps every name; to() keeps the tie.
TEST_CASE("module/a shared parameter or submodule is one parameter") {
  struct Tied : nn::Module {
    tg::Tensor& in = register_parameter("in", tg::from_vector({3, 4}, {2}));
    tg::Tensor& out = register_parameter("out", in);
    std::shared_ptr<nn::Linear> first = register_module("first", std::make_shared<nn::Linear>(2, 2));
    std::shared_ptr<nn::Linear> second = register_module("second", first);
  } m;
  CHECK(keys_of(m.named_parameters()) == std::vector<std::string>{"in", "first.weight", "first.bias"});
  CHECK(m.parameters().size() == 3);
  CHECK(keys_of(m.state_dict()) ==
        std::vector<std::string>{"in", "out", "first.weight", "first.bias", "second.weight", "second.bias"});
  tg::optim::AdamW optimizer(m.parameters(), {.lr = 1e-3});  // refuses a tensor listed twice
  m.zero_grad();
  tg::sum(tg::mul(m.in, m.out)).backward();  // d/d in of in . in = 2 in = (6, 8): norm 10
  CHECK(tg::nn::utils::clip_grad_norm_(m.parameters(), 5.0) == doctest::Approx(10.0).epsilon(1e-12));
  const std::vector<double> clipped = m.in.grad().to_vector();
  CHECK(clipped[0] == doctest::Approx(3.0).epsilon(1e-6));  // scaled once, not twice
  CHECK(clipped[1] == doctest::Approx(4.0).epsilon(1e-6));
  m.to(tg::Device::CPU);
  CHECK(m.in.impl() == m.out.impl());
}

TEST_CASE("module/train and eval reach every submodule") {
  Net net;
  CHECK(net.is_training());
  net.eval();
  CHECK_FALSE(net.is_training());
  CHECK_FALSE(net.blocks->is_training());
  CHECK_FALSE((*net.blocks)[1]->fc2->is_training());
  net.train();
  CHECK((*net.blocks)[1]->fc2->is_training());
}

TEST_CASE("module/zero_grad drops every parameter's gradient") {
  Net net;
  const tg::Tensor x = tg::randn({2, 3});
  tg::sum(net.head->forward((*net.blocks)[0]->forward(x))).backward();
  CHECK(net.head->weight.grad().defined());
  CHECK((*net.blocks)[0]->fc1->weight.grad().defined());
  net.zero_grad();
  for (const tg::Tensor& p : net.parameters()) CHECK_FALSE(p.grad().defined());
}

TEST_CASE("module/to the device a module is on keeps every tensor") {
  Net net;
  const auto before = net.parameters();
  net.to(tg::Device::CPU);
  const auto after = net.parameters();
  for (size_t i = 0; i < before.size(); ++i) CHECK(before[i].impl() == after[i].impl());
}

TEST_CASE("module/to(CUDA) moves parameters, buffers and gradients, keeping names" *
          doctest::skip(!tg::cuda::is_available())) {
  Net net;
  tg::sum(net.head->forward(tg::randn({2, 3}))).backward();
  const auto values = net.state_dict();
  const std::vector<double> grad = net.head->weight.grad().to_vector();
  net.to(tg::Device::CUDA);
  check_same_values(values, net.state_dict());
  for (const auto& [name, t] : net.state_dict()) CHECK(t.is_cuda());
  for (const tg::Tensor& p : net.parameters()) CHECK(p.requires_grad());
  CHECK_FALSE(net.count.requires_grad());
  CHECK(net.head->weight.grad().is_cuda());
  CHECK(net.head->weight.grad().to_vector() == grad);
  CHECK(net.head->forward(tg::randn({2, 3}).cuda()).is_cuda());  // the layer sees the moved weight
}

TEST_CASE("module/load_state_dict copies values in without recording") {
  tg::manual_seed(1);
  Net a;
  tg::manual_seed(2);
  Net b;
  {
    tg::NoGradGuard no_grad;
    a.count.fill_(7);
  }
  b.load_state_dict(a.state_dict());
  check_same_values(a.state_dict(), b.state_dict());
  for (const tg::Tensor& p : b.parameters()) {
    CHECK(p.is_leaf());
    CHECK(p.requires_grad());
  }
  CHECK_FALSE(b.head->weight.same_storage(a.head->weight));  // copied, not shared
  // state_dict entries are detached views of the live tensors
  const auto state = a.state_dict();
  CHECK_FALSE(state[0].second.requires_grad());
  CHECK(state[0].second.same_storage(a.scale));
}

TEST_CASE("module/load_state_dict errors name the keys and shapes") {
  Net net;
  const tg::StateDict good = net.state_dict();
  tg::StateDict missing(good.begin() + 1, good.end());
  CHECK(error_of([&] { net.load_state_dict(missing); }) == "load_state_dict: missing key(s) 'scale'");
  tg::StateDict extra = good;
  extra.emplace_back("head.bias", tg::zeros({2}));
  extra.emplace_back("zz", tg::zeros({1}));
  CHECK(error_of([&] { net.load_state_dict(extra); }) == "load_state_dict: unexpected key(s) 'head.bias', 'zz'");
  missing.emplace_back("zz", tg::zeros({1}));
  CHECK(error_of([&] { net.load_state_dict(missing); }) ==
        "load_state_dict: missing key(s) 'scale'; unexpected key(s) 'zz'");
  tg::StateDict twice = good;
  twice.push_back(good[0]);
  CHECK(error_of([&] { net.load_state_dict(twice); }) == "load_state_dict: key 'scale' appears twice");
  tg::StateDict undefined = good;
  undefined[1].second = tg::Tensor();
  CHECK(error_of([&] { net.load_state_dict(undefined); }) == "load_state_dict: 'count' is an undefined tensor");

  // Shapes and dtypes: the module's side first. Nothing is copied on error.
  tg::StateDict wrong_shape = good;
  wrong_shape[0].second = tg::full({1}, 5.0);
  wrong_shape.back().second = tg::zeros({3, 2});
  CHECK(error_of([&] { net.load_state_dict(wrong_shape); }) ==
        "load_state_dict: 'head.weight' has shape [2,3] in the module but [3,2] in the state_dict");
  CHECK(net.scale.item() == 1.0);
  tg::StateDict wrong_dtype = good;
  wrong_dtype[0].second = tg::ones({1}, kF64);
  CHECK(error_of([&] { net.load_state_dict(wrong_dtype); }) ==
        "load_state_dict: 'scale' is float32 in the module but float64 in the state_dict");
  CHECK(error_of([&] { net.load_state_dict(wrong_shape, false); }) ==
        "load_state_dict: 'head.weight' has shape [2,3] in the module but [3,2] in the state_dict");
}

TEST_CASE("module/load_state_dict with strict = false loads what matches and returns the keys it left out") {
  Net net;
  const auto left_out = net.load_state_dict({{"scale", tg::full({1}, 3.0)}, {"unknown", tg::zeros({4})}}, false);
  CHECK(net.scale.item() == 3.0);
  CHECK(left_out.unexpected == std::vector<std::string>{"unknown"});
  std::vector<std::string> missing = keys_of(net.state_dict());
  missing.erase(missing.begin());  // all but scale
  CHECK(left_out.missing == missing);
  CHECK(net.load_state_dict(net.state_dict()).missing.empty());
}

// ---- layers

TEST_CASE("module/Linear: shapes, PyTorch's init bounds, values and gradcheck") {
  tg::manual_seed(3);
  nn::Linear lin(5, 3);
  CHECK(lin.weight.shape() == tg::Shape{3, 5});
  CHECK(lin.bias.shape() == tg::Shape{3});
  const double bound = 1 / std::sqrt(5.0);
  double spread = 0;
  for (double w : lin.weight.to_vector()) {
    CHECK(std::abs(w) <= bound);
    spread = std::max(spread, std::abs(w));
  }
  CHECK(spread > bound / 2);  // drawn over the range, not a constant
  const tg::Tensor x = tg::randn({2, 4, 5});
  CHECK(lin.forward(x).shape() == tg::Shape{2, 4, 3});
  CHECK(max_abs_diff(lin.forward(x), tg::linear(x, lin.weight, lin.bias)) == 0.0);
  CHECK(nn::Linear(5, 3, false).parameters().size() == 1);
  CHECK(error_of([] { nn::Linear(0, 3); }) == "Linear: in_features 0 and out_features 3 must be positive");

  nn::Linear lin64(3, 2, true, kF64);
  expect_module_gradcheck(lin64, {&lin64.weight, &lin64.bias}, {randn64({2, 3})},
                          [&](const auto& in) { return lin64.forward(in[0]); });
}

TEST_CASE("module/LayerNorm: affine and not, errors and gradcheck") {
  nn::LayerNorm ln(4);
  CHECK(ln.weight.to_vector() == std::vector<double>(4, 1.0));
  CHECK(ln.bias.to_vector() == std::vector<double>(4, 0.0));
  CHECK(nn::LayerNorm(4, 1e-6, false).parameters().empty());
  const tg::Tensor x = tg::randn({2, 4});
  CHECK(max_abs_diff(ln.forward(x), tg::layer_norm(x)) == 0.0);
  CHECK(error_of([&] { ln.forward(tg::zeros({2, 3})); }) == "LayerNorm: x must end in dim 4, got [2,3]");

  nn::LayerNorm ln64(4, 1e-5, true, kF64);
  expect_module_gradcheck(ln64, {&ln64.weight, &ln64.bias}, {randn64({3, 4})},
                          [&](const auto& in) { return ln64.forward(in[0]); });
  nn::LayerNorm plain64(4, 1e-5, false, kF64);
  expect_module_gradcheck(plain64, {}, {randn64({3, 4})}, [&](const auto& in) { return plain64.forward(in[0]); });
}

TEST_CASE("module/MLP is fc2(act(fc1(x))) and passes gradcheck") {
  nn::MLP gelu_mlp(3, 5, 2);
  nn::MLP silu_mlp(3, 5, 2, nn::Activation::SiLU);
  const tg::Tensor x = tg::randn({4, 3});
  CHECK(max_abs_diff(gelu_mlp.forward(x), gelu_mlp.fc2->forward(tg::gelu(gelu_mlp.fc1->forward(x)))) == 0.0);
  CHECK(max_abs_diff(silu_mlp.forward(x), silu_mlp.fc2->forward(tg::silu(silu_mlp.fc1->forward(x)))) == 0.0);

  nn::MLP mlp64(3, 4, 2, nn::Activation::GELU, kF64);
  expect_module_gradcheck(mlp64, {&mlp64.fc1->weight, &mlp64.fc1->bias, &mlp64.fc2->weight, &mlp64.fc2->bias},
                          {randn64({2, 3})}, [&](const auto& in) { return mlp64.forward(in[0]); });
}

TEST_CASE("module/patchify cuts row-major patches in (channel, row, column) order; unpatchify inverts it") {
  // image[b, c, y, x] = 100 c + 10 y + x on a 2x2 grid of 2x2 patches
  std::vector<double> v;
  for (int c = 0; c < 2; ++c)
    for (int y = 0; y < 4; ++y)
      for (int x = 0; x < 4; ++x) v.push_back(100 * c + 10 * y + x);
  const tg::Tensor images = tg::from_vector(v, {1, 2, 4, 4});
  const tg::Tensor patches = nn::patchify(images, 2);
  REQUIRE(patches.shape() == tg::Shape{1, 4, 8});
  // patch 1 is grid row 0, column 1: rows 0-1, columns 2-3
  CHECK(patches.narrow(1, 1, 1).to_vector() == std::vector<double>{2, 3, 12, 13, 102, 103, 112, 113});
  // patch 2 is grid row 1, column 0
  CHECK(patches.narrow(1, 2, 1).to_vector() == std::vector<double>{20, 21, 30, 31, 120, 121, 130, 131});
  CHECK(nn::unpatchify(patches, 2, 2, 2).to_vector() == v);

  CHECK(error_of([&] { nn::patchify(tg::zeros({1, 3, 4, 5}), 2); }) ==
        "patchify: images must be [B,C,H,W] with H and W multiples of patch_size 2, got [1,3,4,5]");
  CHECK(error_of([&] { nn::unpatchify(patches, 2, 3, 2); }) ==
        "unpatchify: patches must be [B,6,C*4] for a 3x2 grid of 2x2 patches, got [1,4,8]");
}

TEST_CASE("module/PatchEmbed is a Linear on the patches, and passes gradcheck") {
  nn::PatchEmbed embed(2, 3, 5);
  const tg::Tensor images = tg::randn({2, 3, 4, 6});
  const tg::Tensor tokens = embed.forward(images);
  CHECK(tokens.shape() == tg::Shape{2, 6, 5});
  CHECK(max_abs_diff(tokens, embed.proj->forward(nn::patchify(images, 2))) == 0.0);
  CHECK(max_abs_diff(embed.forward_patches(nn::patchify(images, 2)), tokens) == 0.0);
  CHECK(error_of([&] { embed.forward(tg::zeros({2, 1, 4, 4})); }) == "PatchEmbed: images must be [B,3,H,W], got [2,1,4,4]");
  CHECK(error_of([&] { embed.forward_patches(tg::zeros({2, 4, 11})); }) ==
        "PatchEmbed: patches must be [B,N,12], got [2,4,11]");

  nn::PatchEmbed embed64(2, 2, 3, kF64);
  expect_module_gradcheck(embed64, {&embed64.proj->weight, &embed64.proj->bias}, {randn64({1, 2, 4, 2})},
                          [&](const auto& in) { return embed64.forward(in[0]); });
}

TEST_CASE("module/timestep_features are DiT's cos | sin features") {
  const std::vector<double> times = {0.0, 1.5, 10.0};
  const tg::Tensor t = tg::from_vector(times, {3}, kF64);
  const tg::Tensor f = nn::timestep_features(t, 7);  // half = 3, one zero column
  REQUIRE(f.shape() == tg::Shape{3, 7});
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t i = 0; i < 3; ++i) {
      const double freq = std::pow(10000.0, -i / 3.0);
      CHECK(f.at({b, i}) == doctest::Approx(std::cos(times[b] * freq)).epsilon(1e-14));
      CHECK(f.at({b, 3 + i}) == doctest::Approx(std::sin(times[b] * freq)).epsilon(1e-14));
    }
  for (int64_t b = 0; b < 3; ++b) CHECK(f.at({b, 6}) == 0.0);
  CHECK(nn::timestep_features(tg::zeros({2}), 4).dtype() == tg::DType::Float32);
  CHECK(error_of([] { nn::timestep_features(tg::zeros({2}).requires_grad_(), 4); }) ==
        "timestep_features: t [2] requires grad, but the features are computed from its values and pass no "
        "gradient back");
  CHECK(error_of([] { nn::timestep_features(tg::zeros({2, 1}), 4); }) == "timestep_features: t must be [B], got [2,1]");
}

TEST_CASE("module/TimestepEmbedding: shapes and gradcheck") {
  nn::TimestepEmbedding embed(6, 8);
  CHECK(embed.forward(tg::from_vector({1, 500}, {2})).shape() == tg::Shape{2, 6});
  CHECK(embed.mlp->activation == nn::Activation::SiLU);

  nn::TimestepEmbedding embed64(3, 4, kF64);
  const tg::Tensor t = tg::from_vector({0.5, 20}, {2}, kF64);
  const auto& mlp = *embed64.mlp;
  expect_module_gradcheck(embed64, {&mlp.fc1->weight, &mlp.fc1->bias, &mlp.fc2->weight, &mlp.fc2->bias}, {},
                          [&](const auto&) { return embed64.forward(t); });
}

TEST_CASE("module/RegionAwareSelfAttention is the functional layer with its parameters") {
  tg::manual_seed(4);
  AttentionCase c(0.3);
  auto& [attn, x, e, a] = c;

  // train(): dropout p = 0.3 drawn from the generator, as the functional form draws it
  const tg::PhiloxState rng = tg::default_generator().state();
  const tg::Tensor y_train = attn.forward(x, e, a);
  tg::default_generator().set_state(rng);
  CHECK(max_abs_diff(y_train, tg::region_attention(x, e, a, attn.params(), {0.3})) == 0.0);
  CHECK(max_abs_diff(y_train, tg::region_attention(x, e, a, attn.params())) > 0.0);
  // eval(): no dropout
  attn.eval();
  CHECK(max_abs_diff(attn.forward(x, e, a), tg::region_attention(x, e, a, attn.params())) == 0.0);

  CHECK(error_of([] { nn::RegionAwareSelfAttention({4, 3, 3}); }) ==
        "RegionAwareSelfAttention: hidden 4 must be a positive multiple of heads 3, and max_positions 3 positive");
  CHECK(error_of([] { nn::RegionAwareSelfAttention(kTinyAttention, 1.0); }) ==
        "RegionAwareSelfAttention: dropout must be in [0, 1 - 2^-16] as a float (dropout draws 16 bits), got 1");
}

TEST_CASE("module/RegionAwareSelfAttention runs the fused core when impl = Fused") {
  tg::manual_seed(7);
  AttentionCase c(0.0);
  auto& [attn, x, e, a] = c;
  const tg::Tensor decomposed = attn.forward(x, e, a);
  attn.impl = tg::AttentionImpl::Fused;
  const tg::Tensor fused = attn.forward(x, e, a);
  // out.forward's input comes from the one fused node (the qkv projection
  // included) instead of the decomposed graph's reshape
  CHECK(tg::autograd::node_name(*fused.grad_fn()->edges[0].node) == "fused_qkv_attention");
  CHECK(tg::autograd::node_name(*decomposed.grad_fn()->edges[0].node) != "fused_qkv_attention");
  CHECK(max_abs_diff(fused, decomposed) < 1e-12);
}

TEST_CASE("module/RegionAwareSelfAttention gradcheck") {
  tg::manual_seed(5);
  nn::RegionAwareSelfAttention attn(kTinyAttention, 0.0, tg::AttentionImpl::Decomposed, kF64);
  const tg::Tensor e = tg::from_vector({1, 0, 1, 1, 1, 0}, {2, 3}, kF64);
  const tg::Tensor a = tg::from_vector({1, 0, 1, 1, 1, 1}, {2, 3}, kF64);
  expect_module_gradcheck(attn,
                          {&attn.qkv->weight, &attn.qkv->bias, &attn.out->weight, &attn.out->bias,
                           &attn.edit_region_bias, &attn.within_edit_bias, &attn.cross_edit_bias},
                          {randn64({2, 3, 4})}, [&](const auto& in) { return attn.forward(in[0], e, a); });
}

TEST_CASE("module/a new DiTBlock is the identity (adaLN-Zero)") {
  nn::DiTBlock block(kTinyAttention);
  const tg::Tensor x = tg::randn({2, 3, 4}), c = tg::randn({2, 4});
  const tg::Tensor m = tg::ones({2, 3});
  CHECK(max_abs_diff(block.forward(x, c, m, m), x) == 0.0);
  CHECK(error_of([&] { block.forward(x, tg::zeros({2, 5}), m, m); }) ==
        "DiTBlock: c must be [2,4] for x [2,3,4], got [2,5]");
  CHECK(error_of([&] { block.forward(tg::zeros({2, 3, 5}), c, m, m); }) == "DiTBlock: x must be [B,S,4], got [2,3,5]");
  // The MLP's width hidden * mlp_ratio must be a usable size (1e300 overflowed the cast to int64).
  CHECK(error_of([] { nn::DiTBlock(kTinyAttention, 0.1); }) ==
        "DiTBlock: mlp_ratio 0.1 gives an MLP width of 0.4 for hidden 4; it must be at least 1 and below 2^31");
  CHECK(error_of([] { nn::DiTBlock(kTinyAttention, 1e300); }) ==
        "DiTBlock: mlp_ratio 1e+300 gives an MLP width of 4e+300 for hidden 4; it must be at least 1 and below 2^31");
}

TEST_CASE("module/DiTBlock gradcheck") {
  tg::manual_seed(6);
  nn::DiTBlock block(kTinyAttention, 2.0, 0.0, tg::AttentionImpl::Decomposed, kF64);
  const auto& at = *block.attn;
  const auto& mlp = *block.mlp;
  const tg::Tensor e = tg::from_vector({0, 1, 1, 1, 0, 0}, {2, 3}, kF64);
  const tg::Tensor a = tg::ones({2, 3}, kF64);
  expect_module_gradcheck(
      block,
      {&at.qkv->weight, &at.qkv->bias, &at.out->weight, &at.out->bias, &block.attn->edit_region_bias,
       &block.attn->within_edit_bias, &block.attn->cross_edit_bias, &mlp.fc1->weight, &mlp.fc1->bias,
       &mlp.fc2->weight, &mlp.fc2->bias, &block.adaLN_modulation->weight, &block.adaLN_modulation->bias},
      {randn64({2, 3, 4}), randn64({2, 4})}, [&](const auto& in) { return block.forward(in[0], in[1], e, a); });
}

TEST_CASE("module/Embedding picks rows of its table, and the gradient lands on those rows") {
  tg::manual_seed(7);
  nn::Embedding embedding(4, 3, kF64);
  REQUIRE(embedding.weight.shape() == tg::Shape{4, 3});
  const tg::Tensor rows = embedding.forward({2, 0, 2});
  REQUIRE(rows.shape() == tg::Shape{3, 3});
  for (int64_t j = 0; j < 3; ++j) {
    CHECK(rows.at({0, j}) == embedding.weight.at({2, j}));
    CHECK(rows.at({1, j}) == embedding.weight.at({0, j}));
    CHECK(rows.at({2, j}) == embedding.weight.at({2, j}));
  }
  tg::sum(rows).backward();
  CHECK(embedding.weight.grad().to_vector() == std::vector<double>{1, 1, 1, 0, 0, 0, 2, 2, 2, 0, 0, 0});
  CHECK(error_of([&] { embedding.forward({1, 4}); }) == "Embedding: index 1 is 4, outside the table's [0, 4)");
  CHECK(error_of([&] { embedding.forward({}); }) == "Embedding: got no indices");
  CHECK(error_of([] { nn::Embedding(0, 3); }) == "Embedding: num_embeddings 0 and embedding_dim 3 must be positive");
}

TEST_CASE("module/a new FinalLayer outputs zero (adaLN-Zero); names, errors and gradcheck") {
  nn::FinalLayer fresh(4, 5);
  const tg::Tensor x = tg::randn({2, 3, 4}), c = tg::randn({2, 4});
  CHECK(max_abs_diff(fresh.forward(x, c), tg::zeros({2, 3, 5})) == 0.0);
  CHECK(keys_of(fresh.named_parameters()) ==
        std::vector<std::string>{"linear.weight", "linear.bias", "adaLN_modulation.weight", "adaLN_modulation.bias"});
  CHECK(error_of([&] { fresh.forward(x, tg::zeros({2, 5})); }) ==
        "FinalLayer: c must be [2,4] for x [2,3,4], got [2,5]");

  tg::manual_seed(8);
  nn::FinalLayer layer(4, 5, kF64);
  expect_module_gradcheck(
      layer, {&layer.linear->weight, &layer.linear->bias, &layer.adaLN_modulation->weight, &layer.adaLN_modulation->bias},
      {randn64({2, 3, 4}), randn64({2, 4})}, [&](const auto& in) { return layer.forward(in[0], in[1]); });
}
