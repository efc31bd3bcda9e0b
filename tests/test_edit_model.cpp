// toy/: the toy edit-diffusion task (models/edit_data.h) and model
// (models/edit_model.h): the data's determinism and meaning, the model's
// names and start, a tiny model learning, exact resume, the sampler, the
// held-out metric and its baselines, and the errors.
#include <algorithm>
#include <numeric>
#include <set>

#include "helpers.h"

using namespace tgtest;
namespace toy = tg::toy;

namespace {

// Small enough for a few dozen steps here and under ASan (head dim 32, so decomposed attention).
const toy::EditModelConfig kTiny{.hidden = 64, .heads = 2, .depth = 1};

// The patch (row-major in the 8x8 grid) that holds pixel (x, y).
int64_t patch_of(int64_t x, int64_t y) { return (y / toy::kPatchSize) * toy::kGridSize + x / toy::kPatchSize; }

// Value (b, c, y, x) of a [B,3,32,32] batch held as a flat vector.
double pixel(const std::vector<double>& images, int64_t b, int64_t c, int64_t y, int64_t x) {
  return images[((b * 3 + c) * toy::kImageSize + y) * toy::kImageSize + x];
}

// The tiny run: kSteps steps of kBatch edits, peak learning rate kLr.
constexpr int64_t kSteps = 80, kBatch = 16;
constexpr double kLr = 1e-2;

tg::optim::AdamW make_optimizer(const toy::EditDiT& model) {
  return tg::optim::AdamW(model.parameters(), {.lr = kLr, .weight_decay = 0.0});
}

// Training steps [first, last) of kBatch edits each from the stream of seed 5, as
// the demo runs them (cosine schedule, clipping); returns their losses.
std::vector<double> train_steps(toy::EditDiT& model, tg::optim::Optimizer& optimizer, int64_t first, int64_t last) {
  const tg::optim::CosineSchedule schedule(kLr, kSteps / 10, kSteps, kLr / 10);
  std::vector<double> losses;
  for (int64_t step = first; step < last; ++step) {
    optimizer.set_lr(schedule.lr(step));
    losses.push_back(toy::train_step(model, optimizer, toy::make_edit_batch(5, step * kBatch, kBatch)).loss);
  }
  return losses;
}

// A tiny model whose velocity is not zero (a new one's final layer is).
toy::EditDiT& with_random_output(toy::EditDiT& model) {
  tg::NoGradGuard no_grad;
  tg::Tensor& weight = model.final_layer->linear->weight;
  weight.copy_(tg::mul(tg::randn(weight.shape()), 0.5));
  return model;
}

}  // namespace

TEST_CASE("toy/edit batches are a pure function of (seed, index), with the documented shapes") {
  const toy::EditBatch batch = toy::make_edit_batch(7, 10, 4);
  CHECK(batch.source.shape() == tg::Shape{4, 3, 32, 32});
  CHECK(batch.target.shape() == tg::Shape{4, 3, 32, 32});
  CHECK(batch.edit_mask.shape() == tg::Shape{4, 64});
  CHECK(batch.colour.size() == 4);
  CHECK(batch.shape_kind.size() == 4);
  const std::vector<double> source = batch.source.to_vector();
  const auto [lowest, highest] = std::minmax_element(source.begin(), source.end());
  CHECK(*lowest >= -1.0);
  CHECK(*highest <= 1.0);

  const toy::EditBatch again = toy::make_edit_batch(7, 10, 4);
  CHECK(again.source.to_vector() == source);
  CHECK(again.target.to_vector() == batch.target.to_vector());
  CHECK(again.edit_mask.to_vector() == batch.edit_mask.to_vector());
  CHECK(again.colour == batch.colour);

  const toy::EditBatch third = toy::make_edit_batch(7, 12, 1);  // example 12 alone
  CHECK(third.source.to_vector() == batch.source.narrow(0, 2, 1).to_vector());
  CHECK(third.target.to_vector() == batch.target.narrow(0, 2, 1).to_vector());
  CHECK(third.colour.front() == batch.colour[2]);
  CHECK(toy::make_edit_batch(8, 10, 4).source.to_vector() != source);
}

TEST_CASE("toy/make_edit_batch known sums: a stream makes what it made before, float64 rounding to float32's") {
  const toy::EditBatch batch = toy::make_edit_batch(3, 5, 4);
  const auto weighted_sum = [](const tg::Tensor& t) {  // each element weighted by its position, so a permutation shows
    const std::vector<double> v = t.to_vector();
    double s = 0;
    for (size_t i = 0; i < v.size(); ++i) s += v[i] * static_cast<double>(i % 97 + 1);
    return s;
  };
  CHECK(weighted_sum(batch.source) == doctest::Approx(-254343.52955052257).epsilon(1e-15));
  CHECK(weighted_sum(batch.target) == doctest::Approx(-269538.62813800573).epsilon(1e-15));
  CHECK(weighted_sum(batch.edit_mask) == 2122);
  const toy::EditBatch wide = toy::make_edit_batch(3, 5, 4, {tg::DType::Float64});
  CHECK(wide.source.to(tg::DType::Float32).to_vector() == batch.source.to_vector());
  CHECK(wide.target.to(tg::DType::Float32).to_vector() == batch.target.to_vector());
  CHECK(wide.edit_mask.to_vector() == batch.edit_mask.to_vector());
}

TEST_CASE("toy/the mask is the patches the shape touches; the target differs only there, in colour k") {
  constexpr int64_t n = 64;
  const toy::EditBatch batch = toy::make_edit_batch(3, 0, n);
  const std::vector<double> source = batch.source.to_vector(), target = batch.target.to_vector(),
                            mask = batch.edit_mask.to_vector();
  for (int64_t b = 0; b < n; ++b) {
    INFO("example " << b);
    const std::vector<double> k = toy::palette_colour(batch.colour[b]);
    std::vector<double> touched(toy::kTokens, 0.0);
    int64_t changed = 0, wrong_colour = 0;
    for (int64_t y = 0; y < toy::kImageSize; ++y)
      for (int64_t x = 0; x < toy::kImageSize; ++x) {
        bool differs = false;
        for (int64_t c = 0; c < 3; ++c) differs = differs || pixel(source, b, c, y, x) != pixel(target, b, c, y, x);
        if (!differs) continue;
        ++changed;
        touched[patch_of(x, y)] = 1.0;
        for (int64_t c = 0; c < 3; ++c) wrong_colour += pixel(target, b, c, y, x) != static_cast<float>(k[c]);
      }
    CHECK(changed >= 16);  // the smallest shape, a triangle of half-size 4, has more pixels
    CHECK(wrong_colour == 0);
    CHECK(touched == std::vector<double>(mask.begin() + b * toy::kTokens, mask.begin() + (b + 1) * toy::kTokens));
  }
  CHECK(std::set<toy::ShapeKind>(batch.shape_kind.begin(), batch.shape_kind.end()).size() == 3);
  CHECK(std::set<int64_t>(batch.colour.begin(), batch.colour.end()).size() == toy::kNumColours);
}

TEST_CASE("toy/normal_noise is N(0, 1) and a pure function of its Philox state") {
  const tg::Tensor noise = toy::normal_noise({100, 100}, {3, 1});
  CHECK(toy::normal_noise({100, 100}, {3, 1}).to_vector() == noise.to_vector());
  CHECK(toy::normal_noise({100, 100}, {3, 2}).to_vector() != noise.to_vector());
  const double mean = tg::mean(noise).item(), variance = tg::mean(noise * noise).item() - mean * mean;
  CHECK(std::abs(mean) < 0.03);  // 3 standard errors of 10^4 draws
  CHECK(std::abs(variance - 1) < 0.05);
}

TEST_CASE("toy/EditDiT has DiT's parameter names, and a new one predicts zero velocity") {
  tg::manual_seed(1);
  const toy::EditDiT model(kTiny);
  const std::map<std::string, tg::Tensor> params = tg::by_name("test", model.named_parameters());
  const std::vector<std::pair<std::string, tg::Shape>> expected = {
      {"x_embedder.proj.weight", {64, 96}},  // concat(x_t patch, source patch)
      {"t_embedder.mlp.fc1.weight", {64, 256}},
      {"y_embedder.weight", {6, 64}},
      {"blocks.0.attn.edit_region_bias", {2, 64, 64}},
      {"blocks.0.adaLN_modulation.weight", {384, 64}},
      {"final_layer.linear.weight", {48, 64}}};
  for (const auto& [name, shape] : expected) {
    INFO(name);
    REQUIRE(params.count(name) == 1);
    CHECK(params.at(name).shape() == shape);
  }
  const toy::EditBatch batch = toy::make_edit_batch(1, 0, 2);
  const tg::Tensor patches = tg::nn::patchify(batch.source, toy::kPatchSize);
  const tg::Tensor velocity = model.forward(patches, patches, tg::full({2}, 0.5), batch.colour, batch.edit_mask);
  CHECK(max_abs_diff(velocity, tg::zeros({2, 64, 48})) == 0.0);
}

TEST_CASE("toy/a tiny model's loss falls by at least half in 80 steps") {
  tg::manual_seed(2);
  toy::EditDiT model(kTiny);
  tg::optim::AdamW optimizer = make_optimizer(model);
  const std::vector<double> losses = train_steps(model, optimizer, 0, kSteps);
  const double first = std::accumulate(losses.begin(), losses.begin() + 5, 0.0) / 5;
  const double last = std::accumulate(losses.end() - 5, losses.end(), 0.0) / 5;
  MESSAGE("mean loss of the first 5 steps " << first << ", of the last 5 " << last);
  CHECK(last <= 0.5 * first);
}

TEST_CASE("toy/resuming from a checkpoint gives the uninterrupted run's losses, bit for bit") {
  tg::manual_seed(4);
  toy::EditDiT straight(kTiny);
  tg::optim::AdamW straight_optimizer = make_optimizer(straight);
  const std::vector<double> expected = train_steps(straight, straight_optimizer, 0, 8);

  tg::manual_seed(4);
  toy::EditDiT first(kTiny);
  tg::optim::AdamW first_optimizer = make_optimizer(first);
  std::vector<double> losses = train_steps(first, first_optimizer, 0, 4);
  const std::string path = temp_path("toy_resume.safetensors");
  tg::save_checkpoint(path, first, first_optimizer, 4);

  tg::manual_seed(5);  // another init and generator state, all of which the checkpoint replaces
  toy::EditDiT resumed(kTiny);
  tg::optim::AdamW resumed_optimizer = make_optimizer(resumed);
  const int64_t step = tg::load_checkpoint(path, resumed, resumed_optimizer);
  REQUIRE(step == 4);
  const std::vector<double> rest = train_steps(resumed, resumed_optimizer, step, 8);
  losses.insert(losses.end(), rest.begin(), rest.end());
  CHECK(losses == expected);
}

TEST_CASE("toy/the sampler keeps every value outside the region the source's, bit for bit") {
  tg::manual_seed(6);
  toy::EditDiT model(kTiny);
  with_random_output(model);
  const toy::EditBatch batch = toy::make_edit_batch(2, 0, 3);
  const tg::Tensor noise = toy::normal_noise({3, 64, 48}, {9, 0});
  const tg::Tensor edited = toy::sample_edit(model, batch.source, batch.edit_mask, batch.colour, noise, 4);
  REQUIRE(edited.shape() == batch.source.shape());
  CHECK(toy::sample_edit(model, batch.source, batch.edit_mask, batch.colour, noise, 4).to_vector() ==
        edited.to_vector());
  const std::vector<double> out = tg::nn::patchify(edited, 4).to_vector(),
                            source = tg::nn::patchify(batch.source, 4).to_vector(), mask = batch.edit_mask.to_vector();
  int64_t outside_changed = 0, inside_changed = 0, non_finite = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const bool changed = out[i] != source[i];
    (mask[i / toy::kPatchDim] != 0 ? inside_changed : outside_changed) += changed;
    non_finite += !std::isfinite(out[i]);
  }
  CHECK(outside_changed == 0);
  CHECK(inside_changed > 0);
  CHECK(non_finite == 0);
}

TEST_CASE("toy/region_psnr scores only the region; the mean-colour baseline fills it with the target's mean") {
  const toy::EditBatch batch = toy::make_edit_batch(4, 0, 2);
  const tg::Tensor inside = tg::nn::unpatchify(batch.edit_mask.unsqueeze(2).expand({2, 64, 48}), 4, 8, 8);
  // Off by 0.1 inside the region and by 1 outside: PSNR = 10 log10(4 / 0.1^2).
  const tg::Tensor off = tg::add(batch.target, tg::add(tg::mul(inside, -0.9), 1.0));
  CHECK(toy::region_psnr(off, batch.target, batch.edit_mask) == doctest::Approx(10 * std::log10(400.0)).epsilon(1e-5));
  CHECK(std::isinf(toy::region_psnr(batch.target, batch.target, batch.edit_mask)));

  const std::vector<double> filled = toy::fill_with_target_mean(batch).to_vector(),
                            source = batch.source.to_vector(), target = batch.target.to_vector(),
                            mask = batch.edit_mask.to_vector();
  auto in_region = [&](int64_t b, int64_t y, int64_t x) { return mask[b * toy::kTokens + patch_of(x, y)] != 0; };
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t c = 0; c < 3; ++c) {
      double sum = 0, count = 0;
      for (int64_t y = 0; y < 32; ++y)
        for (int64_t x = 0; x < 32; ++x)
          if (in_region(b, y, x)) sum += pixel(target, b, c, y, x), ++count;
      int64_t wrong = 0;
      for (int64_t y = 0; y < 32; ++y)
        for (int64_t x = 0; x < 32; ++x)
          wrong += in_region(b, y, x) ? std::abs(pixel(filled, b, c, y, x) - sum / count) > 1e-5
                                      : pixel(filled, b, c, y, x) != pixel(source, b, c, y, x);
      CHECK(wrong == 0);
    }
}

TEST_CASE("toy/an example whose mask marks no token keeps its source; masks must be 0/1") {
  toy::EditBatch batch = toy::make_edit_batch(4, 0, 2);
  batch.edit_mask = tg::mul(batch.edit_mask, tg::from_vector({0, 1}, {2, 1}));  // example 0: no region
  const tg::Tensor filled = toy::fill_with_target_mean(batch);
  CHECK(filled.narrow(0, 0, 1).to_vector() == batch.source.narrow(0, 0, 1).to_vector());
  CHECK(filled.narrow(0, 1, 1).to_vector() == toy::fill_with_target_mean(toy::make_edit_batch(4, 1, 1)).to_vector());
  CHECK(std::isfinite(toy::region_psnr(filled, batch.target, batch.edit_mask)));
  toy::EditBatch half = batch;
  half.edit_mask = tg::mul(batch.edit_mask, 0.5);
  CHECK(contains(error_of([&] { toy::region_psnr(half.source, half.target, half.edit_mask); }),
                 "region_psnr: edit_mask"));
  CHECK(contains(error_of([&] { toy::fill_with_target_mean(half); }), "fill_with_target_mean: edit_mask"));
}

TEST_CASE("toy/evaluate scores the sampled edits and both baselines on the held-out batch") {
  tg::manual_seed(3);
  toy::EditDiT model(kTiny);
  with_random_output(model);
  const toy::EditBatch heldout = toy::make_edit_batch(11, 0, 4);
  const toy::HeldOutPsnr psnr = toy::evaluate(model, heldout, 12, 3);
  const tg::Tensor edited = toy::sample_edit(model, heldout.source, heldout.edit_mask, heldout.colour,
                                             toy::normal_noise({4, 64, 48}, {12, 0}), 3);
  CHECK(psnr.model == toy::region_psnr(edited, heldout.target, heldout.edit_mask));
  CHECK(psnr.copy_input == toy::region_psnr(heldout.source, heldout.target, heldout.edit_mask));
  CHECK(psnr.mean_colour == toy::region_psnr(toy::fill_with_target_mean(heldout), heldout.target, heldout.edit_mask));
  CHECK(psnr.mean_colour > psnr.copy_input);  // recolouring moves most region pixels by more than the mean's error
}

TEST_CASE("toy/errors name the function, the argument and the shapes") {
  CHECK(error_of([] { toy::make_edit_batch(1, 0, 0); }) ==
        "make_edit_batch: need first_index >= 0, count > 0 and first_index + count <= 2^63 - 1, got first_index 0 "
        "and count 0");
  CHECK(contains(error_of([] { toy::make_edit_batch(1, INT64_MAX, 2); }), "first_index + count <= 2^63 - 1"));
  CHECK(contains(error_of([] { toy::make_edit_batch(1, 0, int64_t{1} << 52); }), "make_edit_batch"));  // no overflow
  CHECK(error_of([] { toy::palette_colour(6); }) == "palette_colour: colour index must be in [0, 6), got 6");
  CHECK(error_of([] { toy::EditDiT({.hidden = 32, .heads = 2, .depth = 0}); }) ==
        "EditDiT: depth must be positive, got 0");

  tg::manual_seed(1);
  const toy::EditDiT model(kTiny);
  const toy::EditBatch batch = toy::make_edit_batch(1, 0, 2);
  const tg::Tensor x = tg::zeros({2, 64, 48}), t = tg::full({2}, 0.5), mask = batch.edit_mask;
  const std::vector<int64_t> k = batch.colour;
  CHECK(error_of([&] { model.forward(tg::zeros({64, 48}), x, t, k, mask); }) ==
        "EditDiT: noisy must be [B,64,48], got [64,48]");
  CHECK(error_of([&] { model.forward(tg::zeros({2, 64, 47}), x, t, k, mask); }) ==
        "EditDiT: noisy must be [2,64,48], got [2,64,47]");
  CHECK(error_of([&] { model.forward(x, tg::zeros({1, 64, 48}), t, k, mask); }) ==
        "EditDiT: source must be [2,64,48], got [1,64,48]");
  CHECK(error_of([&] { model.forward(x, x, tg::zeros({2, 1}), k, mask); }) == "EditDiT: t must be [2], got [2,1]");
  CHECK(error_of([&] { model.forward(x, x, t, {1}, mask); }) == "EditDiT: got 1 colours for 2 images");
  CHECK(error_of([&] { model.forward(x, x, t, k, tg::ones({2, 63})); }) ==
        "EditDiT: edit_mask must be [2,64], got [2,63]");

  CHECK(error_of([&] { toy::sample_edit(model, batch.source, mask, k, x, 0); }) ==
        "sample_edit: steps must be positive, got 0");
  CHECK(error_of([&] { toy::sample_edit(model, batch.source, mask, k, tg::zeros({2, 64}), 3); }) ==
        "sample_edit: noise must be [2,64,48], got [2,64]");
  CHECK(error_of([&] { toy::sample_edit(model, tg::zeros({3, 32, 32}), mask, k, x, 3); }) ==
        "sample_edit: source must be [B,3,32,32], got [3,32,32]");
  CHECK(error_of([&] { toy::region_psnr(batch.source, batch.target, tg::zeros({2, 64})); }) ==
        "region_psnr: the edit_mask [2,64] marks no token");
  CHECK(error_of([&] { toy::region_psnr(batch.source, tg::zeros({2, 3, 32, 31}), mask); }) ==
        "region_psnr: target must be [2,3,32,32], got [2,3,32,31]");
  toy::EditBatch short_of_colours = batch;
  short_of_colours.colour.pop_back();
  CHECK(error_of([&] { toy::flow_matching_loss(model, short_of_colours); }) ==
        "flow_matching_loss: got 1 colours for 2 images");
  CHECK(error_of([&] { toy::fill_with_target_mean(short_of_colours); }) ==
        "fill_with_target_mean: got 1 colours for 2 images");
}
