#include "models/optim.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <numbers>
#include <set>

#include "autograd/grad_mode.h"
#include "ops/copy.h"
#include "ops/elementwise.h"
#include "ops/foreach.h"
#include "ops/untracked.h"

namespace tg::optim {

namespace {

std::string state_key(size_t i, const std::string& name) { return "state." + std::to_string(i) + "." + name; }

// A step count stored as a 0-d tensor: a whole number in [1, 2^53].
int64_t checked_step(const std::string& op, const std::string& key, const Tensor& t) {
  TG_CHECK(t.dim() == 0, op, ": '", key, "' must be a 0-d tensor, got shape ", t.shape());
  const double v = t.item();
  TG_CHECK(v >= 1 && v <= 9007199254740992.0 && v == std::floor(v), op, ": '", key,
           "' must be a whole number of steps >= 1, got ", v);
  return static_cast<int64_t>(v);
}

// The hyperparameters that must be finite and >= 0 (lr, momentum, eps, weight_decay).
bool finite_nonnegative(double v) { return std::isfinite(v) && v >= 0; }

}  // namespace

// ---- Optimizer

Optimizer::Optimizer(std::vector<Tensor> params, double lr, const char* name)
    : params_(std::move(params)), state_(params_.size()), name_(name) {
  TG_CHECK(!params_.empty(), name, ": got an empty parameter list");
  std::set<const TensorImpl*> seen;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    TG_CHECK(p.defined(), name, ": parameter ", i, " is an undefined tensor");
    TG_CHECK(p.is_leaf(), name, ": parameter ", i, " ", p.shape(), " is not a leaf tensor");
    TG_CHECK(seen.insert(p.impl().get()).second, name, ": parameter ", i, " ", p.shape(), " appears more than once");
    TG_CHECK(!has_internal_overlap(p.shape(), p.strides()), name, ": parameter ", i, " ", p.shape(), " with strides ",
             p.strides(), " has elements that share one memory location (an expanded view), so a step cannot "
             "update it in place; clone() it first");
  }
  check_disjoint_params();
  set_lr(lr);
}

// No two parameters' memory ranges overlap (views of one buffer, say): a
// step writes each in place, so the error comes here, not halfway through a
// step. Conservative: two interleaved views that share no element (a
// matrix's even and odd columns) overlap as ranges and are refused too.
void Optimizer::check_disjoint_params() const {
  std::vector<size_t> order;
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].numel() > 0) order.push_back(i);
  const auto start = [&](size_t i) {
    return std::make_pair(params_[i].device(), reinterpret_cast<uintptr_t>(byte_range(params_[i]).first));
  };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return start(a) < start(b); });
  // In order of their first bytes, a range that overlaps any other overlaps the next one.
  for (size_t k = 1; k < order.size(); ++k) {
    const size_t a = order[k - 1], b = order[k];
    TG_CHECK(!bytes_overlap(params_[a], params_[b]), name_, ": parameters ", std::min(a, b), " and ", std::max(a, b),
             " lie in overlapping memory; each must have memory of its own (clone() one)");
  }
}

void Optimizer::set_lr(double lr) {
  TG_CHECK(finite_nonnegative(lr), name_, ": lr must be finite and >= 0, got ", lr);
  lr_ = lr;
}

void Optimizer::zero_grad() {
  for (Tensor& p : params_) p.zero_grad();
}

StateDict Optimizer::state_dict() const {
  StateDict out;
  for (size_t i = 0; i < state_.size(); ++i) {
    if (state_[i].step == 0) continue;
    out.emplace_back(state_key(i, "step"), scalar_tensor(static_cast<double>(state_[i].step), {DType::Float64}));
    for (const auto& [name, t] : state_[i].buffers) out.emplace_back(state_key(i, name), t);
  }
  return out;
}

void Optimizer::load_state_dict(const StateDict& dict) {
  const std::string op = std::string(name_) + "::load_state_dict";
  std::map<std::string, Tensor> given = by_name(op, dict);
  std::vector<ParamState> loaded(params_.size());
  NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto step = given.find(state_key(i, "step"));
    if (step == given.end()) continue;  // parameter i has not stepped
    loaded[i].step = checked_step(op, step->first, step->second);
    given.erase(step);
    const Tensor& p = params_[i];
    for (const std::string& name : buffer_names()) {
      const std::string key = state_key(i, name);
      const auto it = given.find(key);
      TG_CHECK(it != given.end(), op, ": missing key '", key, "' (parameter ", i, " has a step count)");
      const Tensor& src = it->second;
      TG_CHECK(src.shape() == p.shape() && src.dtype() == p.dtype(), op, ": '", key, "' is ", src.dtype(), " ",
               src.shape(), ", but parameter ", i, " is ", p.dtype(), " ", p.shape());
      loaded[i].buffers[name] = empty_like(p).copy_(src);
      given.erase(it);
    }
  }
  TG_CHECK(given.empty(), op, ": unexpected key '", given.empty() ? "" : given.begin()->first, "'");
  state_ = std::move(loaded);
}

// ---- SGD

SGD::SGD(std::vector<Tensor> params, const SGDOptions& options)
    : Optimizer(std::move(params), options.lr, "SGD"), options_(options) {
  TG_CHECK(finite_nonnegative(options.momentum) && finite_nonnegative(options.weight_decay), "SGD: momentum ",
           options.momentum, " and weight_decay ", options.weight_decay, " must be finite and >= 0");
}

std::vector<std::string> SGD::buffer_names() const {
  if (options_.momentum == 0) return {};
  return {"momentum_buffer"};
}

void SGD::step() {
  NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    const Tensor grad = p.grad();
    if (!grad.defined()) continue;
    ParamState& s = state_[i];
    Tensor g = options_.weight_decay == 0 ? grad : add(grad, mul(p, options_.weight_decay));
    if (options_.momentum != 0) {
      Tensor& buffer = s.buffers["momentum_buffer"];
      if (buffer.defined()) {
        buffer.mul_(options_.momentum).add_(g);
      } else {
        buffer = clone(g);
      }
      g = buffer;
    }
    ++s.step;
    p.add_(g, -lr_);
  }
}

// ---- AdamW

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : Optimizer(std::move(params), options.lr, "AdamW"), options_(options) {
  check_adamw_hyper("AdamW", {options.lr, options.beta1, options.beta2, options.eps, options.weight_decay});
}

std::vector<std::string> AdamW::buffer_names() const { return {"exp_avg", "exp_avg_sq"}; }

void AdamW::step() {
  NoGradGuard no_grad;
  const AdamWOptions& o = options_;
  // One foreach_adamw_ per device and dtype: a few launches for the whole
  // model, not ~11 per parameter (ops/foreach.h). A parameter that is not
  // contiguous steps as a contiguous copy, copied back.
  struct Group {
    std::vector<Tensor> params, grads, exp_avgs, exp_avg_sqs;
    std::vector<int64_t> steps;
  };
  std::map<std::pair<Device, DType>, Group> groups;
  std::vector<std::pair<Tensor, Tensor>> copies;  // (parameter, its stepped copy)
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    ParamState& s = state_[i];
    if (s.step == 0) s.buffers = {{"exp_avg", zeros_like(p)}, {"exp_avg_sq", zeros_like(p)}};
    Group& group = groups[{p.device(), p.dtype()}];
    group.params.push_back(materialize(p));
    if (!p.is_contiguous()) copies.emplace_back(p, group.params.back());
    group.grads.push_back(materialize(g));
    group.exp_avgs.push_back(s.buffers.at("exp_avg"));
    group.exp_avg_sqs.push_back(s.buffers.at("exp_avg_sq"));
    group.steps.push_back(++s.step);
  }
  for (const auto& [key, g] : groups)
    foreach_adamw_(g.params, g.grads, g.exp_avgs, g.exp_avg_sqs, g.steps, {lr_, o.beta1, o.beta2, o.eps, o.weight_decay});
  for (auto& [p, stepped] : copies) p.copy_(stepped);
}

// ---- CosineSchedule

CosineSchedule::CosineSchedule(double base_lr, int64_t warmup_steps, int64_t total_steps, double min_lr)
    : base_lr_(base_lr), min_lr_(min_lr), warmup_steps_(warmup_steps), total_steps_(total_steps) {
  TG_CHECK(std::isfinite(base_lr) && min_lr >= 0 && min_lr <= base_lr,
           "CosineSchedule: need 0 <= min_lr <= base_lr < inf, got min_lr ", min_lr, " and base_lr ", base_lr);
  TG_CHECK(warmup_steps >= 0 && warmup_steps <= total_steps, "CosineSchedule: need 0 <= warmup_steps <= total_steps, got ",
           warmup_steps, " and ", total_steps);
}

double CosineSchedule::lr(int64_t step) const {
  TG_CHECK(step >= 0, "CosineSchedule: step must be >= 0, got ", step);
  if (step < warmup_steps_) return base_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_steps_);
  if (step >= total_steps_) return min_lr_;
  const double progress =
      static_cast<double>(step - warmup_steps_) / static_cast<double>(total_steps_ - warmup_steps_);
  return min_lr_ + (base_lr_ - min_lr_) * (1 + std::cos(std::numbers::pi * progress)) / 2;
}

}  // namespace tg::optim

namespace tg::nn::utils {

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm) {
  TG_CHECK(std::isfinite(max_norm) && max_norm > 0, "clip_grad_norm_: max_norm must be finite and > 0, got ", max_norm);
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  std::set<const TensorImpl*> seen;
  for (size_t i = 0; i < params.size(); ++i) {
    TG_CHECK(params[i].defined(), "clip_grad_norm_: parameter ", i, " is an undefined tensor");
    TG_CHECK(seen.insert(params[i].impl().get()).second, "clip_grad_norm_: parameter ", i, " ", params[i].shape(),
             " appears more than once (its gradient would count and be scaled twice)");
    if (params[i].grad().defined()) grads.push_back(params[i].grad());
  }
  // The sum of squares in float64 (squared in float32, 1e20 would overflow
  // and 1e-25 underflow), one foreach_sum_of_squares per device and dtype,
  // read back once per device rather than once per parameter (each read is a
  // device synchronisation). A gradient that is not contiguous is summed as a
  // contiguous copy and scaled by itself.
  std::map<std::pair<Device, DType>, std::vector<Tensor>> summed, scaled;
  std::vector<Tensor> strided;
  for (const Tensor& g : grads) {
    summed[{g.device(), g.dtype()}].push_back(materialize(g));
    if (g.is_contiguous()) scaled[{g.device(), g.dtype()}].push_back(g);
    else strided.push_back(g);
  }
  std::map<Device, Tensor> per_device;
  for (const auto& [key, group] : summed) {
    const Tensor squares = foreach_sum_of_squares(group);
    Tensor& total = per_device[key.first];
    total = total.defined() ? add(total, squares) : squares;
  }
  double sum_of_squares = 0;
  for (const auto& [device, total] : per_device) sum_of_squares += total.item();
  const double total_norm = std::sqrt(sum_of_squares);
  const double clip_coef = max_norm / (total_norm + 1e-6);
  if (!(clip_coef >= 1)) {  // also when NaN, as PyTorch's clamp(max=1) lets NaN through
    for (const auto& [key, group] : scaled) foreach_mul_(group, clip_coef);
    for (Tensor& g : strided) g.mul_(clip_coef);
  }
  return total_norm;
}

}  // namespace tg::nn::utils
