// A single thread that runs tasks in the order they were posted. The engine
// keeps each run on one shard, so a run's state needs no lock and its records
// are processed in the order the store committed them.
#ifndef TRAINWATCH_SERVER_ENGINE_SHARD_H_
#define TRAINWATCH_SERVER_ENGINE_SHARD_H_

#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace trainwatch {

// Thread-safe: Post() and Stop() may be called from any thread.
class Shard {
 public:
  Shard();
  ~Shard();  // Stop()
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  // Queues a task; after Stop() the task runs on the caller's thread, so a
  // callback waiting on it is never lost.
  void Post(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);

  // Runs every queued task, then ends the thread. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop();

  absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_ENGINE_SHARD_H_
