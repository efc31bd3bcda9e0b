// Recording ops and the backward walk.
//
// An op that sees an input requiring grad (while grad mode is on) calls
// record(), which makes a Node with edges to its inputs' nodes and hangs it on
// the output as grad_fn. backward(root) finds the nodes reachable from the
// root, counts for each how many reachable consumers feed it, and runs them in
// that dependency order (each node after every consumer of its output, as
// PyTorch and micrograd do), accumulating with += the gradient each input
// receives. All of that state is local to the call, so other threads' graphs
// and later calls are never touched; leaves' .grad() are updated only after
// the whole walk succeeded (a backward that throws changes no .grad()). The
// nodes it ran before the throw are freed as usual unless retain_graph.
#pragma once
#include <vector>

#include "autograd/node.h"
#include "autograd/op_list.h"

namespace tg::autograd {

// Which of `inputs` need a gradient if an op records now: grad mode on, the
// input defined and requiring grad. Ops use it to decide what to save.
GradMask grad_mask(const std::vector<Tensor>& inputs);

// `t` when `keep`, else an undefined tensor: for saving only what the needed
// gradients read, e.g. saved = {keep_if(needs[1], a), keep_if(needs[0], b)}.
inline Tensor keep_if(bool keep, const Tensor& t) { return keep ? t : Tensor(); }

// f() when `needed`, else an undefined tensor: a backward closure computes
// only the gradients its mask asks for.
template <class F>
Tensor grad_if(bool needed, const F& f) {
  return needed ? f() : Tensor();
}

// Records `out` as produced by `op` from `inputs`. Returns `out` with grad_fn
// set, or untouched when grad mode is off or no input requires grad.
Tensor record(OpId op, Tensor out, const std::vector<Tensor>& inputs, std::vector<Tensor> saved, BackwardFn backward);
// The same for an op defined outside the library (any name).
Tensor record(std::string name, Tensor out, const std::vector<Tensor>& inputs, std::vector<Tensor> saved,
              BackwardFn backward);

void backward(const Tensor& root, const Tensor& seed, bool retain_graph);

// Called for every node a backward() on this thread runs, in the order it
// runs them, with the gradient of the node's output and the gradients it
// returned (for teaching and debugging: examples/derivations --layer).
using BackwardObserver =
    std::function<void(const Node& node, const Tensor& grad_out, const std::vector<Tensor>& grad_inputs)>;

// Installs an observer for its lifetime (nested guards restore the outer one).
class ObserveBackward {
 public:
  explicit ObserveBackward(BackwardObserver observer);
  ~ObserveBackward();
  ObserveBackward(const ObserveBackward&) = delete;
  ObserveBackward& operator=(const ObserveBackward&) = delete;

 private:
  BackwardObserver previous_;
};

const std::string& node_name(const Node& node);

}  // namespace tg::autograd
