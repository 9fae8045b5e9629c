// The autograd graph: a Node per recorded op, Edges to the nodes of its inputs, and the helper
// ops use to record themselves (record_op).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/tensor.h"

namespace ska::autograd {

class Node;

// Where a gradient flows: input `input_nr` of node `fn` (null fn: input needs no gradient).
struct Edge {
  std::shared_ptr<Node> fn;
  int input_nr = 0;
};

// What backward needs to materialise a zero gradient for an output nobody used.
struct OutputMeta {
  Shape shape;
  DType dtype;
  Device device;
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node() = default;
  virtual std::string name() const = 0;
  // Given the gradients of this node's outputs (undefined where an output got none), returns the
  // gradients of its inputs, one per edge (undefined where none flows).
  virtual TensorList apply(TensorList&& grad_outputs) = 0;
  // Drops saved tensors once backward has used them.
  virtual void release() {}

  std::vector<Edge> next_edges;
  std::vector<OutputMeta> outputs;
  uint64_t sequence_nr;  // creation order; later nodes run first in backward
};

// Gradient sink of a leaf tensor: accumulates into .grad and fires its grad-ready hooks.
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(std::weak_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {}
  std::string name() const override { return "AccumulateGrad"; }
  TensorList apply(TensorList&& grads) override;

 private:
  std::weak_ptr<TensorImpl> leaf_;
};

using BackwardFn = std::function<TensorList(const TensorList& grad_outputs)>;

// A node whose backward is a closure: the closure owns what it saved from the forward pass.
class FunctionNode : public Node {
 public:
  FunctionNode(std::string name, BackwardFn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  std::string name() const override { return name_; }
  TensorList apply(TensorList&& grads) override;
  void release() override { fn_ = nullptr; }

 private:
  std::string name_;
  BackwardFn fn_;
};

// True when an op over `inputs` must record history (grad mode on, some input requires grad).
bool needs_grad(const TensorList& inputs);

// Records op `name` with `inputs` and `outputs` when needs_grad(inputs): creates the node, points
// the outputs at it, and returns true. `backward` maps output grads (zeros filled in for unused
// outputs) to one grad per input (undefined for inputs that need none).
bool record_op(const char* name, const TensorList& inputs, const TensorList& outputs,
               BackwardFn backward);

// Runs backward from `roots` with seed gradients `grads`.
void run_backward(const TensorList& roots, const TensorList& grads);

}  // namespace ska::autograd
