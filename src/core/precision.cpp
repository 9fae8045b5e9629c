#include "core/precision.h"

#include <atomic>

namespace ska {
namespace {
std::atomic<bool> g_matmul{false};
std::atomic<bool> g_conv{true};
}  // namespace

Tf32Policy tf32_policy() { return {g_matmul.load(), g_conv.load()}; }

void set_tf32_policy(Tf32Policy policy) {
  g_matmul.store(policy.matmul);
  g_conv.store(policy.conv);
}

}  // namespace ska
