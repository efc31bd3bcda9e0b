// Optimizers, a learning-rate schedule and gradient clipping, with
// torch.optim's update rules. A step runs under NoGradGuard, on CPU and CUDA
// tensors alike: SGD with the tensor methods, AdamW and clipping with
// ops/foreach.h's list updates (a few launches per step, not several per
// parameter). Each write bumps the tensor's version counter, as in-place
// methods do.
// Parameters without a gradient are skipped, and their state stays as it was.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "models/module.h"

namespace tg::optim {

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  virtual void step() = 0;
  void zero_grad();  // drops every parameter's .grad()

  double lr() const { return lr_; }
  void set_lr(double lr);
  const std::vector<Tensor>& params() const { return params_; }

  // The per-parameter state for a checkpoint: "state.<i>.step" (a 0-d
  // float64 tensor: the number of steps parameter i has taken) and
  // "state.<i>.<buffer>" (parameter-shaped), for every parameter that has
  // taken a step. Hyperparameters are not included: build the optimizer with
  // the same options, and set the learning rate from the schedule.
  StateDict state_dict() const;
  // Replaces the state with copies of the dict's tensors (on each parameter's
  // device). Checks every key, shape, dtype and step first, and changes nothing on error.
  void load_state_dict(const StateDict& dict);

 protected:
  // params: leaves, each once, none an expanded view and no two in
  // overlapping memory ranges (each is updated in place: check_disjoint_params);
  // a non-empty list. `name` prefixes errors.
  Optimizer(std::vector<Tensor> params, double lr, const char* name);

  struct ParamState {
    int64_t step = 0;
    std::map<std::string, Tensor> buffers;
  };
  // The buffers a parameter's state holds once it has stepped.
  virtual std::vector<std::string> buffer_names() const = 0;

  std::vector<Tensor> params_;
  std::vector<ParamState> state_;
  double lr_;
  const char* name_;

 private:
  void check_disjoint_params() const;
};

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double weight_decay = 0.0;
};

// torch.optim.SGD without dampening or Nesterov:
//   g = grad + weight_decay p;  b = g at the first step, else momentum b + g (when momentum != 0);  p -= lr b
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, const SGDOptions& options);
  void step() override;

 private:
  std::vector<std::string> buffer_names() const override;
  SGDOptions options_;
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

// torch.optim.AdamW, in its order of operations: at step t,
//   p *= 1 - lr wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// State buffers: exp_avg (m) and exp_avg_sq (v).
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, const AdamWOptions& options = {});
  void step() override;

 private:
  std::vector<std::string> buffer_names() const override;
  AdamWOptions options_;
};

// Linear warm-up, then cosine decay: for step s (0-based),
//   s < warmup:          base_lr (s + 1) / warmup
//   warmup <= s < total: min_lr + (base_lr - min_lr) (1 + cos(pi (s - warmup) / (total - warmup))) / 2
//   s >= total:          min_lr
// A pure function of the step, so resuming needs no schedule state.
class CosineSchedule {
 public:
  CosineSchedule(double base_lr, int64_t warmup_steps, int64_t total_steps, double min_lr = 0.0);
  double lr(int64_t step) const;

 private:
  double base_lr_, min_lr_;
  int64_t warmup_steps_, total_steps_;
};

}  // namespace tg::optim

namespace tg::nn::utils {

// torch.nn.utils.clip_grad_norm_: returns the 2-norm of all the gradients
// together, and scales every gradient by min(1, max_norm / (norm + 1e-6)).
// Parameters without a gradient are skipped; a parameter listed twice is an
// error (PyTorch would count and scale its gradient twice). As in PyTorch, a
// non-finite norm is returned as it is and still scales the gradients (to NaN
// or 0): check it. The norm's sum of squares has the same bits on the CPU
// and the GPU (ops/foreach.h).
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm);

}  // namespace tg::nn::utils
