// Grad mode: whether ops record onto the tape. tg::NoGradGuard turns it off for
// a scope, like `with torch.no_grad():`.
#pragma once

namespace tg::autograd {

class GradMode {
 public:
  static bool enabled();
  static void set_enabled(bool on);
};

class NoGradGuard {
 public:
  NoGradGuard() : prev_(GradMode::enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace tg::autograd

namespace tg {
using autograd::NoGradGuard;
}
