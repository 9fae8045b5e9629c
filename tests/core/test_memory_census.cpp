// The memory census (core/memory_census.h): the storages live at the high-water mark of their
// bytes, counted by size, against what the test made and freed.
#include <catch2/catch.hpp>
#include <optional>
#include <vector>

#include "core/allocator.h"
#include "core/memory_census.h"
#include "core/tensor.h"

namespace {

using ska::CensusEntry;
using ska::Device;
using ska::DType;
using ska::Tensor;

Tensor bytes(int64_t n) { return Tensor::empty({n}, DType::kU8, Device::cpu()); }

bool same(const std::vector<CensusEntry>& got, const std::vector<CensusEntry>& want) {
  if (got.size() != want.size()) return false;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].bytes != want[i].bytes || got[i].count != want[i].count) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("memory census: the storages live at the peak, by size, largest total first",
          "[cpu][allocator]") {
  const Tensor before = bytes(777);  // made before the census: never counted
  ska::set_memory_census(true);
  {
    std::vector<Tensor> a = {bytes(1000), bytes(1000), bytes(1000)};
    std::vector<Tensor> b = {bytes(4000), bytes(4000)};
    a.pop_back();                            // 2 x 1000 + 2 x 4000 live: 10,000 < 11,000 so far
    std::optional<Tensor> c = bytes(10000);  // the peak: 20,000 bytes in 5 storages
    {
      const ska::HostKernelScratch kernel(true);
      const Tensor scratch = bytes(50000);  // a CPU kernel's own: left out
    }
    const ska::MemoryCensus m = ska::memory_census(Device::cpu());
    CHECK(m.peak_bytes == 20000);
    CHECK(m.peak_storages == 5);
    CHECK(same(m.at_peak, {{10000, 1}, {4000, 2}, {1000, 2}}));
    c.reset();
    b.clear();
  }
  // What was freed leaves the peak as it was; the mark restarts from what is live (nothing).
  CHECK(ska::memory_census(Device::cpu()).peak_bytes == 20000);
  ska::reset_memory_census_peak();
  CHECK(ska::memory_census(Device::cpu()).peak_bytes == 0);
  CHECK(ska::memory_census(Device::cpu()).at_peak.empty());
  {
    const Tensor x = bytes(300), y = bytes(300), z = bytes(5000);
    const ska::MemoryCensus m = ska::memory_census(Device::cpu());
    CHECK(m.peak_bytes == 5600);
    CHECK(same(m.at_peak, {{5000, 1}, {300, 2}}));
  }
  // Off: nothing more is counted, and a storage freed after does not go below zero.
  const Tensor kept = bytes(900);
  ska::set_memory_census(false);
  {
    const Tensor big = bytes(1 << 20);
    CHECK(ska::memory_census(Device::cpu()).peak_bytes == 5600);
  }
  // On again: afresh, without the storages counted before.
  ska::set_memory_census(true);
  { const Tensor w = bytes(64); }
  CHECK(ska::memory_census(Device::cpu()).peak_bytes == 64);
  ska::set_memory_census(false);
  CHECK(ska::memory_census(Device::cuda(0)).peak_bytes == 0);  // no storage there
}
