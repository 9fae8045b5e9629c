// A reference-counted block of memory on one device; tensors are views into a Storage.
#pragma once

#include <memory>

#include "core/allocator.h"
#include "core/device.h"

namespace ska {

class Storage {
 public:
  Storage(size_t nbytes, Device device, Allocator* allocator = nullptr);  // default allocator
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  bool pinned() const;

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  Allocator* allocator_;
};

}  // namespace ska
