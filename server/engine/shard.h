// A single thread that runs tasks posted to it, in two lanes: prompt tasks
// (a live trainer's small batches) run before normal ones (bulk batches of
// a replay or a client catching up), each lane in the order posted. The
// engine keeps each run on one shard, so a run's state needs no lock, and
// posts a stream's work to the prompt lane only while none of it waits in
// the normal lane, so each stream's messages are processed in the order they
// arrived. A bad step in a small batch is then not detected behind the
// backlog of healthy bulk ones.
#ifndef TRAINWATCH_SERVER_ENGINE_SHARD_H_
#define TRAINWATCH_SERVER_ENGINE_SHARD_H_

#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace trainwatch {

// Thread-safe: Post() and Stop() may be called from any thread. A Shard is
// also the capability that guards state only its tasks may touch
// (ABSL_GUARDED_BY(shard)): a task calls AssertOnShard() before touching it.
class ABSL_LOCKABLE Shard {
 public:
  Shard();
  ~Shard();  // Stop()
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  enum class Lane { kNormal, kPrompt };

  // Queues a task; after Stop() the task runs on the caller's thread, so a
  // callback waiting on it is never lost. Before each normal task, every
  // prompt task queued runs (and a normal task runs after each such round,
  // so prompt tasks cannot starve normal ones).
  void Post(std::function<void()> task, Lane lane = Lane::kNormal)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Runs every queued task, then ends the thread. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Tells clang's thread-safety analysis that the caller is one of this
  // shard's tasks (so tasks of one shard never overlap); checks nothing at
  // run time.
  void AssertOnShard() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  void Loop();

  absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  std::deque<std::function<void()>> prompt_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_ENGINE_SHARD_H_
