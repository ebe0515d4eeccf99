// Time source for everything in the server that reads the clock, so tests can
// run windows, timeouts and retention on a fake one.
#ifndef TRAINWATCH_SERVER_COMMON_CLOCK_H_
#define TRAINWATCH_SERVER_COMMON_CLOCK_H_

#include <atomic>
#include <chrono>
#include <cstdint>

namespace trainwatch {

// Thread-safe: implementations must allow concurrent calls.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t NowUnixNanos() const = 0;

  // The process-wide real clock.
  static const Clock* Real();
};

// A clock that only moves when told to. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_unix_nanos = 1'700'000'000'000'000'000)
      : now_(start_unix_nanos) {}
  int64_t NowUnixNanos() const override { return now_.load(); }
  void Advance(std::chrono::nanoseconds d) { now_ += d.count(); }
  void Set(int64_t unix_nanos) { now_.store(unix_nanos); }

 private:
  std::atomic<int64_t> now_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_COMMON_CLOCK_H_
