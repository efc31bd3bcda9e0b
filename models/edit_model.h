// The toy edit-diffusion model: a DiT-style denoiser over the 64 patch tokens
// of models/edit_data.h, trained by flow matching inside the edit region and
// sampled with Euler steps, plus the held-out metric and its baselines.
//
// Tokens are the patch embedding of concat(x_t patch, source patch)
// (InstructPix2Pix's channel concat: the model sees the shape it recolours);
// the conditioning c = TimestepEmbedding(1000 t) + Embedding(k); DiT blocks
// with region-aware attention fed the edit mask; DiT's FinalLayer back to
// the 48 values of a patch.
//
// Flow matching (rectified flow) with x0 the target's patches: inside the
// region x_t = (1 - t) x0 + t noise, outside x_t = x0 (given clean); the
// model predicts the velocity dx_t/dt = noise - x0, and the loss is its mean
// squared error over the tokens inside the region.
#pragma once
#include <memory>
#include <vector>

#include "models/edit_data.h"
#include "models/layers.h"
#include "models/optim.h"

namespace tg::toy {

struct EditModelConfig {
  int64_t hidden = 128;
  int64_t heads = 2;  // head dim 64: the fused attention's
  int64_t depth = 4;
  double mlp_ratio = 2.0;
  AttentionImpl attention = AttentionImpl::Decomposed;
};

class EditDiT : public nn::Module {
 public:
  explicit EditDiT(const EditModelConfig& config, TensorOptions opts = {});
  // x_t and source patches [B,64,48], t [B] in [0, 1], colour [B], edit_mask
  // [B,64] -> the predicted velocity [B,64,48]. The inputs are data: the
  // gradient reaches the parameters only.
  Tensor forward(const Tensor& noisy, const Tensor& source, const Tensor& t, const std::vector<int64_t>& colour,
                 const Tensor& edit_mask) const;

  const EditModelConfig config;
  std::shared_ptr<nn::PatchEmbed> x_embedder;
  std::shared_ptr<nn::TimestepEmbedding> t_embedder;
  std::shared_ptr<nn::Embedding> y_embedder;
  std::shared_ptr<nn::ModuleList<nn::DiTBlock>> blocks;
  std::shared_ptr<nn::FinalLayer> final_layer;
};

// The flow-matching loss of a batch (a 0-d tensor on the tape), drawing t ~
// U(0, 1) and the noise from tg's global generator.
Tensor flow_matching_loss(const EditDiT& model, const EditBatch& batch);

struct TrainStepResult {
  double loss;
  double grad_norm;  // before clipping
};

// One optimizer step on `batch`: gradients of the loss, clipped to max_grad_norm, then step().
TrainStepResult train_step(EditDiT& model, optim::Optimizer& optimizer, const EditBatch& batch,
                           double max_grad_norm = 1.0);

// The edit, sampled with `steps` Euler steps of dx/dt = v from t = 1 (x =
// `noise` [B,64,48] inside the region) to t = 0; tokens outside the region
// stay the source's, bit for bit, while the velocities are finite (each step
// adds mask * v dt, and 0 * inf is NaN). Returns images [B,3,32,32] (not clamped).
Tensor sample_edit(const EditDiT& model, const Tensor& source, const Tensor& edit_mask,
                   const std::vector<int64_t>& colour, const Tensor& noise, int64_t steps);

// PSNR in dB (peak-to-peak 2, as images span [-1, 1]) of the pixels inside
// the edit region, pooled over the batch: 10 log10(4 / MSE), of the images as
// given (evaluate scores the sampler's output unclamped: clamping to [-1, 1]
// could only raise it).
double region_psnr(const Tensor& images, const Tensor& target, const Tensor& edit_mask);

// The baseline that fills the edit region with the mean colour of the
// target inside it (an oracle: it knows the answer's average colour).
Tensor fill_with_target_mean(const EditBatch& batch);

struct HeldOutPsnr {
  double model, copy_input, mean_colour;
};

// The model's sampled edits and both baselines on a held-out batch, with the
// noise drawn from `noise_seed` (so every evaluation sees the same noise).
HeldOutPsnr evaluate(const EditDiT& model, const EditBatch& heldout, uint64_t noise_seed, int64_t sample_steps);

}  // namespace tg::toy
