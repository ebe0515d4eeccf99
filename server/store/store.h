// The durable record of everything trainers sent: runs, streams, step records
// and events, in one SQLite file (WAL).
//
// Layout. Step records are stored in chunks: one row per accepted batch of a
// stream (run, rank, attempt), holding the serialized records and the step
// range they cover. A row per step tops out near 240k rows/s on a 2-core
// machine; a chunk row carries up to thousands of records for about the cost
// of one row, and QuerySteps reads a range with one index seek.
//
// Exactly-once. The writer thread keeps, per stream, the last step it has
// committed (persisted in `streams.last_step` in the same transaction as the
// chunk). A record whose step is not above it is a duplicate or older step
// and is dropped (DESIGN.md §3), so a batch resent after a reconnect or a
// server crash is stored once. If a transaction fails, that state rolls back
// with it, so a retry of the same batch is not mistaken for a duplicate.
//
// Threads. One writer thread owns the write connection and runs batched
// transactions; Submit() may be called from any thread and never blocks on
// disk. The read methods open their own connection per call and may be
// called from any thread concurrently (WAL readers do not block the writer).
#ifndef TRAINWATCH_SERVER_STORE_STORE_H_
#define TRAINWATCH_SERVER_STORE_STORE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "store/sqlite.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

struct StoreOptions {
  // SQLite path; "" or ":memory:" gives a private in-memory database shared
  // by this store's connections (for tests).
  std::string path = "trainwatch.db";
  // PRAGMA synchronous: "NORMAL" (durable across process crashes; the WAL is
  // synced at checkpoints) or "FULL" (also across power loss).
  std::string synchronous = "NORMAL";
  // A transaction closes once it holds this many records (or the queue is empty).
  size_t max_records_per_txn = 65536;
  // Called on the writer thread after each commit: its duration, the records
  // it stored and the queue depth left (for metrics).
  std::function<void(double seconds, size_t records, size_t queue_depth)>
      on_commit;
  // Called on the writer thread when a transaction fails (for logs/metrics).
  std::function<void(const absl::Status&)> on_error;
};

// The identity of one trainer stream.
struct StreamKey {
  std::string run_id;
  uint32_t rank = 0;
  uint32_t attempt = 0;

  bool operator==(const StreamKey&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const StreamKey& k) {
    return H::combine(std::move(h), k.run_id, k.rank, k.attempt);
  }
};

// What the writer did with one op, passed to its callback after the commit.
struct WriteResult {
  absl::Status status;
  // kBatch: the records that were new, in order (duplicates and steps that
  // went backwards removed).
  std::vector<v1::StepRecord> fresh;
  // kStart: the last step this stream has stored, if any.
  std::optional<uint64_t> last_step;
};

// One unit of work for the writer.
struct WriteOp {
  enum class Kind { kStart, kBatch, kEvent, kAlert, kSpike, kHealthMark };
  Kind kind = Kind::kBatch;
  StreamKey key;
  v1::RunStart start;                   // kStart
  std::vector<v1::StepRecord> records;  // kBatch, in arrival order
  v1::RunEvent event;                   // kEvent
  v1::Alert alert;                      // kAlert: upserted by (run, alertname, started_step)
  v1::Spike spike;                      // kSpike
  // kHealthMark: the engine has processed the run's lead stream (key.rank,
  // key.attempt) through this step, and submitted whatever that wrote
  // (alerts, spikes) before this op, so they are durable once it is.
  uint64_t health_step = 0;
  int64_t received_unix_nanos = 0;
  // Runs on the writer thread once the op's transaction ended; must not block.
  std::function<void(WriteResult)> done;
};

class Store {
 public:
  // Opens (creating if needed) the database, migrates the schema and starts
  // the writer thread.
  static absl::StatusOr<std::unique_ptr<Store>> Open(StoreOptions options);
  ~Store();  // Close()
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Queues an op. After Close() the op's callback gets UNAVAILABLE at once.
  void Submit(WriteOp op);

  // Commits everything queued, runs the callbacks, stops the writer.
  void Close();

  size_t QueueDepth() const;

  // Runs, newest first.
  absl::StatusOr<std::vector<v1::RunSummary>> ListRuns() const;
  absl::StatusOr<v1::RunSummary> GetRun(const std::string& run_id) const;
  // The RunStart of the run's lead stream (lowest rank, its latest attempt).
  absl::StatusOr<v1::RunStart> GetLeadStart(const std::string& run_id) const;

  // How far the engine's processing of the run's lead stream is durable:
  // the (attempt, step) of its last committed kHealthMark; nullopt before
  // the first. Records stored past it were committed but their alerts may
  // not have been (a crash between the two transactions).
  struct HealthMark {
    uint32_t attempt = 0;
    uint64_t step = 0;
  };
  absl::StatusOr<std::optional<HealthMark>> GetHealthMark(
      const std::string& run_id) const;

  // Streams the stored records of run_id with from <= step <= to (to == 0:
  // no upper bound), ordered by rank, attempt, step, in chunks of about
  // `chunk_records`. `sink` returns false to stop early. NOT_FOUND for an
  // unknown run.
  absl::Status ReadSteps(const std::string& run_id, uint64_t from_step,
                         uint64_t to_step, std::optional<uint32_t> rank,
                         size_t chunk_records,
                         const std::function<bool(v1::StepRecords&)>& sink) const;

  // Alert episodes, newest first; run_id "" for all runs.
  absl::StatusOr<std::vector<v1::Alert>> ListAlerts(const std::string& run_id,
                                                    bool active_only) const;

  // Spikes of a run, in step order (without restart plans).
  absl::StatusOr<std::vector<v1::Spike>> ListSpikes(
      const std::string& run_id) const;

  // Events of a run, in step order.
  absl::StatusOr<std::vector<v1::RunEvent>> ListEvents(
      const std::string& run_id) const;

  static constexpr int kSchemaVersion = 3;

 private:
  explicit Store(StoreOptions options);
  absl::StatusOr<sqlite::DbPtr> OpenReader() const;
  void WriterLoop();

  const StoreOptions options_;
  std::string uri_;  // what connections open
  // Keeps a shared in-memory database alive between connections.
  sqlite::DbPtr memory_anchor_;
  std::unique_ptr<class StoreWriter> writer_;  // the writer thread's alone

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<WriteOp> queue_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_STORE_STORE_H_
