// MacCounter: a thread-local chain of nested counters.
#include "ops/mac_counter.h"

#include <cstdint>

namespace ska {

namespace {
thread_local MacCounter* innermost = nullptr;
}  // namespace

MacCounter::MacCounter() : outer_(innermost) { innermost = this; }
MacCounter::~MacCounter() { innermost = outer_; }

MacCountingPause::MacCountingPause() : saved_(innermost) { innermost = nullptr; }
MacCountingPause::~MacCountingPause() { innermost = saved_; }

void MacCounter::add(int64_t macs) {
  for (MacCounter* c = innermost; c != nullptr; c = c->outer_) c->total_ += macs;
}

}  // namespace ska
