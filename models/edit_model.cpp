#include "models/edit_model.h"

#include <cmath>
#include <sstream>
#include <string>

#include "autograd/grad_mode.h"
#include "ops/binary_mask.h"
#include "ops/elementwise.h"
#include "ops/masked_fill.h"
#include "ops/reduce.h"
#include "ops/views.h"

namespace tg::toy {

namespace {

const Shape kImageShape{kChannels, kImageSize, kImageSize};

// t must be [B, item_shape...]; B < 0 when the batch size is not known yet.
void check_batch_of(const char* op, const char* arg, const Tensor& t, int64_t B, const Shape& item_shape) {
  check_defined(op, arg, t);
  Shape expected{B};
  expected.insert(expected.end(), item_shape.begin(), item_shape.end());
  if (t.shape() == expected) return;
  std::ostringstream described;
  described << "[" << (B < 0 ? std::string("B") : std::to_string(B));
  for (int64_t d : item_shape) described << "," << d;
  TG_FAIL(op, ": ", arg, " must be ", described.str(), "], got ", t.shape());
}

// The source images, edit mask and colours of one batch of B edits.
void check_edit_inputs(const char* op, const Tensor& source, const Tensor& edit_mask,
                       const std::vector<int64_t>& colour) {
  check_defined(op, "source", source);
  const int64_t B = source.dim() == 4 ? source.size(0) : -1;
  check_batch_of(op, "source", source, B, kImageShape);
  check_batch_of(op, "edit_mask", edit_mask, B, {kTokens});
  TG_CHECK(static_cast<int64_t>(colour.size()) == B, op, ": got ", colour.size(), " colours for ", B, " images");
}

// [B,N,P] and [B,N,P] -> [B,N,2P], copied as data (not on the tape).
Tensor concat_last_dim(const Tensor& a, const Tensor& b) {
  NoGradGuard no_grad;
  const int64_t P = a.size(2);
  Tensor out = empty({a.size(0), a.size(1), 2 * P}, {a.dtype(), a.device()});
  out.narrow(2, 0, P).copy_(a);
  out.narrow(2, P, P).copy_(b);
  return out;
}

// The mean of err^2 [B,64,48] over the tokens where edit_mask [B,64] is 1.
Tensor region_mse(const char* op, const Tensor& err, const Tensor& edit_mask) {
  const double count = sum(edit_mask).item() * kPatchDim;
  TG_CHECK(count > 0, op, ": the edit_mask ", edit_mask.shape(), " marks no token");
  return mul(sum(mul(edit_mask.unsqueeze(2), mul(err, err))), 1.0 / count);
}

Tensor patches_of(const Tensor& images) { return nn::patchify(images, kPatchSize); }
Tensor images_of(const Tensor& patches) { return nn::unpatchify(patches, kPatchSize, kGridSize, kGridSize); }

}  // namespace

// ---- EditDiT

EditDiT::EditDiT(const EditModelConfig& c, TensorOptions opts)
    : config(c),
      x_embedder(register_module("x_embedder", std::make_shared<nn::PatchEmbed>(kPatchSize, 2 * kChannels, c.hidden, opts))),
      t_embedder(register_module("t_embedder", std::make_shared<nn::TimestepEmbedding>(c.hidden, 256, opts))),
      y_embedder(register_module("y_embedder", std::make_shared<nn::Embedding>(kNumColours, c.hidden, opts))),
      blocks(register_module("blocks", std::make_shared<nn::ModuleList<nn::DiTBlock>>())),
      final_layer(register_module("final_layer", std::make_shared<nn::FinalLayer>(c.hidden, kPatchDim, opts))) {
  TG_CHECK(c.depth > 0, "EditDiT: depth must be positive, got ", c.depth);
  for (int64_t i = 0; i < c.depth; ++i)
    blocks->push_back(std::make_shared<nn::DiTBlock>(RegionAttentionConfig{c.hidden, c.heads, kTokens}, c.mlp_ratio,
                                                     0.0, c.attention, opts));
}

Tensor EditDiT::forward(const Tensor& noisy, const Tensor& source, const Tensor& t, const std::vector<int64_t>& colour,
                        const Tensor& edit_mask) const {
  check_defined("EditDiT", "noisy", noisy);
  const int64_t B = noisy.dim() == 3 ? noisy.size(0) : -1;
  check_batch_of("EditDiT", "noisy", noisy, B, {kTokens, kPatchDim});
  check_batch_of("EditDiT", "source", source, B, {kTokens, kPatchDim});
  check_batch_of("EditDiT", "t", t, B, {});
  check_batch_of("EditDiT", "edit_mask", edit_mask, B, {kTokens});
  TG_CHECK(static_cast<int64_t>(colour.size()) == B, "EditDiT: got ", colour.size(), " colours for ", B, " images");
  // Timesteps scaled to DiT's [0, 1000], where the sinusoidal features vary.
  const Tensor c = add(t_embedder->forward(mul(t, 1000.0)), y_embedder->forward(colour));
  const Tensor attn_mask = ones({B, kTokens}, {noisy.dtype(), noisy.device()});
  Tensor x = x_embedder->forward_patches(concat_last_dim(noisy, source));
  for (const auto& block : *blocks) x = block->forward(x, c, edit_mask, attn_mask);
  return final_layer->forward(x, c);
}

// ---- training

Tensor flow_matching_loss(const EditDiT& model, const EditBatch& batch) {
  check_edit_inputs("flow_matching_loss", batch.source, batch.edit_mask, batch.colour);
  check_batch_of("flow_matching_loss", "target", batch.target, batch.source.size(0), kImageShape);
  const TensorOptions opts{batch.source.dtype(), batch.source.device()};
  const int64_t B = batch.source.size(0);
  const Tensor x0 = patches_of(batch.target);
  const Tensor t = rand({B}, opts);
  const Tensor noise = randn(x0.shape(), opts);
  const Tensor velocity = sub(noise, x0);
  // x0 + t (noise - x0) = (1 - t) x0 + t noise inside the region; x0 outside.
  const Tensor noisy = add(x0, mul(mul(batch.edit_mask.unsqueeze(2), t.view({B, 1, 1})), velocity));
  const Tensor predicted = model.forward(noisy, patches_of(batch.source), t, batch.colour, batch.edit_mask);
  return region_mse("flow_matching_loss", sub(predicted, velocity), batch.edit_mask);
}

TrainStepResult train_step(EditDiT& model, optim::Optimizer& optimizer, const EditBatch& batch, double max_grad_norm) {
  optimizer.zero_grad();
  const Tensor loss = flow_matching_loss(model, batch);
  loss.backward();
  const double grad_norm = nn::utils::clip_grad_norm_(model.parameters(), max_grad_norm);
  TG_CHECK(std::isfinite(grad_norm), "train_step: the gradient norm is ", grad_norm, " (loss ", loss.item(), ")");
  optimizer.step();
  return {loss.item(), grad_norm};
}

// ---- sampling and evaluation

Tensor sample_edit(const EditDiT& model, const Tensor& source, const Tensor& edit_mask,
                   const std::vector<int64_t>& colour, const Tensor& noise, int64_t steps) {
  check_edit_inputs("sample_edit", source, edit_mask, colour);
  check_batch_of("sample_edit", "noise", noise, source.size(0), {kTokens, kPatchDim});
  TG_CHECK(steps > 0, "sample_edit: steps must be positive, got ", steps);
  NoGradGuard no_grad;
  const Tensor src = patches_of(source);
  const Tensor inside = edit_mask.unsqueeze(2);
  const double dt = 1.0 / static_cast<double>(steps);
  Tensor x = add(src, mul(inside, sub(noise, src)));  // noise inside, the source outside (x + 0 keeps it exact)
  for (int64_t i = 0; i < steps; ++i) {
    const Tensor t = full({source.size(0)}, 1.0 - static_cast<double>(i) * dt, {source.dtype(), source.device()});
    x = sub(x, mul(inside, mul(model.forward(x, src, t, colour, edit_mask), dt)));  // x_{t-dt} = x_t - dt v
  }
  return images_of(x);
}

double region_psnr(const Tensor& images, const Tensor& target, const Tensor& edit_mask) {
  check_defined("region_psnr", "images", images);
  const int64_t B = images.dim() == 4 ? images.size(0) : -1;
  check_batch_of("region_psnr", "images", images, B, kImageShape);
  check_batch_of("region_psnr", "target", target, B, kImageShape);
  check_batch_of("region_psnr", "edit_mask", edit_mask, B, {kTokens});
  check_binary_mask("region_psnr", "edit_mask", edit_mask);
  NoGradGuard no_grad;
  const double mse = region_mse("region_psnr", sub(patches_of(images), patches_of(target)), edit_mask).item();
  return 10 * std::log10(4.0 / mse);
}

Tensor fill_with_target_mean(const EditBatch& batch) {
  check_edit_inputs("fill_with_target_mean", batch.source, batch.edit_mask, batch.colour);
  const int64_t B = batch.source.size(0), pixels = kPatchSize * kPatchSize;
  check_batch_of("fill_with_target_mean", "target", batch.target, B, kImageShape);
  check_binary_mask("fill_with_target_mean", "edit_mask", batch.edit_mask);
  NoGradGuard no_grad;
  const Shape per_channel{B, kTokens, kChannels, pixels};
  const Tensor target = patches_of(batch.target).reshape(per_channel);
  const Tensor source = patches_of(batch.source).reshape(per_channel);
  const Tensor inside = batch.edit_mask.view({B, kTokens, 1, 1});
  const Tensor region_pixels = mul(sum(inside, {1, 3}, true), static_cast<double>(pixels));    // [B,1,1,1]
  // 1 for an example whose mask marks no token: its mean is then 0 / 1, not 0 / 0, and its source comes back as is.
  const Tensor no_region = masked_fill(ones(region_pixels.shape(), {region_pixels.dtype(), region_pixels.device()}),
                                       region_pixels, 0.0);
  const Tensor mean_colour = div(sum(mul(target, inside), {1, 3}, true), add(region_pixels, no_region));  // [B,1,3,1]
  const Tensor filled = add(source, mul(inside, sub(mean_colour, source)));  // the mean inside, the source outside
  return images_of(filled.reshape({B, kTokens, kPatchDim}));
}

HeldOutPsnr evaluate(const EditDiT& model, const EditBatch& heldout, uint64_t noise_seed, int64_t sample_steps) {
  check_edit_inputs("evaluate", heldout.source, heldout.edit_mask, heldout.colour);
  const Tensor noise = normal_noise({heldout.source.size(0), kTokens, kPatchDim}, {noise_seed, 0},
                                    {heldout.source.dtype(), heldout.source.device()});
  const Tensor edited = sample_edit(model, heldout.source, heldout.edit_mask, heldout.colour, noise, sample_steps);
  return {region_psnr(edited, heldout.target, heldout.edit_mask),
          region_psnr(heldout.source, heldout.target, heldout.edit_mask),
          region_psnr(fill_with_target_mean(heldout), heldout.target, heldout.edit_mask)};
}

}  // namespace tg::toy
