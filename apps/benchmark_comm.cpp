// benchmark_comm: all-reduce time and bandwidth over message sizes, reported as nccl-tests does
// (algbw = bytes / time, busbw = algbw x 2(n-1)/n), with Gloo on the CPU or NCCL on GPUs.
// Usage: benchmark_comm --nproc-per-node 4 [--device cpu|cuda] [--min 8] [--max 256M] [--json]
//        (or started by torchrun / srun / mpirun, which set the world in the environment)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app_common.h"
#include "backend/device_runtime.h"
#include "distributed/communicator.h"
#include "distributed/launcher.h"
#include "distributed/world.h"

namespace {

struct CommBenchOptions {
  std::string device = "cpu";
  int nproc_per_node = 0;  // 0: the world comes from the environment
  std::string min_size = "8";
  std::string max_size = "256M";
  int warmup = 5;
  int iters = 20;
  double timeout_s = 600;
  bool json = false;
};

struct Row {
  int64_t bytes;
  double time_us;
  double algbw_gbs;
  double busbw_gbs;
};

// "8", "64K", "256M", "1G" (powers of 1024, as nccl-tests' -b/-e take them).
int64_t parse_size(const std::string& text) {
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    SKA_FAIL(ska::ValueError, "'", text, "' is not a size such as 8, 64K, 256M or 1G");
  }
  std::string unit = text.substr(used);
  int64_t scale = unit.empty() ? 1 : unit == "K" ? 1 << 10 : unit == "M" ? 1 << 20
                                 : unit == "G"   ? int64_t(1) << 30
                                                 : 0;
  SKA_CHECK(scale > 0 && value > 0, ska::ValueError, "'", text,
            "' is not a size such as 8, 64K, 256M or 1G");
  return value * scale;
}

// The average over ranks of this rank's microseconds per all-reduce of `t`.
double time_all_reduce(ska::dist::Communicator& comm, const ska::Tensor& t,
                       const CommBenchOptions& o) {
  const ska::Device device = comm.device();
  for (int i = 0; i < o.warmup; ++i) comm.all_reduce(t);
  ska::synchronize(device);
  comm.barrier();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < o.iters; ++i) comm.all_reduce_async(t, ska::dist::ReduceOp::kSum)->wait();
  ska::synchronize(device);
  double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                  .count() / o.iters;
  ska::Tensor mean = ska::Tensor::full({1}, us, ska::DType::kF64, device);
  comm.all_reduce(mean, ska::dist::ReduceOp::kAverage);
  return mean.item();
}

void print_rows(const std::vector<Row>& rows, const ska::dist::Communicator& comm) {
  std::printf("# all_reduce (sum, f32) with %s over %d ranks on %s\n", comm.backend().c_str(),
              comm.world_size(), comm.device().str().c_str());
  std::printf("%14s %12s %12s %12s\n", "size (B)", "time (us)", "algbw (GB/s)", "busbw (GB/s)");
  for (const Row& r : rows) {
    std::printf("%14lld %12.1f %12.3f %12.3f\n", static_cast<long long>(r.bytes), r.time_us,
                r.algbw_gbs, r.busbw_gbs);
  }
}

void print_json(const std::vector<Row>& rows, const ska::dist::Communicator& comm) {
  nlohmann::json results = nlohmann::json::array();
  for (const Row& r : rows) {
    results.push_back({{"bytes", r.bytes}, {"time_us", r.time_us}, {"algbw_gbs", r.algbw_gbs},
                       {"busbw_gbs", r.busbw_gbs}});
  }
  nlohmann::json j = {{"collective", "all_reduce"}, {"backend", comm.backend()},
                      {"world_size", comm.world_size()}, {"device", comm.device().str()},
                      {"results", results}};
  std::cout << j.dump() << std::endl;
}

int run_worker(const CommBenchOptions& o) {
  using namespace ska;
  const dist::World world = dist::world_from_environment();
  Device device = apps::device_option(o.device);
  if (device.is_cuda() && o.device == "cuda") device = Device::cuda(world.local_rank);
  const int64_t min_bytes = parse_size(o.min_size), max_bytes = parse_size(o.max_size);
  SKA_CHECK(min_bytes <= max_bytes, ValueError, "--min ", o.min_size, " exceeds --max ",
            o.max_size);
  dist::CommOptions options;
  options.timeout_s = o.timeout_s;
  auto comm = dist::make_communicator(world, device, options);
  const int64_t max_elements = (max_bytes + 3) / 4;
  Tensor buffer = Tensor::ones({max_elements}, DType::kF32, device);
  const double n = comm->world_size();
  std::vector<Row> rows;
  for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    const int64_t elements = std::max<int64_t>(1, bytes / 4);
    comm->set_label(std::to_string(elements * 4) + " B");
    double us = time_all_reduce(*comm, buffer.narrow(0, 0, elements), o);
    double algbw = static_cast<double>(elements * 4) / us / 1e3;  // bytes per us -> GB/s
    rows.push_back({elements * 4, us, algbw, algbw * 2.0 * (n - 1) / n});
  }
  if (world.is_main()) o.json ? print_json(rows, *comm) : print_rows(rows, *comm);
  return 0;
}

// Starts this program again on nproc_per_node workers, with the same arguments.
int respawn(int argc, char** argv, const CommBenchOptions& o) {
  std::vector<std::string> args(argv, argv + argc);
  args[0] = "/proc/self/exe";
  ska::dist::LaunchOptions launch;
  launch.nproc_per_node = o.nproc_per_node;
  return ska::dist::launch_local_workers(args, launch);
}

}  // namespace

int main(int argc, char** argv) {
  CommBenchOptions o;
  CLI::App app{"All-reduce bus bandwidth over message sizes (nccl-tests' algbw and busbw)"};
  app.add_option("--device", o.device, "cpu (Gloo) or cuda (NCCL; cuda:N fixes the GPU)");
  app.add_option("--nproc-per-node", o.nproc_per_node,
                 "start this many workers on this machine (else the world comes from the "
                 "environment: torchrun, srun, mpirun)")
      ->check(ska::apps::integer_in(0, 1024));
  app.add_option("--min", o.min_size, "smallest message, bytes (K, M, G suffixes)");
  app.add_option("--max", o.max_size, "largest message; sizes double from --min");
  app.add_option("--warmup", o.warmup, "untimed all-reduces per size")
      ->check(ska::apps::integer_in(0, 1000000));
  app.add_option("--iters", o.iters, "timed all-reduces per size")
      ->check(ska::apps::integer_in(1, 1000000));
  app.add_option("--timeout", o.timeout_s, "seconds before a stuck collective fails");
  app.add_flag("--json", o.json, "print one JSON object (rank 0)");
  return ska::apps::run_main(app, argc, argv, [&] {
    // The workers it starts have RANK set and measure instead of starting more.
    if (o.nproc_per_node > 0 && !std::getenv("RANK")) return respawn(argc, argv, o);
    return run_worker(o);
  });
}
