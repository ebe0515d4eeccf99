// Time source for everything in the server that reads the clock or waits
// for a time, so tests can run windows, timeouts, backoffs and retention on
// a fake one (leveldb's Env, for time). The store's retries and close
// timeout and the notifier's backoff wait on it.
#ifndef TRAINWATCH_SERVER_COMMON_CLOCK_H_
#define TRAINWATCH_SERVER_COMMON_CLOCK_H_

#include <atomic>
#include <chrono>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace trainwatch {

// Thread-safe: implementations must allow concurrent calls.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t NowUnixNanos() const = 0;
  // For durations and deadlines: never goes back (the real one is
  // std::chrono::steady_clock; a fake one is NowUnixNanos).
  virtual int64_t MonotonicNanos() const { return NowUnixNanos(); }
  // Waits on `cv` until it is signalled or MonotonicNanos() reaches
  // `deadline`; true if the deadline has passed. May return early: callers
  // wait in a loop on their own condition.
  virtual bool WaitUntil(absl::CondVar& cv, absl::Mutex& mu, int64_t deadline) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;

  // The process-wide real clock.
  static const Clock* Real();
};

// A clock that only moves when told to. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_unix_nanos = 1'700'000'000'000'000'000)
      : now_(start_unix_nanos) {}
  int64_t NowUnixNanos() const override { return now_.load(); }
  // Its time moves only when told: it checks every millisecond of real time
  // whether it was told to move past `deadline`.
  bool WaitUntil(absl::CondVar& cv, absl::Mutex& mu, int64_t deadline) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (now_.load() >= deadline) return true;
    cv.WaitWithTimeout(&mu, absl::Milliseconds(1));
    return now_.load() >= deadline;
  }
  void Advance(std::chrono::nanoseconds d) { now_ += d.count(); }
  void Set(int64_t unix_nanos) { now_.store(unix_nanos); }

 private:
  std::atomic<int64_t> now_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_COMMON_CLOCK_H_
