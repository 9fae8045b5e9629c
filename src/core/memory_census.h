// What is live at the peak: the tensors' storages counted by size at the high-water mark of their
// bytes (benchmark --memory-census), so that a peak can be read as "24 x 66 MiB, 48 x 33 MiB,
// one 600 MiB workspace" and two runs (a GPU's and the CPU's, or two kernel choices) compared.
#pragma once

#include <cstdint>
#include <vector>

#include "core/device.h"

namespace ska {

struct CensusEntry {
  int64_t bytes = 0;  // one storage's size
  int64_t count = 0;  // how many of that size were live
};

struct MemoryCensus {
  int64_t peak_bytes = 0;            // the counted storages' bytes at the mark
  int64_t peak_storages = 0;         // how many there were
  std::vector<CensusEntry> at_peak;  // by total (bytes x count), largest first
};

// While on, every Storage made on any device is counted by its size until it is freed, and each
// new high-water mark of a device's counted bytes keeps a copy of its counts. On the CPU what CPU
// kernels allocate for themselves (under a HostKernelScratch) is left out, as the CUDA rules'
// replay leaves it out. Off until enabled (then a locked map update per storage made or freed);
// enabling starts afresh: storages made before are not counted.
void set_memory_census(bool enabled);
// The marks restart from what is live now, on every device (as Allocator::reset_peak).
void reset_memory_census_peak();
MemoryCensus memory_census(Device device);

}  // namespace ska
