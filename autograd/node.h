// A node of the tape: one recorded op. It holds edges to its inputs, the
// tensors its backward needs (with their versions at save time), the backward
// closure, and the gradient of its output accumulated so far.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tg::autograd {

struct Node;

// Where an input's gradient goes: into a producing node, or into a leaf's .grad().
struct Edge {
  std::shared_ptr<Node> node;
  std::shared_ptr<TensorImpl> leaf;
  Shape shape;  // the input's shape; the gradient must have it
};

// Tensors saved for backward. Reading one checks that no in-place write has
// happened since it was saved.
class SavedTensors {
 public:
  SavedTensors() = default;
  SavedTensors(std::vector<Tensor> tensors, std::string op);
  const Tensor& operator[](size_t i) const;
  void release() { tensors_.clear(); }

 private:
  std::vector<Tensor> tensors_;
  std::vector<uint64_t> versions_;
  std::string op_;
};

// Given dL/d(output) and the saved tensors, returns dL/d(input) per input
// (an undefined Tensor where an input gets no gradient).
using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_out, const SavedTensors& saved)>;

struct Node {
  std::string name;
  std::vector<Edge> edges;
  SavedTensors saved;
  BackwardFn backward;
  Tensor grad;  // dL/d(output), accumulated by consumers
  bool released = false;
};

}  // namespace tg::autograd
