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
};

}  // namespace

const Clock* Clock::Real() {
  static const RealClock clock;
  return &clock;
}

}  // namespace trainwatch
