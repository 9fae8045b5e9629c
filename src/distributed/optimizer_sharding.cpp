// Sharded optimizer state (see optimizer_sharding.h).
#include "distributed/optimizer_sharding.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "ops/shape_ops.h"
#include "optim/grad_utils.h"

namespace ska::dist {

OptimizerSharding::OptimizerSharding(const optim::NamedTensors& params, Communicator& comm)
    : comm_(comm), params_(params) {
  const int world = comm.world_size();
  by_owner_.assign(static_cast<size_t>(world), {});
  owned_numel_.assign(static_cast<size_t>(world), 0);
  // Largest first, each to the least loaded worker (ties: the lower rank): deterministic, so
  // every worker computes the same split.
  std::vector<size_t> order(params_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return params_[a].second.numel() > params_[b].second.numel();
  });
  for (size_t i : order) {
    const auto least = std::min_element(owned_numel_.begin(), owned_numel_.end());
    const int r = static_cast<int>(least - owned_numel_.begin());
    *least += params_[i].second.numel();
    owner_[params_[i].first] = r;
    by_owner_[static_cast<size_t>(r)].push_back(i);
  }
  for (auto& list : by_owner_) std::sort(list.begin(), list.end());  // registration order
}

int OptimizerSharding::owner(const std::string& param) const {
  const auto it = owner_.find(param);
  SKA_CHECK(it != owner_.end(), ValueError, "sharded optimizer: no parameter named '", param,
            "'");
  return it->second;
}

void OptimizerSharding::before_step(optim::Optimizer& optimizer) {
  TensorList all;
  for (const auto& [name, p] : params_) all.push_back(p);
  optimizer.set_global_grad_norm(optim::grad_norm(all));
  for (const auto& [name, p] : params_) {
    if (!owns(name)) p.zero_grad();
  }
}

void OptimizerSharding::after_step() {
  NoGradGuard no_grad;
  for (int r = 0; r < comm_.world_size(); ++r) {
    const std::vector<size_t>& mine = by_owner_[static_cast<size_t>(r)];
    if (mine.empty()) continue;
    TensorList pieces;
    for (size_t i : mine) pieces.push_back(params_[i].second.reshape({-1}));
    Tensor flat = cat(pieces, 0).contiguous();
    comm_.broadcast(flat, r);
    int64_t offset = 0;
    for (size_t i : mine) {
      const Tensor& p = params_[i].second;
      Tensor target = p;  // parameters are contiguous leaves: write through a view of them
      target.copy_(flat.narrow(0, offset, p.numel()).view(p.shape()));
      offset += p.numel();
    }
  }
}

std::map<std::string, Tensor> OptimizerSharding::gather_state(const optim::Optimizer& optimizer) {
  const std::string mine = pack_tensors(optimizer.state_dict());
  std::map<std::string, Tensor> full;
  for (int r = 0; r < comm_.world_size(); ++r) {
    const std::string bytes = broadcast_bytes(comm_, r == comm_.rank() ? mine : std::string(), r);
    if (comm_.rank() != 0) continue;
    for (auto& [key, value] : unpack_tensors(bytes)) full[key] = value;
  }
  return full;
}

std::map<std::string, Tensor> OptimizerSharding::local_state(
    const std::map<std::string, Tensor>& full) const {
  std::map<std::string, Tensor> out;
  for (const auto& [key, value] : full) {
    const size_t dot = key.rfind('.');  // "<parameter>.<slot>"; slots have no dots
    const std::string param = dot == std::string::npos ? key : key.substr(0, dot);
    const auto it = owner_.find(param);
    if (it == owner_.end() || it->second == comm_.rank()) out[key] = value;  // unknown: the
  }                                                                           // optimizer says
  return out;
}

namespace {

template <typename T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

template <typename T>
T take(const std::string& in, size_t& pos) {
  SKA_CHECK(pos + sizeof(T) <= in.size(), IOError, "packed tensors: truncated at byte ", pos);
  T value;
  std::memcpy(&value, in.data() + pos, sizeof(T));
  pos += sizeof(T);
  return value;
}

std::string take_bytes(const std::string& in, size_t& pos, uint64_t n) {
  SKA_CHECK(n <= in.size() - pos, IOError, "packed tensors: truncated at byte ", pos);
  std::string out = in.substr(pos, n);
  pos += n;
  return out;
}

}  // namespace

std::string pack_tensors(const std::map<std::string, Tensor>& tensors) {
  std::string out;
  put<uint64_t>(out, tensors.size());
  for (const auto& [name, t] : tensors) {
    const Tensor host = t.to(Device::cpu()).contiguous();
    const std::string dtype = dtype_name(host.dtype());
    put<uint64_t>(out, name.size());
    out += name;
    put<uint64_t>(out, dtype.size());
    out += dtype;
    put<uint64_t>(out, host.shape().size());
    for (int64_t d : host.shape()) put<int64_t>(out, d);
    const uint64_t bytes = static_cast<uint64_t>(host.numel()) * host.element_size();
    put<uint64_t>(out, bytes);
    out.append(static_cast<const char*>(host.data_ptr()), bytes);
  }
  return out;
}

std::map<std::string, Tensor> unpack_tensors(const std::string& in) {
  std::map<std::string, Tensor> out;
  size_t pos = 0;
  const uint64_t count = take<uint64_t>(in, pos);
  for (uint64_t i = 0; i < count; ++i) {
    const std::string name = take_bytes(in, pos, take<uint64_t>(in, pos));
    const DType dtype = dtype_from_name(take_bytes(in, pos, take<uint64_t>(in, pos)));
    const uint64_t ndim = take<uint64_t>(in, pos);
    SKA_CHECK(ndim <= 16, IOError, "packed tensors: '", name, "' has ", ndim, " dims");
    Shape shape;
    for (uint64_t d = 0; d < ndim; ++d) shape.push_back(take<int64_t>(in, pos));
    const uint64_t bytes = take<uint64_t>(in, pos);
    const std::string data = take_bytes(in, pos, bytes);
    Tensor t = Tensor::empty(shape, dtype);
    SKA_CHECK(bytes == static_cast<uint64_t>(t.numel()) * t.element_size(), IOError,
              "packed tensors: '", name, "' has ", bytes, " bytes for shape ", shape_str(shape));
    std::memcpy(t.data_ptr(), data.data(), bytes);
    out[name] = t;
  }
  return out;
}

std::string broadcast_bytes(Communicator& comm, const std::string& bytes, int root) {
  Tensor size = Tensor::from_vector<int64_t>({static_cast<int64_t>(bytes.size())}, {1})
                    .to(comm.device());
  comm.broadcast(size, root);
  const int64_t n = size.to_vector<int64_t>()[0];
  // Eight bytes per i64 element (the communicators move f32, f64, i64 and bf16).
  Tensor words = Tensor::zeros({std::max<int64_t>((n + 7) / 8, 1)}, DType::kI64);
  if (comm.rank() == root) std::memcpy(words.data_ptr(), bytes.data(), bytes.size());
  words = words.to(comm.device());
  comm.broadcast(words, root);
  const Tensor host = words.to(Device::cpu());
  return std::string(static_cast<const char*>(host.data_ptr()), static_cast<size_t>(n));
}

}  // namespace ska::dist
