// The global generator: a seed plus an offset that every draw advances, so
// successive random tensors differ and a recorded (seed, offset) replays one.
#pragma once
#include <cstdint>
#include <mutex>

#include "core/philox.h"

namespace tg {

// Thread-safe: every member locks, so threads drawing at once get distinct offsets.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : state_{seed, 0} {}
  void manual_seed(uint64_t seed) {
    std::lock_guard<std::mutex> lock(mutex_);
    state_ = {seed, 0};
  }
  PhiloxState state() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return state_;
  }
  void set_state(PhiloxState s) {
    std::lock_guard<std::mutex> lock(mutex_);
    state_ = s;
  }
  // Returns the state for one draw and advances past it.
  PhiloxState next() {
    std::lock_guard<std::mutex> lock(mutex_);
    const PhiloxState s = state_;
    ++state_.offset;
    return s;
  }

 private:
  mutable std::mutex mutex_;
  PhiloxState state_;
};

Generator& default_generator();
inline void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace tg
