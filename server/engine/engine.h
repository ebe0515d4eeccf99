// The health engine: per-run state, sharded over threads by run id.
//
// Records reach it after the store has committed them (the engine asks the
// store to write, and processes what the store reports as fresh), so a record
// resent after a reconnect or a crash is counted once, and a record's effect
// is on /metrics before the trainer gets its ack.
//
// Today the engine keeps counters and last values per run (the metrics of
// DESIGN.md §5 that need no window); windows and detectors plug in at
// ProcessRecords().
//
// Threads: OpenStream/SubmitBatch/SubmitEvent/CloseStream may be called from
// any thread (gRPC reactors). A run's state is touched only by its shard.
// Completion callbacks run on the run's shard thread and must not block.
#ifndef TRAINWATCH_SERVER_ENGINE_ENGINE_H_
#define TRAINWATCH_SERVER_ENGINE_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "engine/shard.h"
#include "metrics/metrics.h"
#include "store/store.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

struct EngineOptions {
  // Engine threads; each run lives on one.
  size_t shards = 2;
  // Runs that have not finished; a new one past this is RESOURCE_EXHAUSTED.
  size_t max_active_runs = 10000;
};

struct RunState;

// One open Report stream, as the engine knows it.
struct Stream {
  StreamKey key;
  v1::RunStart start;
  RunState* run = nullptr;  // owned by the engine, outlives the stream
  Shard* shard = nullptr;
};
using StreamHandle = std::shared_ptr<const Stream>;
using DoneCallback = std::function<void(absl::Status)>;

class Engine {
 public:
  // Registers the runs the store knows that have not finished, so their last
  // step is on /metrics after a restart.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(EngineOptions options,
                                                        Store* store,
                                                        Metrics* metrics,
                                                        const Clock* clock);
  ~Engine();  // Stop()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // `start` must be validated. Stores the RunStart; `done` runs once durable.
  absl::StatusOr<StreamHandle> OpenStream(const v1::RunStart& start,
                                          DoneCallback done);
  // Commits the batch, then updates the run; `done` runs after both.
  void SubmitBatch(const StreamHandle& stream, v1::StepBatch batch,
                   DoneCallback done);
  void SubmitEvent(const StreamHandle& stream, v1::RunEvent event,
                   DoneCallback done);
  void CloseStream(const StreamHandle& stream);

  // Finishes queued work; later callbacks run inline. Call after the store
  // has closed, so every commit's callback has been posted.
  void Stop();

 private:
  Engine(EngineOptions options, Store* store, Metrics* metrics,
         const Clock* clock);
  RunState* FindOrAddRunLocked(const std::string& run_id, bool* added)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Shard* ShardFor(const std::string& run_id);
  void ProcessRecords(RunState& run, const Stream& stream,
                      const std::vector<v1::StepRecord>& records,
                      uint64_t client_dropped);
  void ProcessEvent(RunState& run, const v1::RunEvent& event);

  const EngineOptions options_;
  Store* const store_;
  Metrics* const metrics_;
  const Clock* const clock_;
  std::vector<std::unique_ptr<Shard>> shards_;

  std::mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<RunState>> runs_
      ABSL_GUARDED_BY(mu_);
  size_t active_runs_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_ENGINE_ENGINE_H_
