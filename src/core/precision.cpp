// Process-wide numeric policies of the CUDA backend: TF32 and cuDNN algorithm benchmarking.
#include "core/precision.h"

#include <atomic>

namespace ska {
namespace {
std::atomic<bool> g_matmul{false};
std::atomic<bool> g_conv{true};
std::atomic<bool> g_cudnn_benchmark{false};
std::atomic<bool> g_cudnn_deterministic{false};
}  // namespace

Tf32Policy tf32_policy() { return {g_matmul.load(), g_conv.load()}; }

void set_tf32_policy(Tf32Policy policy) {
  g_matmul.store(policy.matmul);
  g_conv.store(policy.conv);
}

bool cudnn_benchmark() { return g_cudnn_benchmark.load(); }
void set_cudnn_benchmark(bool enabled) { g_cudnn_benchmark.store(enabled); }

bool cudnn_deterministic() { return g_cudnn_deterministic.load(); }
void set_cudnn_deterministic(bool enabled) { g_cudnn_deterministic.store(enabled); }

}  // namespace ska
