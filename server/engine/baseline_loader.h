// Loads a run's reference curves (docs/baselines.md) from the store on a
// thread of its own, so that neither a gRPC handler nor a shard waits on the
// disk: each reference's lead-rank, post-warmup records, reduced to what the
// band reads (health/signals/baseline_band.h).
//
// Thread-safe: Load() may be called from any thread; `done` runs on the
// loader's thread and must not block (the engine posts to the run's shard).
#ifndef TRAINWATCH_SERVER_ENGINE_BASELINE_LOADER_H_
#define TRAINWATCH_SERVER_ENGINE_BASELINE_LOADER_H_

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "health/signals/baseline_band.h"
#include "store/store.h"

namespace trainwatch {

// The reference runs `refs` read from `store`: each attempt's lead rank,
// from its RunStart's warmup on. A reference that is not stored is left out
// (a run may name one that has not run yet); null when none is left.
absl::StatusOr<std::shared_ptr<const BaselineReferences>> ReadReferences(
    const Store& store, const std::vector<v1::BaselineRef>& refs, const std::string& source);

class BaselineLoader {
 public:
  using Done = std::function<void(std::shared_ptr<const BaselineReferences>)>;

  explicit BaselineLoader(const Store* store);
  ~BaselineLoader();  // Stop()
  BaselineLoader(const BaselineLoader&) = delete;
  BaselineLoader& operator=(const BaselineLoader&) = delete;

  // Reads `refs` and calls `done` with them (null: none could be read; the
  // error is logged). After Stop(), calls `done(nullptr)` at once.
  void Load(std::vector<v1::BaselineRef> refs, std::string source, Done done);
  // Finishes the queued loads and stops the thread.
  void Stop();

 private:
  struct Job {
    std::vector<v1::BaselineRef> refs;
    std::string source;
    Done done;
  };
  void Loop();

  const Store* const store_;
  absl::Mutex mu_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_ENGINE_BASELINE_LOADER_H_
