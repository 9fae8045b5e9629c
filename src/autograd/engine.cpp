// The backward pass: dependency counting over the recorded graph, then nodes run in reverse
// creation order as soon as all gradients for them have arrived.
#include <atomic>
#include <cstdint>
#include <queue>
#include <set>
#include <unordered_map>
#include <utility>

#include "autograd/node.h"
#include "ops/autocast.h"
#include "ops/pointwise.h"

namespace ska {

namespace {
thread_local bool grad_enabled = true;
std::atomic<uint64_t> next_sequence_nr{0};
}  // namespace

bool GradMode::is_enabled() { return grad_enabled; }
void GradMode::set_enabled(bool on) { grad_enabled = on; }

namespace autograd {

namespace {

thread_local bool destinations_enabled = true;

// The backward pass running on this thread, as grad_destination sees it: the gradients delivered
// so far, the destinations offered, and the node whose backward runs.
struct Run {
  std::unordered_map<Node*, TensorList>* buffers = nullptr;
  std::set<std::pair<const Node*, int>> offered;
  Node* current = nullptr;
};
thread_local Run* current_run = nullptr;

// Sets current_run for a scope (a backward pass inside a backward keeps its own).
class RunScope {
 public:
  explicit RunScope(Run* run) : prev_(current_run) { current_run = run; }
  ~RunScope() { current_run = prev_; }
  RunScope(const RunScope&) = delete;
  RunScope& operator=(const RunScope&) = delete;

 private:
  Run* prev_;
};

Tensor offer(const Edge& e, const Shape& shape, DType dtype, Device device,
             const std::function<bool(const Tensor&)>& fits) {
  Run* run = current_run;
  if (run == nullptr || !destinations_enabled || !e.fn) return {};
  const auto delivered = run->buffers->find(e.fn.get());
  if (delivered != run->buffers->end() &&
      static_cast<size_t>(e.input_nr) < delivered->second.size() &&
      delivered->second[static_cast<size_t>(e.input_nr)].defined()) {
    return {};  // a gradient is in: the next one is added to it
  }
  const std::pair<const Node*, int> key{e.fn.get(), e.input_nr};
  if (run->offered.count(key) != 0) return {};
  Tensor d = e.fn->gradient_destination(e.input_nr);
  if (!d.defined() || d.shape() != shape || d.dtype() != dtype || d.device() != device ||
      (fits && !fits(d))) {
    return {};
  }
  run->offered.insert(key);
  return d;
}

}  // namespace

Node::Node() : sequence_nr(next_sequence_nr++) {}

Tensor Node::gradient_destination(int /*output_nr*/) { return {}; }

Tensor grad_destination(size_t input_nr, const Shape& shape, DType dtype, Device device,
                        const std::function<bool(const Tensor&)>& fits) {
  const Run* run = current_run;
  if (run == nullptr || run->current == nullptr || input_nr >= run->current->next_edges.size()) {
    return {};
  }
  return offer(run->current->next_edges[input_nr], shape, dtype, device, fits);
}

Tensor destination_for(const Edge& edge, const Shape& shape, DType dtype, Device device) {
  return offer(edge, shape, dtype, device, {});
}

NoDestinationsGuard::NoDestinationsGuard() : prev_(destinations_enabled) {
  destinations_enabled = false;
}
NoDestinationsGuard::~NoDestinationsGuard() { destinations_enabled = prev_; }

Tensor& AssemblyNode::gradient(DType dtype, Device device) {
  if (z_.defined()) return z_;
  z_ = destination_for(next_edges[0], shape_, dtype, device);
  if (!z_.defined()) z_ = make_(dtype, device);
  if (partial_) z_.fill_(0.0);
  return z_;
}

Tensor AssemblyNode::gradient_destination(int output_nr) {
  const OutputMeta& meta = outputs[static_cast<size_t>(output_nr)];
  return piece_(gradient(meta.dtype, meta.device), static_cast<size_t>(output_nr));
}

TensorList AssemblyNode::apply(TensorList&& grads) {
  const Tensor* first = nullptr;
  for (const Tensor& g : grads) {
    if (g.defined()) {
      first = &g;
      break;
    }
  }
  const Tensor z = first != nullptr ? gradient(first->dtype(), first->device())
                                    : gradient(outputs[0].dtype, outputs[0].device);
  for (size_t i = 0; i < grads.size(); ++i) {
    Tensor piece = piece_(z, i);
    if (!grads[i].defined()) {
      piece.fill_(0.0);
    } else if (!grads[i].same_view(piece)) {
      piece.copy_(grads[i]);
    }
  }
  z_ = Tensor();
  return {z};
}

TensorList FunctionNode::apply(TensorList&& grads) {
  SKA_CHECK(fn_ != nullptr, AutogradError, "backward through '", name_,
            "' a second time: its saved values were freed after the first backward");
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) {
      grads[i] = Tensor::zeros(outputs[i].shape, outputs[i].dtype, outputs[i].device);
    }
  }
  return fn_(grads);
}

TensorList AccumulateGrad::apply(TensorList&& grads) {
  std::shared_ptr<TensorImpl> leaf = leaf_.lock();
  if (!leaf || !grads[0].defined()) return {};
  Tensor g = grads[0];
  if (g.dtype() != leaf->dtype) g = g.to(leaf->dtype);
  // .grad is owned by the leaf and may be updated in place (optimizers, all-reduce).
  if (!g.is_contiguous() || g.storage().use_count() > 1) g = g.clone();
  if (leaf->grad) {
    leaf->grad = add(Tensor(leaf->grad), g).impl_ptr();
  } else {
    leaf->grad = g.impl_ptr();
  }
  for (const GradHook& hook : leaf->grad_ready_hooks) hook(Tensor(leaf->grad));
  return {};
}

namespace {

std::shared_ptr<Node> grad_accumulator(const Tensor& leaf) {
  TensorImpl& impl = leaf.impl();
  std::shared_ptr<Node> acc = impl.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(leaf.impl_ptr());
    acc->outputs.push_back({leaf.shape(), leaf.dtype(), leaf.device()});
    impl.grad_accumulator = acc;
  }
  return acc;
}

Edge edge_of(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  if (t.grad_fn()) return {t.grad_fn(), t.impl().output_nr};
  return {grad_accumulator(t), 0};
}

struct LaterFirst {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr < b->sequence_nr; }
};

}  // namespace

bool needs_grad(const TensorList& inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

namespace {

// Points `node` at the edges of `inputs` and `outputs` at `node`.
void attach(const std::shared_ptr<Node>& node, const TensorList& inputs,
            const TensorList& outputs) {
  node->next_edges.reserve(inputs.size());
  for (const Tensor& t : inputs) node->next_edges.push_back(edge_of(t));
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    node->outputs.push_back({out.shape(), out.dtype(), out.device()});
    TensorImpl& impl = out.impl();
    impl.requires_grad = true;
    impl.grad_fn = node;
    impl.output_nr = static_cast<int>(i);
  }
}

}  // namespace

bool record_op(const char* name, const TensorList& inputs, const TensorList& outputs,
               BackwardFn backward) {
  if (!needs_grad(inputs)) return false;
  attach(std::make_shared<FunctionNode>(name, std::move(backward)), inputs, outputs);
  return true;
}

bool record_assembly(const char* name, const Tensor& input, const TensorList& outputs,
                     AssemblyNode::PieceFn piece, AssemblyNode::MakeFn make, bool partial) {
  if (!needs_grad({input})) return false;
  attach(std::make_shared<AssemblyNode>(name, input.shape(), std::move(piece), std::move(make),
                                        partial),
         {input}, outputs);
  return true;
}

void run_backward(const TensorList& roots, const TensorList& grads) {
  NoGradGuard no_grad;
  // Gradients keep the dtypes the forward pass chose; autocast would re-cast them.
  AutocastGuard no_autocast(DType::kBF16, false);
  // 1. Count, for every reachable node, how many edges point at it.
  std::unordered_map<Node*, int> deps;
  std::unordered_map<Node*, std::shared_ptr<Node>> keep_alive;
  std::vector<Node*> stack;
  std::vector<Edge> root_edges;
  for (const Tensor& r : roots) {
    SKA_CHECK(r.requires_grad(), AutogradError,
              "backward: tensor ", r.str(), " does not require grad and has no grad_fn");
    Edge e = edge_of(r);
    root_edges.push_back(e);
    if (keep_alive.emplace(e.fn.get(), e.fn).second) stack.push_back(e.fn.get());
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.fn) continue;
      ++deps[e.fn.get()];
      if (keep_alive.emplace(e.fn.get(), e.fn).second) stack.push_back(e.fn.get());
    }
  }
  // 2. Seed the roots' gradients.
  std::unordered_map<Node*, TensorList> buffers;
  Run run;
  run.buffers = &buffers;
  const RunScope scope(&run);
  auto deliver = [&](const Edge& e, const Tensor& g) {
    TensorList& buf = buffers[e.fn.get()];
    if (buf.empty()) buf.resize(e.fn->outputs.size());
    const OutputMeta& meta = e.fn->outputs[e.input_nr];
    SKA_CHECK(g.shape() == meta.shape, AutogradError, "backward of '", e.fn->name(),
              "': gradient of shape ", shape_str(g.shape()), " for an output of shape ",
              shape_str(meta.shape));
    Tensor& slot = buf[e.input_nr];
    slot = slot.defined() ? add(slot, g) : g;
  };
  for (size_t i = 0; i < roots.size(); ++i) deliver(root_edges[i], grads[i]);
  std::priority_queue<Node*, std::vector<Node*>, LaterFirst> ready;
  for (const Edge& e : root_edges) {
    if (deps[e.fn.get()] == 0) {
      ready.push(e.fn.get());
      deps[e.fn.get()] = -1;  // queued
    }
  }
  // 3. Run nodes once all their gradients are in; free what they saved.
  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    TensorList in = std::move(buffers[n]);
    buffers.erase(n);
    in.resize(n->outputs.size());
    run.current = n;
    TensorList out = n->apply(std::move(in));
    run.current = nullptr;
    n->release();
    for (size_t i = 0; i < n->next_edges.size(); ++i) {
      const Edge& e = n->next_edges[i];
      if (!e.fn) continue;
      if (i < out.size() && out[i].defined()) deliver(e, out[i]);
      if (--deps[e.fn.get()] == 0) ready.push(e.fn.get());
    }
  }
}

}  // namespace autograd
}  // namespace ska
