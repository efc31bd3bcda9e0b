// tg::nn::Module, like torch.nn.Module: a layer owns named parameters,
// buffers and submodules; everything a model is made of is reached by walking
// that tree, so parameters(), state_dict(), to() and zero_grad() need no
// per-layer code.
//
// A layer keeps its parameters as references into its own registry
// (`Tensor& weight = register_parameter("weight", ...)`). to() and tests that
// swap a parameter replace the registry entry, and the layer sees the new
// tensor through its reference; so construct optimizers after to(), as in
// PyTorch. Modules are not copyable (the references would dangle).
#pragma once
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace tg {

// Named tensors in a fixed order (PyTorch's OrderedDict of a state_dict).
using StateDict = std::vector<std::pair<std::string, Tensor>>;

// The dict as a map for look-ups; throws naming `op` and the key when a key
// appears twice or a tensor is undefined.
std::map<std::string, Tensor> by_name(const std::string& op, const StateDict& dict);

}  // namespace tg

namespace tg::nn {

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Names are non-empty, hold no '.', and are unique within the module.
  // A parameter becomes a leaf that requires grad; an undefined tensor
  // registers an absent parameter (PyTorch's None), skipped everywhere.
  Tensor& register_parameter(const std::string& name, Tensor tensor);
  // State that is saved and moved but not trained (no gradient).
  Tensor& register_buffer(const std::string& name, Tensor tensor);
  // A submodule may be registered in several places (shared), but not inside itself (a cycle).
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    check_new_name("register_module", name);
    TG_CHECK(module, "register_module: module '", name, "' is null");
    TG_CHECK(!static_cast<const Module&>(*module).contains(this), "register_module: module '", name,
             "' is this module or contains it (a cycle)");
    children_.emplace_back(name, module);
    return module;
  }

  // Depth first in registration order: own entries, then each submodule's
  // under "child." (e.g. blocks.0.attn.qkv.weight). A tensor registered in
  // several places (tied weights, a shared submodule) comes once, under its
  // first name, as in PyTorch; state_dict() keeps every name.
  std::vector<Tensor> parameters() const;
  StateDict named_parameters() const;
  StateDict named_buffers() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const { return children_; }

  // Training mode (dropout on) for this module and every submodule.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Moves every parameter (with its gradient) and buffer to `device`, keeping
  // names and requires_grad.
  void to(Device device);
  // Drops every parameter's .grad() (PyTorch's set_to_none).
  void zero_grad();

  // Parameters and buffers by dotted name, detached (they share storage).
  StateDict state_dict() const;
  // Copies values in (not recorded on the tape). Every key of the dict that
  // names a parameter or buffer must match its shape and dtype; with
  // `strict`, every parameter and buffer must be in the dict and no other key
  // may be. Nothing is copied unless all of it checks out. Returns the keys
  // left out either way (PyTorch's missing_keys and unexpected_keys).
  struct IncompatibleKeys {
    std::vector<std::string> missing, unexpected;
  };
  IncompatibleKeys load_state_dict(const StateDict& dict, bool strict = true);

 private:
  struct Slot {
    std::string name;
    Tensor tensor;
  };
  void check_new_name(const char* op, const std::string& name) const;
  bool contains(const Module* m) const;  // m is this module or one of its submodules, at any depth
  enum class Kind { Parameters, Buffers, Both };
  // Calls fn(dotted name, tensor slot) for every defined parameter and/or
  // buffer of the tree; Self is Module or const Module.
  template <class Self, class Fn>
  static void for_each_slot(Self& self, const std::string& prefix, Kind kind, Fn&& fn);

  // deques: the references register_* returned stay valid as more are added.
  std::deque<Slot> parameters_, buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// A list of submodules named 0, 1, 2, ... (torch.nn.ModuleList), keeping their type.
template <class M>
class ModuleList : public Module {
 public:
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    items_.push_back(register_module(std::to_string(items_.size()), std::move(module)));
    return items_.back();
  }
  size_t size() const { return items_.size(); }
  const std::shared_ptr<M>& operator[](size_t i) const {
    TG_CHECK(i < items_.size(), "ModuleList: index ", i, " is out of range for a list of ", items_.size(), " modules");
    return items_[i];
  }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  std::vector<std::shared_ptr<M>> items_;
};

}  // namespace tg::nn
