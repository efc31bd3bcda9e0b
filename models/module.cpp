#include "models/module.h"

#include <set>
#include <sstream>
#include <type_traits>
#include <utility>

#include "autograd/grad_mode.h"
#include "core/error.h"

namespace tg {

std::map<std::string, Tensor> by_name(const std::string& op, const StateDict& dict) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : dict) {
    TG_CHECK(t.defined(), op, ": '", name, "' is an undefined tensor");
    TG_CHECK(out.emplace(name, t).second, op, ": key '", name, "' appears twice");
  }
  return out;
}

}  // namespace tg

namespace tg::nn {

namespace {

// "'a', 'b'" for an error message.
std::string quoted_list(const std::vector<std::string>& names) {
  std::ostringstream os;
  for (size_t i = 0; i < names.size(); ++i) os << (i ? ", '" : "'") << names[i] << "'";
  return os.str();
}

// t on `device` as a fresh leaf with t's requires_grad and gradient.
Tensor moved_to(const Tensor& t, Device device) {
  NoGradGuard no_grad;
  Tensor out = t.detach().to(device);
  out.requires_grad_(t.requires_grad());
  if (t.grad().defined()) out.impl()->grad = t.grad().to(device).impl();
  return out;
}

}  // namespace

template <class Self, class Fn>
void Module::for_each_slot(Self& self, const std::string& prefix, Kind kind, Fn&& fn) {
  auto visit = [&](auto& slots) {
    for (auto& slot : slots)
      if (slot.tensor.defined()) fn(prefix + slot.name, slot.tensor);
  };
  if (kind != Kind::Buffers) visit(self.parameters_);
  if (kind != Kind::Parameters) visit(self.buffers_);
  for (const auto& [name, child] : self.children_) {
    if constexpr (std::is_const_v<Self>) {
      for_each_slot(std::as_const(*child), prefix + name + ".", kind, fn);
    } else {
      for_each_slot(*child, prefix + name + ".", kind, fn);
    }
  }
}

void Module::check_new_name(const char* op, const std::string& name) const {
  TG_CHECK(!name.empty() && name.find('.') == std::string::npos, op, ": name '", name,
           "' must be non-empty and hold no '.'");
  bool taken = false;
  for (const auto& slot : parameters_) taken = taken || slot.name == name;
  for (const auto& slot : buffers_) taken = taken || slot.name == name;
  for (const auto& child : children_) taken = taken || child.first == name;
  TG_CHECK(!taken, op, ": name '", name, "' is already registered");
}

Tensor& Module::register_parameter(const std::string& name, Tensor tensor) {
  check_new_name("register_parameter", name);
  if (tensor.defined()) {
    TG_CHECK(tensor.is_leaf(), "register_parameter: '", name, "' ", tensor.shape(),
             " is the output of an op, not a leaf; pass detach() of it");
    tensor.requires_grad_();
  }
  parameters_.push_back({name, std::move(tensor)});
  return parameters_.back().tensor;
}

Tensor& Module::register_buffer(const std::string& name, Tensor tensor) {
  check_new_name("register_buffer", name);
  if (tensor.defined()) tensor = tensor.detach();
  buffers_.push_back({name, std::move(tensor)});
  return buffers_.back().tensor;
}

bool Module::contains(const Module* m) const {
  if (m == this) return true;
  for (const auto& child : children_)
    if (child.second->contains(m)) return true;
  return false;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (const auto& named : named_parameters()) out.push_back(named.second);
  return out;
}

StateDict Module::named_parameters() const {
  StateDict out;
  std::set<const TensorImpl*> seen;
  for_each_slot(*this, "", Kind::Parameters, [&](const std::string& name, const Tensor& t) {
    if (seen.insert(t.impl().get()).second) out.emplace_back(name, t);
  });
  return out;
}

StateDict Module::named_buffers() const {
  StateDict out;
  for_each_slot(*this, "", Kind::Buffers, [&](const std::string& name, const Tensor& t) { out.emplace_back(name, t); });
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& child : children_) child.second->train(on);
}

void Module::to(Device device) {
  std::map<const TensorImpl*, Tensor> moved;  // a tensor in several slots moves once, and stays one tensor
  for_each_slot(*this, "", Kind::Both, [&](const std::string&, Tensor& t) {
    if (t.device() == device) return;
    auto [it, first] = moved.try_emplace(t.impl().get());
    if (first) it->second = moved_to(t, device);
    t = it->second;
  });
}

void Module::zero_grad() {
  for_each_slot(*this, "", Kind::Parameters, [](const std::string&, Tensor& t) { t.zero_grad(); });
}

StateDict Module::state_dict() const {
  StateDict out;
  for_each_slot(*this, "", Kind::Both, [&](const std::string& name, const Tensor& t) { out.emplace_back(name, t.detach()); });
  return out;
}

Module::IncompatibleKeys Module::load_state_dict(const StateDict& dict, bool strict) {
  std::map<std::string, Tensor> given = by_name("load_state_dict", dict);
  std::vector<std::pair<Tensor*, Tensor>> copies;  // (destination slot, source)
  std::vector<std::string> missing;
  for_each_slot(*this, "", Kind::Both, [&](const std::string& name, Tensor& slot) {
    const auto it = given.find(name);
    if (it == given.end()) {
      missing.push_back(name);
      return;
    }
    const Tensor& src = it->second;
    TG_CHECK(src.shape() == slot.shape(), "load_state_dict: '", name, "' has shape ", slot.shape(),
             " in the module but ", src.shape(), " in the state_dict");
    TG_CHECK(src.dtype() == slot.dtype(), "load_state_dict: '", name, "' is ", slot.dtype(),
             " in the module but ", src.dtype(), " in the state_dict");
    copies.emplace_back(&slot, src);
    given.erase(it);
  });
  std::vector<std::string> unexpected;
  for (const auto& entry : given) unexpected.push_back(entry.first);
  TG_CHECK(!strict || (missing.empty() && unexpected.empty()), "load_state_dict: ",
           missing.empty() ? "" : "missing key(s) " + quoted_list(missing),
           missing.empty() || unexpected.empty() ? "" : "; ",
           unexpected.empty() ? "" : "unexpected key(s) " + quoted_list(unexpected));
  NoGradGuard no_grad;
  for (auto& [slot, src] : copies) slot->copy_(src);
  return {missing, unexpected};
}

}  // namespace tg::nn
