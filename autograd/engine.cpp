#include "autograd/engine.h"

#include <algorithm>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "ops/elementwise.h"

namespace tg::autograd {

namespace {

thread_local bool grad_enabled = true;

// The tape: weak references in execution order. Nodes are owned by the tensors
// they produced and by the nodes downstream of them, so a graph nobody holds
// disappears from the tape by itself.
struct Tape {
  std::vector<std::weak_ptr<Node>> nodes;
  size_t live_after_compaction = 0;

  void push(const std::shared_ptr<Node>& n) {
    if (nodes.size() > 2 * live_after_compaction + 1024) compact();
    nodes.push_back(n);
  }
  void compact() {
    std::erase_if(nodes, [](const std::weak_ptr<Node>& w) {
      const auto n = w.lock();
      return !n || n->released;
    });
    live_after_compaction = nodes.size();
  }
};

Tape& tape() {
  thread_local Tape t;
  return t;
}

// A gradient nothing else references (its tensor and its storage held only
// here) can become .grad() itself instead of being copied.
bool can_steal(const Tensor& g) {
  return g.impl().use_count() == 1 && g.impl()->storage.use_count() == 1 && g.is_contiguous() && !g.requires_grad();
}

void accumulate_into_leaf(TensorImpl& leaf, Tensor g) {
  if (leaf.grad) {
    Tensor(leaf.grad).add_(g);
  } else {
    leaf.grad = can_steal(g) ? g.impl() : g.clone().impl();
  }
}

void accumulate(const Edge& edge, Tensor g, const Node& from, size_t input) {
  if (!edge.leaf && !edge.node) return;  // this input does not require grad
  TG_CHECK(g.shape() == edge.shape, "backward: op '", from.name, "' returned a gradient of shape ",
           g.shape(), " for its input ", input, " of shape ", edge.shape);
  if (edge.leaf) {
    accumulate_into_leaf(*edge.leaf, std::move(g));
  } else if (edge.node) {
    edge.node->grad = edge.node->grad.defined() ? add(edge.node->grad, g) : std::move(g);
  }
}

Tensor default_seed(const Tensor& root) {
  TG_CHECK(root.numel() == 1, "backward: a seed gradient can be implied only for a tensor with one "
           "element; this one has shape ", root.shape(), ", so pass backward(seed)");
  return ones(root.shape(), {root.dtype(), root.device()});
}

}  // namespace

bool GradMode::enabled() { return grad_enabled; }
void GradMode::set_enabled(bool on) { grad_enabled = on; }

SavedTensors::SavedTensors(std::vector<Tensor> tensors, std::string op) : op_(std::move(op)) {
  for (const Tensor& t : tensors) {
    // Saved as detached views: a saved output must not own its own grad_fn (a cycle).
    tensors_.push_back(t.defined() ? t.detach() : Tensor());
    versions_.push_back(t.defined() ? t.version() : 0);
  }
}

const Tensor& SavedTensors::operator[](size_t i) const {
  TG_CHECK(i < tensors_.size(), op_, ": saved tensor ", i, " is gone; the graph was freed by an "
           "earlier backward() (pass retain_graph=true to keep it)");
  const Tensor& t = tensors_[i];
  TG_CHECK(!t.defined() || t.version() == versions_[i], op_, ": a tensor of shape ", t.shape(),
           " saved for backward was modified in place since (version ", t.version(),
           ", saved at version ", versions_[i], ")");
  return t;
}

Tensor record(const char* name, Tensor out, const std::vector<Tensor>& inputs,
              std::vector<Tensor> saved, BackwardFn backward) {
  const bool any_requires = std::any_of(inputs.begin(), inputs.end(), [](const Tensor& t) {
    return t.defined() && t.requires_grad();
  });
  if (!GradMode::enabled() || !any_requires) return out;

  auto node = std::make_shared<Node>();
  node->name = name;
  for (const Tensor& in : inputs) {
    Edge e;
    if (in.defined() && in.requires_grad()) {
      e.shape = in.shape();
      if (in.grad_fn()) e.node = in.grad_fn();
      else e.leaf = in.impl();
    }
    node->edges.push_back(std::move(e));
  }
  node->saved = SavedTensors(std::move(saved), name);
  node->backward = std::move(backward);
  out.impl()->grad_fn = node;
  out.impl()->requires_grad = true;
  tape().push(node);
  return out;
}

void backward(const Tensor& root, const Tensor& seed_in, bool retain_graph) {
  check_defined("backward", "self", root);
  TG_CHECK(root.requires_grad(), "backward: tensor of shape ", root.shape(),
           " does not require grad and has no grad_fn");
  const Tensor seed = seed_in.defined() ? seed_in : default_seed(root);
  TG_CHECK(seed.shape() == root.shape(), "backward: seed of shape ", seed.shape(),
           " does not match the tensor's shape ", root.shape());
  check_same_dtype_device("backward", root, seed);

  NoGradGuard no_grad;  // the backward pass itself is not recorded
  if (root.is_leaf()) {
    accumulate_into_leaf(*root.impl(), seed);
    return;
  }
  const std::shared_ptr<Node>& root_node = root.grad_fn();
  TG_CHECK(!root_node->released, "backward: the graph behind this tensor (op '", root_node->name,
           "') was freed by an earlier backward(); pass retain_graph=true to the first call");
  root_node->grad = seed;

  std::vector<std::shared_ptr<Node>> visited;
  auto& nodes = tape().nodes;
  for (size_t i = nodes.size(); i-- > 0;) {
    const std::shared_ptr<Node> n = nodes[i].lock();
    if (!n || !n->grad.defined()) continue;
    TG_CHECK(!n->released, "backward: op '", n->name, "' was already freed by an earlier "
             "backward(); pass retain_graph=true to the first call");
    std::vector<Tensor> grads = n->backward(n->grad, n->saved);
    TG_CHECK(grads.size() == n->edges.size(), "backward: op '", n->name, "' returned ",
             grads.size(), " gradients for ", n->edges.size(), " inputs");
    for (size_t k = 0; k < grads.size(); ++k)
      if (grads[k].defined()) accumulate(n->edges[k], std::move(grads[k]), *n, k);
    n->grad = Tensor();
    visited.push_back(n);
  }
  if (retain_graph) return;
  for (const auto& n : visited) {
    n->saved.release();
    n->backward = nullptr;
    n->released = true;
  }
  tape().compact();
}

const std::string& node_name(const Node& node) { return node.name; }

size_t tape_size() {
  tape().compact();
  return tape().nodes.size();
}

}  // namespace tg::autograd
