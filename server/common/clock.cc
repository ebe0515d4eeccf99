#include "common/clock.h"

namespace trainwatch {
namespace {

class RealClock final : public Clock {
 public:
  int64_t NowUnixNanos() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  int64_t MonotonicNanos() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  bool WaitUntil(absl::CondVar& cv, absl::Mutex& mu, int64_t deadline) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const int64_t left = deadline - MonotonicNanos();
    if (left <= 0) return true;
    return cv.WaitWithTimeout(&mu, absl::Nanoseconds(left));
  }
};

}  // namespace

const Clock* Clock::Real() {
  static const RealClock clock;
  return &clock;
}

}  // namespace trainwatch
