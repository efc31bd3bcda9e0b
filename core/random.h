// The global generator: a seed plus an offset that every draw advances, so
// successive random tensors differ and a recorded (seed, offset) replays one.
#pragma once
#include <cstdint>

#include "core/philox.h"

namespace tg {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : state_{seed, 0} {}
  void manual_seed(uint64_t seed) { state_ = {seed, 0}; }
  PhiloxState state() const { return state_; }
  // Returns the state for one draw and advances past it.
  PhiloxState next() {
    const PhiloxState s = state_;
    ++state_.offset;
    return s;
  }

 private:
  PhiloxState state_;
};

Generator& default_generator();
inline void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace tg
