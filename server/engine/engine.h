// The health engine: the concurrency around the health library. Each run's
// RunPipeline (server/health) lives on one shard thread, chosen by run id;
// the engine adds the threads, the store and the timers around it.
//
// Records are processed on the run's shard as they arrive, before their
// commit, so an alert does not wait behind the store's queue; the shard then
// hands the batch to the store, and the trainer gets its ack once the batch
// is committed (so a record's effect is on /metrics before its ack). The
// engine counts a record once: per stream (rank, attempt) it remembers the
// last step it processed, starting from the last step the store holds, so a
// batch resent after a reconnect or a crash is neither counted twice by the
// engine nor stored twice by the store (which dedups the same way).
//
// A small batch (at most prompt_batch_records: a live trainer's, sent as it
// trains) is processed before bulk batches queued on its shard (a replay, a
// client catching up), so a bad step is not detected behind a healthy
// backlog; never before its own stream's earlier messages.
//
// Each run's pipeline picks the lead stream, dedups, rewinds and feeds the
// detectors (health/run/run_pipeline.h); what it reports goes through the run's
// AlertRouter (engine/alert_router.h) to the store, /metrics and the
// notifier. At start the engine rebuilds the windows, baselines and alert
// states of unfinished runs from the store (engine/recovery.cc), without
// firing again.
//
// A run that reported RUN_FINISHED or RUN_FAILED keeps its live state and
// series for `finished_runs.retention_seconds`, then the engine forgets it
// (once no stream of it is open): its alerts still firing are resolved, its
// series leave /metrics and its memory is freed, as after a restart. A run
// that starts again later begins with fresh windows. A restart forgets
// finished runs at once.
//
// Threads: OpenStream/SubmitBatch/SubmitEvent/GetHealth may be called from
// any thread; one stream's messages are submitted one at a time, in order
// (ingest's reactor has one read in flight). A run's pipeline and router,
// and a stream's held work, are touched only by the run's shard thread;
// Engine::mu_ guards the table of runs. Completion callbacks (`done`) run
// on the store's writer thread once the op's transaction ended, or on the
// run's shard thread when the op is refused before the store (its stream's
// RunStart failed) and for a stored event; `processed` runs on the shard.
// None may block. Once the store is closed or the engine stopped, callbacks
// run inline on the thread that submits (the server drains ingest first, so
// no stream submits then).
#ifndef TRAINWATCH_SERVER_ENGINE_ENGINE_H_
#define TRAINWATCH_SERVER_ENGINE_ENGINE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "alerting/notifier.h"
#include "closedloop/closed_loop.h"
#include "common/clock.h"
#include "engine/engine_options.h"
#include "engine/host_watch.h"
#include "engine/shard.h"
#include "health/health_config.h"
#include "health/run/run_pipeline.h"
#include "metrics/metrics.h"
#include "store/store.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

struct RunState;

// A token's own bound on the active runs it opens (its runs:N scope).
struct RunQuota {
  int token = 0;  // the token's line in the token file: tells tokens apart
  uint32_t max_active_runs = 0;
};

// One open Report stream, as the engine knows it. Its identity is fixed when
// the stream opens; `held` and `start_result` belong to the stream's shard:
// only tasks running there touch them, after shard->AssertOnShard(), which
// lets clang's thread-safety analysis check the rule.
struct Stream {
  Stream(StreamKey key, v1::RunStart start, std::shared_ptr<RunState> run,
         Shard* shard)
      : key(std::move(key)),
        start(std::move(start)),
        run(std::move(run)),
        shard(shard) {}
  ~Stream() { Close(); }  // a stream no one holds is closed
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // The stream's reactor ended: the run no longer has this stream open,
  // though work queued for it may still run. Idempotent.
  void Close();

  const StreamKey key;
  const v1::RunStart start;
  // Shared with the engine, which forgets a finished run only once no
  // stream (nor work queued for one) holds it.
  const std::shared_ptr<RunState> run;
  Shard* const shard;
  // The stream's work held until the engine knows where the stream resumes
  // (its RunStart's commit reports the last step stored), in arrival order.
  // Each item gets OK to run, or the error that ended the stream's start.
  std::vector<std::function<void(absl::Status)>> held ABSL_GUARDED_BY(shard);
  std::optional<absl::Status> start_result ABSL_GUARDED_BY(shard);
  // The stream's tasks queued in the shard's normal lane, not yet run. Only
  // the thread posting the stream's messages (one at a time) raises it; its
  // work may take the prompt lane only at zero, so it cannot overtake.
  std::atomic<uint32_t> normal_queued{0};

 private:
  std::atomic<bool> closed_{false};
};
using StreamHandle = std::shared_ptr<Stream>;
using DoneCallback = std::function<void(absl::Status)>;

class Engine {
 public:
  // The parts the engine works with are borrowed and must outlive its
  // Stop(). `notifier`: where fires and resolves go besides the store and
  // /metrics (Alertmanager, webhook); `closed_loop`: where critical alerts
  // with a restart plan propose directives, and where the trainers'
  // DirectiveAcks go (docs/closed-loop.md). Either may be null (none).
  static absl::StatusOr<std::unique_ptr<Engine>> Create(EngineOptions options,
                                                        Store* store,
                                                        Metrics* metrics,
                                                        const Clock* clock,
                                                        Notifier* notifier = nullptr,
                                                        ClosedLoop* closed_loop = nullptr);
  ~Engine();  // Stop()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // `start` must be validated. Stores the RunStart; `done` runs once durable.
  // A run not active yet counts against `quota` (when given) and against
  // max_active_runs: past either, RESOURCE_EXHAUSTED naming it.
  absl::StatusOr<StreamHandle> OpenStream(const v1::RunStart& start,
                                          DoneCallback done,
                                          std::optional<RunQuota> quota = {});
  // Updates the run with the records not seen before, then commits the
  // batch; `done` runs after both. `processed` (may be empty) runs on the
  // shard once the records are processed (or refused), always before `done`:
  // ingest uses it to keep the shards' queues short, so that a bad step is
  // not detected behind a long backlog.
  void SubmitBatch(const StreamHandle& stream, v1::StepBatch batch,
                   DoneCallback done, std::function<void()> processed = {});
  // The same for a batch on `arena` (ingest parses each request onto one:
  // an MoE report is thousands of fields, each an allocation on the heap),
  // which its records keep alive until they are stored.
  void SubmitBatch(const StreamHandle& stream, std::shared_ptr<google::protobuf::Arena> arena,
                   v1::StepBatch* batch, DoneCallback done,
                   std::function<void()> processed = {});
  // Commits the event, then (on the shard) applies it to the run: a run is
  // marked finished only once its RUN_FINISHED / RUN_FAILED is stored.
  // `done` runs after both.
  void SubmitEvent(const StreamHandle& stream, v1::RunEvent event,
                   DoneCallback done);

  // Hands a rank's DirectiveAck to the closed loop in the stream's order
  // (after its earlier batches); `done` runs once what it changed is stored.
  void SubmitDirectiveAck(const StreamHandle& stream, v1::DirectiveAck ack,
                          DoneCallback done);

  // The run's live health (waits for its shard). NOT_FOUND for a run this
  // engine does not hold (finished before a restart, or unknown).
  absl::StatusOr<HealthSnapshot> GetHealth(const std::string& run_id);

  // Fires RunSilent for unfinished runs whose last step is older than the
  // configured silence (server clock). Called by the timer.
  void CheckSilence();

  // Forgets the runs that finished at least `finished_runs.retention_seconds`
  // ago (server clock) and that no stream holds. Called by the timer.
  void ForgetFinishedRuns();

  // Runs without a batch for run_idle_timeout (server clock) leave the
  // active set (their history stays; a new batch brings them back). Called
  // by the timer.
  void RetireIdleRuns();

  // Deletes one run: its live state and series (its firing alerts resolve
  // first), its host incidents, then everything stored of it.
  // FAILED_PRECONDITION while a stream of it is open (work queued for a
  // stream that has closed is waited for); NOT_FOUND for a run not stored.
  // Blocks until committed.
  absl::StatusOr<v1::DeleteRunResponse> DeleteRun(const std::string& run_id);

  // Deletes the runs retention_days no longer keeps. Called by the timer.
  void ApplyRetention();

  // Stores the run's reference runs (`trainwatchctl baseline set`; empty:
  // cleared), which it is judged against from now on: a live run's
  // reference curves are loaded again, off the shard. Blocks until committed.
  absl::Status SetBaselines(const std::string& run_id, std::vector<v1::BaselineRef> refs);
  // What a stream of the run with `start` is judged against and why ("set",
  // "run_start", "previous_attempt", "none"): the stored set, else the
  // RunStart's, else the previous attempt. No disk.
  std::pair<std::vector<v1::BaselineRef>, std::string> ResolveBaselines(
      const v1::RunStart& start);
  // The detectors' configuration (CompareRuns judges as they do).
  const HealthConfig& health_config() const { return options_.health; }

  // Finishes queued work; later callbacks run inline. Call after the store
  // has closed, so every commit's callback has been posted.
  void Stop();

 private:
  Engine(EngineOptions options, Store* store, Metrics* metrics,
         const Clock* clock, Notifier* notifier, ClosedLoop* closed_loop);
  std::shared_ptr<RunState> FindOrAddRunLocked(const std::string& run_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Shard* ShardFor(const std::string& run_id);
  // SubmitBatch's work, for its records wherever they live.
  void Submit(const StreamHandle& stream, WriteOp::Batch records, uint64_t dropped,
              DoneCallback done, std::function<void()> processed);
  // On the shard: runs `work` now, or holds it until the stream's start is
  // committed when the engine does not yet know where the stream resumes.
  // `small` work (a batch of at most prompt_batch_records) takes the
  // shard's prompt lane unless the stream has work in the normal one.
  static void RunInOrder(const StreamHandle& stream,
                         std::function<void(absl::Status)> work, bool small);
  static void OnStartCommitted(Stream& stream, const WriteResult& result);
  // The run reported RUN_FINISHED or RUN_FAILED, or sent nothing for
  // run_idle_timeout: it leaves the active set.
  void MarkFinished(RunState& run);
  void MarkFinishedLocked(RunState& run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // recovery.cc: an unfinished run's pipeline and series from the store.
  absl::Status Rebuild(RunState& run, const v1::RunSummary& summary);
  // At start: alerts stored as firing for runs that finished (before the
  // server stopped) resolve at the run's last step, as ForgetFinishedRuns
  // would have resolved them.
  absl::Status ResolveAlertsOfFinishedRuns(
      const std::vector<v1::RunSummary>& runs);
  void SilenceLoop();
  // The store's callback for a stream's RunStart: a lead stream with
  // reference runs has them loaded (BaselineLoader) before its records are
  // processed; any other goes on at once.
  void StartCommitted(const StreamHandle& stream, WriteResult result);
  // At start: the stored baseline sets, and the loader (baselines.cc).
  absl::Status LoadBaselineSets();

  const EngineOptions options_;
  Store* const store_;
  Metrics* const metrics_;
  const Clock* const clock_;
  Notifier* const notifier_;       // may be null
  ClosedLoop* const closed_loop_;  // may be null
  HostWatch host_watch_;
  std::vector<std::unique_ptr<Shard>> shards_;

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<RunState>> runs_
      ABSL_GUARDED_BY(mu_);
  size_t active_runs_ ABSL_GUARDED_BY(mu_) = 0;
  // Active runs per token with a runs:N quota (RunQuota::token).
  absl::flat_hash_map<int, size_t> active_by_token_ ABSL_GUARDED_BY(mu_);
  // Runs being deleted: a stream of one is refused until it is gone.
  absl::flat_hash_set<std::string> deleting_ ABSL_GUARDED_BY(mu_);
  int64_t next_retention_unix_nanos_ = 0;  // the timer thread's
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar stop_cv_;
  std::thread silence_thread_;
  // Each run's reference runs as `baseline set` stored them (read at start,
  // kept by BaselinesChanged), so a stream's start needs no read to know.
  absl::flat_hash_map<std::string, std::vector<v1::BaselineRef>> set_baselines_
      ABSL_GUARDED_BY(mu_);
  std::unique_ptr<class BaselineLoader> baseline_loader_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_ENGINE_ENGINE_H_
