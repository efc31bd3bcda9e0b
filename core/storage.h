// Storage: one allocation on one device, shared by every view of it. The
// version counter is bumped by in-place writes so autograd can detect that a
// tensor saved for backward was modified.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/device.h"

namespace tg {

class Storage {
 public:
  Storage(std::size_t nbytes, Device device);
  // Memory owned by someone else (tg::from_blob): never freed here.
  Storage(void* borrowed, std::size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }
  bool owned() const { return owned_; }  // false: tg::from_blob's borrowed memory

 private:
  void* data_ = nullptr;
  std::size_t nbytes_ = 0;
  Device device_;
  std::atomic<uint64_t> version_{0};
  bool owned_ = true;
};

}  // namespace tg
