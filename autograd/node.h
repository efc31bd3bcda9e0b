// A node of the graph: one recorded op. It holds edges to its inputs' nodes
// (or leaves), the tensors its backward needs (with their versions at save
// time) and the backward closure. Nodes are owned by the tensors they produced
// and by the nodes downstream of them, so a graph nobody holds disappears.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tg::autograd {

struct Node;

// Where an input's gradient goes: into its producing node, or into a leaf's
// .grad(). Neither, for an input that does not require grad.
struct Edge {
  std::shared_ptr<Node> node;
  std::shared_ptr<TensorImpl> leaf;
  Shape shape;  // the input's shape, dtype and device: the gradient must have them
  DType dtype = DType::Float32;
  Device device = Device::CPU;
  bool needs_grad() const { return node || leaf; }
};

// Which inputs of a node need a gradient (PyTorch's grad_input_mask): a
// backward closure computes exactly those and returns undefined tensors for
// the rest. At record time the same mask decides what the op saves.
using GradMask = std::vector<bool>;

// Tensors saved for backward. Reading one checks that no in-place write has
// happened since it was saved. A backward closure done with a saved tensor
// may drop it before it returns (release_early), to free its memory sooner;
// that happens only when the engine will not run the node again (set_retained).
class SavedTensors {
 public:
  SavedTensors() = default;
  SavedTensors(std::vector<Tensor> tensors, std::string op);
  const Tensor& operator[](size_t i) const;
  size_t size() const { return tensors_.size(); }
  void release() { tensors_.clear(); }
  void set_retained(bool retained) { retained_ = retained; }
  void release_early(size_t i) const;  // logically const: the closure is done with tensor i

 private:
  mutable std::vector<Tensor> tensors_;
  std::vector<uint64_t> versions_;
  mutable std::vector<bool> dropped_;
  bool retained_ = true;
  std::string op_;
};

// Given dL/d(output), the saved tensors and which inputs need a gradient,
// returns dL/d(input) per input (undefined where the mask is false). The
// closure holds the engine's only handle to dL/d(output): one that takes it
// by value may drop it early. It never writes into it (the same tensor may be
// another node's gradient too, or the caller's seed).
using BackwardFn =
    std::function<std::vector<Tensor>(Tensor grad_out, const SavedTensors& saved, const GradMask& needs)>;

struct Node {
  Node();
  ~Node();  // frees the chain of producers it alone holds without recursion
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  std::string name;
  std::vector<Edge> edges;  // one per input, in order
  GradMask needs;           // edges[i].needs_grad(), for the closure
  SavedTensors saved;
  BackwardFn backward;
  std::mutex mutex;         // running vs freeing, when threads share a graph
  bool released = false;    // saved tensors and closure freed by a backward()
};

// Nodes alive in the process (for tests and teaching).
int64_t live_nodes();

}  // namespace tg::autograd
