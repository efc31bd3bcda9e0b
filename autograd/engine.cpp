#include "autograd/engine.h"

#include <algorithm>
#include <unordered_map>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "ops/elementwise.h"

namespace tg::autograd {

namespace {

thread_local bool grad_enabled = true;
thread_local BackwardObserver observer;
std::atomic<int64_t> node_count{0};

// Nothing but this one reference holds the tensor or its storage.
bool held_only_here(const std::shared_ptr<TensorImpl>& t) { return t.use_count() == 1 && t->storage.use_count() == 1; }

// A gradient nothing else references can become .grad() itself instead of being copied.
bool can_steal(const Tensor& g) { return held_only_here(g.impl()) && g.is_contiguous() && !g.requires_grad(); }

// leaf.grad += g, under the leaf's lock (threads may share a leaf). As in
// PyTorch, the sum is written in place only when nobody else holds .grad();
// otherwise .grad() becomes a new tensor and what the caller holds stays as
// it was (a reader on another thread never sees a half-written sum).
void accumulate_into_leaf(TensorImpl& leaf, Tensor g) {
  std::lock_guard<std::mutex> lock(leaf.grad_mutex);
  if (leaf.grad && held_only_here(leaf.grad)) {
    Tensor(leaf.grad).add_(g);
  } else if (leaf.grad) {
    leaf.grad = add(Tensor(leaf.grad), g).impl();
  } else {
    leaf.grad = can_steal(g) ? g.impl() : g.clone().impl();
  }
}

Tensor default_seed(const Tensor& root) {
  TG_CHECK(root.numel() == 1, "backward: a seed gradient can be implied only for a tensor with one "
           "element; this one has shape ", root.shape(), ", so pass backward(seed)");
  return ones(root.shape(), {root.dtype(), root.device()});
}

// One backward() call: the graph reachable from the root, the gradients in
// flight and the leaves' shares, all local to the call.
class GraphTask {
 public:
  GraphTask(bool retain_graph) : retain_graph_(retain_graph) {}

  void run(const std::shared_ptr<Node>& root, const Tensor& seed) {
    count_dependencies(root.get());
    pending_[root.get()] = seed;
    std::vector<std::shared_ptr<Node>> ready{root};
    while (!ready.empty()) {
      const std::shared_ptr<Node> node = std::move(ready.back());
      ready.pop_back();
      Tensor grad = take_pending(node.get());
      const std::vector<Tensor> grads = grad.defined() ? call(*node, std::move(grad)) : std::vector<Tensor>();
      for (size_t k = 0; k < node->edges.size(); ++k) {
        const Edge& edge = node->edges[k];
        if (k < grads.size() && grads[k].defined() && edge.needs_grad()) send(edge, grads[k], *node, k);
        if (edge.node && --dependencies_[edge.node.get()] == 0) ready.push_back(edge.node);
      }
    }
    // Only now, with the whole walk done, do the leaves see their gradients.
    for (auto& [leaf, grad] : leaf_grads_) accumulate_into_leaf(*leaf, std::move(grad));
  }

 private:
  // dependencies_[n] = how many edges from reachable nodes point at n.
  void count_dependencies(Node* root) {
    dependencies_[root] = 0;
    std::vector<Node*> stack{root};
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (const Edge& e : n->edges) {
        if (!e.node) continue;
        const auto [it, first_visit] = dependencies_.try_emplace(e.node.get(), 0);
        ++it->second;
        if (first_visit) stack.push_back(e.node.get());
      }
    }
  }

  Tensor take_pending(Node* n) {
    const auto it = pending_.find(n);
    if (it == pending_.end()) return Tensor();  // no consumer sent a gradient
    Tensor g = std::move(it->second);
    pending_.erase(it);
    return g;
  }

  // The closure owns the incoming gradient (kept here only for an observer)
  // and may drop saved tensors early unless the graph is retained.
  std::vector<Tensor> call(Node& n, Tensor grad) {
    std::lock_guard<std::mutex> lock(n.mutex);
    TG_CHECK(!n.released, "backward: op '", n.name, "' was already freed by an earlier backward(); pass "
             "retain_graph=true to the first call");
    const Tensor observed = observer ? grad : Tensor();
    n.saved.set_retained(retain_graph_);
    std::vector<Tensor> grads = n.backward(std::move(grad), n.saved, n.needs);
    TG_CHECK(grads.size() == n.edges.size(), "backward: op '", n.name, "' returned ", grads.size(),
             " gradients for ", n.edges.size(), " inputs");
    if (observer) observer(n, observed, grads);
    if (!retain_graph_) {
      n.saved.release();
      n.backward = nullptr;
      n.released = true;
    }
    return grads;
  }

  // Adds (+=) the gradient g of input k of `from` to where its edge leads.
  void send(const Edge& edge, const Tensor& g, const Node& from, size_t k) {
    TG_CHECK(g.shape() == edge.shape, "backward: op '", from.name, "' returned a gradient of shape ", g.shape(),
             " for its input ", k, " of shape ", edge.shape);
    TG_CHECK(g.dtype() == edge.dtype && g.device() == edge.device, "backward: op '", from.name, "' returned a ",
             g.dtype(), " ", g.device(), " gradient for its input ", k, ", which is ", edge.dtype, " on ", edge.device);
    if (edge.node) {
      Tensor& sum = pending_[edge.node.get()];
      sum = sum.defined() ? add(sum, g) : g;
      return;
    }
    const auto [it, first] = leaf_index_.try_emplace(edge.leaf.get(), leaf_grads_.size());
    if (first) leaf_grads_.emplace_back(edge.leaf, g);
    else leaf_grads_[it->second].second = add(leaf_grads_[it->second].second, g);
  }

  bool retain_graph_;
  std::unordered_map<Node*, int64_t> dependencies_;
  std::unordered_map<Node*, Tensor> pending_;  // dL/d(output) gathered so far
  std::vector<std::pair<std::shared_ptr<TensorImpl>, Tensor>> leaf_grads_;
  std::unordered_map<TensorImpl*, size_t> leaf_index_;
};

}  // namespace

bool GradMode::enabled() { return grad_enabled; }
void GradMode::set_enabled(bool on) { grad_enabled = on; }

Node::Node() { ++node_count; }

// What a dying node holds: its edges, closure and saved tensors can hold other
// nodes (directly, or through tensors a closure captured).
struct NodeRemains {
  std::vector<Edge> edges;
  BackwardFn backward;
  SavedTensors saved;
};

Node::~Node() {
  // Destroying a node releases what it holds, whose destructors would release
  // theirs: a chain of a million nodes would recurse a million deep. Instead,
  // the outermost destruction on this thread drains a queue, and every node
  // that dies meanwhile only appends its remains to it.
  thread_local std::vector<NodeRemains>* queue = nullptr;
  --node_count;
  NodeRemains remains{std::move(edges), std::move(backward), std::move(saved)};
  if (queue) {
    queue->push_back(std::move(remains));
    return;
  }
  std::vector<NodeRemains> pending;
  pending.push_back(std::move(remains));
  queue = &pending;
  while (!pending.empty()) {
    NodeRemains next = std::move(pending.back());
    pending.pop_back();
  }  // `next` dies at the end of each pass; the nodes it held append theirs
  queue = nullptr;
}

int64_t live_nodes() { return node_count.load(); }

SavedTensors::SavedTensors(std::vector<Tensor> tensors, std::string op) : op_(std::move(op)) {
  for (const Tensor& t : tensors) {
    // Saved as detached views: a saved output must not own its own grad_fn (a cycle).
    tensors_.push_back(t.defined() ? t.detach() : Tensor());
    versions_.push_back(t.defined() ? t.version() : 0);
  }
  dropped_.assign(tensors_.size(), false);
}

void SavedTensors::release_early(size_t i) const {
  TG_CHECK(i < tensors_.size(), op_, ": no saved tensor ", i, " to release");
  if (retained_) return;
  tensors_[i] = Tensor();
  dropped_[i] = true;
}

const Tensor& SavedTensors::operator[](size_t i) const {
  TG_CHECK(i < tensors_.size(), op_, ": saved tensor ", i, " is gone; the graph was freed by an "
           "earlier backward() (pass retain_graph=true to keep it)");
  TG_CHECK(!dropped_[i], op_, ": saved tensor ", i, " was released early by an earlier run of this backward, "
           "which freed the graph as it went (pass retain_graph=true to run it again)");
  const Tensor& t = tensors_[i];
  TG_CHECK(!t.defined() || t.version() == versions_[i], op_, ": a tensor of shape ", t.shape(),
           " saved for backward was modified in place since (version ", t.version(),
           ", saved at version ", versions_[i], ")");
  return t;
}

GradMask grad_mask(const std::vector<Tensor>& inputs) {
  GradMask mask(inputs.size(), false);
  if (!GradMode::enabled()) return mask;
  for (size_t i = 0; i < inputs.size(); ++i) mask[i] = inputs[i].defined() && inputs[i].requires_grad();
  return mask;
}

Tensor record(std::string name, Tensor out, const std::vector<Tensor>& inputs, std::vector<Tensor> saved,
              BackwardFn backward) {
  const GradMask needs = grad_mask(inputs);
  if (std::none_of(needs.begin(), needs.end(), [](bool b) { return b; })) return out;
  auto node = std::make_shared<Node>();
  node->name = std::move(name);
  for (size_t i = 0; i < inputs.size(); ++i) {
    Edge e;
    if (needs[i]) {
      e.shape = inputs[i].shape();
      e.dtype = inputs[i].dtype();
      e.device = inputs[i].device();
      if (inputs[i].grad_fn()) e.node = inputs[i].grad_fn();
      else e.leaf = inputs[i].impl();
    }
    node->edges.push_back(std::move(e));
  }
  node->needs = needs;
  node->saved = SavedTensors(std::move(saved), node->name);
  node->backward = std::move(backward);
  out.impl()->grad_fn = std::move(node);
  out.impl()->requires_grad = true;
  return out;
}

Tensor record(OpId op, Tensor out, const std::vector<Tensor>& inputs, std::vector<Tensor> saved, BackwardFn backward) {
  return record(std::string(op_name(op)), std::move(out), inputs, std::move(saved), std::move(backward));
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
  const std::shared_ptr<Node> root_node = root.grad_fn();
  {
    std::lock_guard<std::mutex> lock(root_node->mutex);
    TG_CHECK(!root_node->released, "backward: the graph behind this tensor (op '", root_node->name,
             "') was freed by an earlier backward(); pass retain_graph=true to the first call");
  }
  GraphTask(retain_graph).run(root_node, seed);
}

const std::string& node_name(const Node& node) { return node.name; }

ObserveBackward::ObserveBackward(BackwardObserver o) : previous_(std::move(observer)) { observer = std::move(o); }
ObserveBackward::~ObserveBackward() { observer = std::move(previous_); }

}  // namespace tg::autograd
