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
  // A tensor the producer of output `output_nr`'s gradient may write that gradient into
  // (grad_destination), or undefined: the default. AssemblyNode's are views of its input's
  // gradient.
  virtual Tensor gradient_destination(int output_nr);

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

// A node whose input's gradient is its outputs' gradients put together, each output's the view
// piece(z, i) of the input's gradient z (split, chunk, split_heads; a slice, its one piece
// `partial`: zeros around it). z is made at the first request for a destination
// (gradient_destination), in the tensor the node's own input's producer offers where it offers
// one (chained up the graph), else by `make`; the gradients written there in place need no copy,
// and the backward pass copies in only the others (zeros for an output that got none).
class AssemblyNode : public Node {
 public:
  using PieceFn = std::function<Tensor(const Tensor& z, size_t i)>;
  using MakeFn = std::function<Tensor(DType dtype, Device device)>;
  AssemblyNode(std::string name, Shape shape, PieceFn piece, MakeFn make, bool partial)
      : name_(std::move(name)),
        shape_(std::move(shape)),
        piece_(std::move(piece)),
        make_(std::move(make)),
        partial_(partial) {}
  std::string name() const override { return name_; }
  TensorList apply(TensorList&& grads) override;
  void release() override { z_ = Tensor(); }
  Tensor gradient_destination(int output_nr) override;

 private:
  Tensor& gradient(DType dtype, Device device);

  std::string name_;
  Shape shape_;  // the input's
  PieceFn piece_;
  MakeFn make_;
  bool partial_;  // the pieces leave zeros in z
  Tensor z_;      // the input's gradient, once made
};

// True when an op over `inputs` must record history (grad mode on, some input requires grad).
bool needs_grad(const TensorList& inputs);

// Records op `name` with `inputs` and `outputs` when needs_grad(inputs): creates the node, points
// the outputs at it, and returns true. `backward` maps output grads (zeros filled in for unused
// outputs) to one grad per input (undefined for inputs that need none).
bool record_op(const char* name, const TensorList& inputs, const TensorList& outputs,
               BackwardFn backward);

// Records an op whose outputs are views of `input` (AssemblyNode): the gradient of output i is
// piece(z, i) of the gradient z of `input`, made by make(dtype, device) unless offered; with
// `partial` the pieces do not cover z, whose rest is zero.
bool record_assembly(const char* name, const Tensor& input, const TensorList& outputs,
                     AssemblyNode::PieceFn piece, AssemblyNode::MakeFn make, bool partial = false);

// Inside a node's backward: a tensor to write the gradient of the node's input `input_nr` into,
// of `shape`, `dtype` and `device`, for which `fits` holds (the layout the kernel can write),
// or undefined. One is offered when the input's node puts its own input's gradient together
// from its outputs' (AssemblyNode), while the input has no gradient yet and none was offered
// for it before. The backward returns the tensor as that gradient once it has written it all.
Tensor grad_destination(size_t input_nr, const Shape& shape, DType dtype, Device device,
                        const std::function<bool(const Tensor&)>& fits = {});
// The same for the gradient flowing along `edge` (an assembly chaining its own on), whatever
// its layout.
Tensor destination_for(const Edge& edge, const Shape& shape, DType dtype, Device device);

// Turns the offers off for a scope (tests compare against the copies they save).
class NoDestinationsGuard {
 public:
  NoDestinationsGuard();
  ~NoDestinationsGuard();
  NoDestinationsGuard(const NoDestinationsGuard&) = delete;
  NoDestinationsGuard& operator=(const NoDestinationsGuard&) = delete;

 private:
  bool prev_;
};

// Runs backward from `roots` with seed gradients `grads`.
void run_backward(const TensorList& roots, const TensorList& grads);

}  // namespace ska::autograd
