// The tape and the backward walk.
//
// Every op that sees an input requiring grad (while grad mode is on) calls
// record(), which appends a Node to the thread's tape in execution order.
// backward() seeds dL/dL and walks the tape in reverse: each node reached by a
// gradient runs its closure and accumulates (+=) into its inputs' nodes or
// leaves. Execution order is a topological order, so reverse order is valid.
#pragma once
#include <initializer_list>
#include <vector>

#include "autograd/node.h"

namespace tg::autograd {

// Records `out` as produced by op `name` from `inputs`. Returns `out` with
// grad_fn set, or untouched when grad mode is off or no input requires grad.
Tensor record(const char* name, Tensor out, const std::vector<Tensor>& inputs,
              std::vector<Tensor> saved, BackwardFn backward);

void backward(const Tensor& root, const Tensor& seed, bool retain_graph);

const std::string& node_name(const Node& node);

// Nodes on this thread's tape that are still alive (for tests and teaching).
size_t tape_size();

}  // namespace tg::autograd
