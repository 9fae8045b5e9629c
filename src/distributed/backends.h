// What the communicator backends share inside src/distributed: their factories, the checks of the
// tensors they take, and the wording of a failed collective.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/store.h"

namespace ska::dist::detail {

// Gloo over TCP for CPU tensors (gloo_communicator.cpp).
std::unique_ptr<Communicator> make_gloo_communicator(const World& world,
                                                     std::shared_ptr<Store> store,
                                                     const CommOptions& options);
// NCCL for CUDA tensors on `device` (nccl_communicator.cpp; DeviceError in a build without it).
std::unique_ptr<Communicator> make_nccl_communicator(const World& world, Device device,
                                                     std::shared_ptr<Store> store,
                                                     const CommOptions& options);

// "8 B", "512 KB", "4.2 MB": sizes in failure messages (powers of 1000, as network rates are).
std::string format_bytes(size_t bytes);
// "all_reduce of 4.2 MB at step 1200" ("all_reduce of 4.2 MB" without a label).
std::string describe_collective(const std::string& name, size_t bytes, const std::string& label);
// "rank 1", "ranks 1, 3", or `otherwise` when `ranks` is empty.
std::string name_ranks(const std::vector<int>& ranks, const std::string& otherwise);

// A defined, contiguous tensor on `device`; with `reduce`, of a dtype the backends reduce.
void check_collective_tensor(const char* collective, const Tensor& t, Device device, bool reduce);

// How a failed rank tells the others what happened to it, through the store (best effort: the
// store dies with rank 0).
void report_failure(Store& store, int rank, const std::string& message);
// What `rank` reported, or "" when nothing (or the store cannot be reached).
std::string reported_failure(Store& store, int rank);
// After this rank timed out: the other ranks that report no failure within a grace period, i.e.
// those everybody waited for. Empty when the store cannot tell.
std::vector<int> silent_ranks(Store& store, int rank, int world_size);

}  // namespace ska::dist::detail
