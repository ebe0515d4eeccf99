// The durable record of everything trainers sent: runs, streams, step records
// and events, in one SQLite file (WAL).
//
// Layout. Step records are stored in chunks: one row per accepted batch of a
// stream (run, rank, attempt), holding the records (columnar, see
// store/codec/step_codec.h) and the step range they cover. A row per step tops out near 240k rows/s on a 2-core
// machine; a chunk row carries up to thousands of records for about the cost
// of one row, and QuerySteps reads a range with one index seek.
//
// Exactly-once. The writer thread keeps, per stream, the last step it has
// committed (persisted in `streams.last_step` in the same transaction as the
// chunk). A record whose step is not above it is a duplicate or older step
// and is dropped (docs/contracts.md), so a batch resent after a reconnect or a
// server crash is stored once. If a transaction fails, that state rolls back
// with it, so a retry of the same batch is not mistaken for a duplicate.
//
// Faults. A transaction that fails with a transient error (sqlite::IsTransient:
// disk full, I/O error, the database locked past the busy timeout, ...) is
// rolled back and retried unchanged, with backoff, until it commits: no op
// fails and no callback runs meanwhile, so nothing is acknowledged and the
// ingest's backpressure makes clients buffer. Each attempt starts from what
// is committed (the writer's caches are dropped on a rollback), so a retry
// stores every record once. Other errors fail the transaction's ops at once.
// Close() during a fault waits at most `close_timeout`, then fails what is
// left with UNAVAILABLE. StoreOptions::on_fault reports the fault.
//
// Threads. One writer thread owns the write connection and runs batched
// transactions; Submit() may be called from any thread and never blocks on
// disk. The read methods open their own connection per call and may be
// called from any thread concurrently (WAL readers do not block the writer).
#ifndef TRAINWATCH_SERVER_STORE_STORE_H_
#define TRAINWATCH_SERVER_STORE_STORE_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "store/sqlite.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

// A transient store fault, as reported to StoreOptions::on_fault.
struct StoreFault {
  enum class Phase {
    kStarted,   // a transaction failed with a transient error; it is retried
    kRetrying,  // another attempt failed
    kCleared,   // the retried transaction committed
    kGaveUp,    // an attempt failed after Close()'s wait: the waiting ops failed
  };
  Phase phase = Phase::kStarted;
  std::string path;    // the database
  absl::Status error;  // the latest attempt's error (kCleared: the one before)
  double seconds = 0;  // since the fault started
  int failed_attempts = 0;
  // Not committed (kCleared: committed late; kGaveUp: failed): ops and the
  // step records in them, the retried transaction's and the queue's.
  size_t waiting_ops = 0;
  size_t waiting_records = 0;
  // A log line is due: the first report, then one per `fault_log_interval`,
  // and the last (kCleared or kGaveUp).
  bool log = false;
};

// One line for the log, e.g. "store failing: cannot write to /var/lib/...".
std::string DescribeStoreFault(const StoreFault& fault);

struct StoreOptions {
  // SQLite path; "" or ":memory:" gives a private in-memory database shared
  // by this store's connections (for tests).
  std::string path = "trainwatch.db";
  // PRAGMA synchronous: "NORMAL" (durable across process crashes; the WAL is
  // synced at checkpoints) or "FULL" (also across power loss).
  std::string synchronous = "NORMAL";
  // The page size of a database this store creates (an existing one keeps
  // its own). A chunk of 1,024 records is ~80 KB of overflow pages, each a
  // WAL frame written, then checkpointed, with its own syscalls. Against
  // SQLite's default 4 KiB, in one bench_store run: 8 KiB stored batches of
  // 1,024 records 1.4x as fast, of 64 and of 1 (pipelined) 1.1x, a lone
  // one-record commit 0.92x; 16 KiB did 1,024 records 1.5x but 64 0.75x and
  // a lone commit 0.69x (every commit rewrites whole pages), so 8 KiB.
  int page_size = 8192;
  // A transaction closes once it holds this many records (or the queue is empty).
  size_t max_records_per_txn = 65536;
  // Called on the writer thread after each commit: its duration, the records
  // it stored and the queue depth left (for metrics).
  std::function<void(double seconds, size_t records, size_t queue_depth)>
      on_commit;
  // Called on the writer thread when a transaction fails with an error that
  // is not transient and its ops fail, or when a compaction of small chunks
  // fails (no op waits for one; it is rolled back) (for logs/metrics).
  std::function<void(const absl::Status&)> on_error;
  // Called on the writer thread at each failed attempt of a transaction that
  // failed with a transient error (kStarted, kRetrying, kGaveUp) and when the
  // fault clears (kCleared). Must not block.
  std::function<void(const StoreFault&)> on_fault;

  // How long SQLite waits for a lock held by another connection before a
  // statement fails with SQLITE_BUSY.
  std::chrono::milliseconds busy_timeout{5000};
  // Backoff between attempts of a transaction that failed with a transient
  // error: doubles from initial to max.
  std::chrono::milliseconds retry_initial_backoff{50};
  std::chrono::milliseconds retry_max_backoff{5000};
  // During a fault, StoreFault::log is set at most this often.
  std::chrono::milliseconds fault_log_interval{30000};
  // Close() during a fault waits this long (from Close() or the fault's
  // start, whichever is later) for the store to recover, then fails the
  // waiting ops with UNAVAILABLE (they were never acknowledged: clients
  // resend them to the next server). An attempt in progress may add up to
  // `busy_timeout`.
  std::chrono::milliseconds close_timeout{5000};
  // What is kept of the records of a rank other than its run's lead (the
  // lowest rank seen; docs/architecture.md, "What is kept per rank"):
  // kDigest keeps the step, time, norms, step time and data wait, rounded
  // (store/ranks/rank_digest.h); kFull every field, as the lead's.
  enum class RankRecords { kFull, kDigest };
  RankRecords rank_records = RankRecords::kDigest;
  // Non-lead ranks' records more than this many steps behind their stream's
  // newest are deleted (at compaction); 0 keeps them as long as the run.
  uint64_t rank_retention_steps = 0;
  // The SQLite VFS every connection uses; "" for SQLite's default. A seam for
  // tests (a VFS that fails writes as a full disk would).
  std::string vfs;
  // What the retries' backoff, the fault's timing and log interval and
  // Close()'s wait measure and wait on (a seam for tests: a FakeClock). The
  // 2 ms lull before merging small chunks is real time: it only paces work.
  const Clock* clock = Clock::Real();
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
  // kBatch: how many of its records were new and stored (duplicates and
  // steps that went backwards are not).
  size_t stored = 0;
  // kStart: the last step this stream has stored, if any.
  std::optional<uint64_t> last_step;
  // kDeleteRun: the run's step records (in `stored`) and alert episodes
  // that were deleted.
  size_t deleted_alerts = 0;
};

// An alert that named a host (HostSuspect's evidence).
struct HostIncidentRow {
  std::string host;
  std::string alertname;
  std::string run_id;
  int64_t unix_nanos = 0;
};

// One unit of work for the writer: what it writes (one struct per kind),
// for which stream, and what to call once its transaction ended.
// A run's hold on the closed loop's policy (docs/closed-loop.md).
struct HoldRow {
  std::string run_id;
  int64_t until_unix_nanos = 0;  // 0: released
  std::string who;
  int64_t set_unix_nanos = 0;
};

struct WriteOp {
  struct Start {
    v1::RunStart start;
  };
  // In arrival order: the parsed request's own records, moved, not copied:
  // on the arena the request was parsed onto (kept alive with them), or
  // on the heap.
  class Batch {
   public:
    using Records = google::protobuf::RepeatedPtrField<v1::StepRecord>;
    Batch(Records records = {}) : heap_(std::move(records)) {}  // NOLINT: a batch is its records
    // `records` lives on `arena`.
    Batch(std::shared_ptr<google::protobuf::Arena> arena, Records* records)
        : arena_(std::move(arena)), on_arena_(records) {}
    const Records& records() const { return on_arena_ != nullptr ? *on_arena_ : heap_; }
    // EncodeMoeCounts(records()), coded ahead where they were parsed, or
    // empty (none has counts, or not coded ahead).
    const std::string& moe_counts() const { return moe_counts_; }
    void set_moe_counts(std::string coded) { moe_counts_ = std::move(coded); }

   private:
    std::string moe_counts_;
    Records heap_;
    std::shared_ptr<google::protobuf::Arena> arena_;
    Records* on_arena_ = nullptr;
  };
  struct Event {
    v1::RunEvent event;
  };
  struct Alert {
    v1::Alert alert;  // upserted by (run, alertname, started_step)
  };
  struct Spike {
    v1::Spike spike;  // by (run, step)
  };
  struct HardBatch {
    v1::HardBatch hard_batch;  // by (run, step)
  };
  // Sets a stored spike's outcome and batches_skipped.
  struct SpikeOutcome {
    v1::Spike spike;
  };
  // Server-wide: key.run_id is empty.
  struct HostIncident {
    HostIncidentRow incident;
  };
  // Deletes key.run_id's run with everything stored of it (records, events,
  // alerts, spikes, the host incidents it named); NOT_FOUND in the result
  // for a run that is not stored. The freed pages are given back.
  struct DeleteRun {};
  // A directive's row (by run and seq, upserted; its transitions are not
  // read from it) and, when set, its newest transition, the
  // record's last one. An empty record writes nothing: a DirectiveAck that
  // changed nothing is still acked in its stream's order.
  struct Directive {
    v1::DirectiveRecord record;
    bool add_transition = false;
  };
  // key.run_id's hold on the closed loop's policy (until 0: released).
  struct Hold {
    HoldRow hold;
  };
  // key.run_id's reference runs (trainwatchctl baseline set); none: cleared.
  struct Baselines {
    std::vector<v1::BaselineRef> refs;
  };
  using Body = std::variant<Start, Batch, Event, Alert, Spike, HardBatch,
                            SpikeOutcome, HostIncident, DeleteRun, Directive, Hold,
                            Baselines>;

  StreamKey key;
  Body body;
  int64_t received_unix_nanos = 0;
  // Runs on the writer thread once the op's transaction ended (after Close(),
  // at once on the thread that submits it); must not block.
  std::function<void(WriteResult)> done;

  // The records of a batch; 0 for the other kinds.
  size_t records() const {
    const Batch* b = std::get_if<Batch>(&body);
    return b == nullptr ? 0 : static_cast<size_t>(b->records().size());
  }
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

  // Commits everything queued, runs the callbacks, stops the writer. During a
  // fault, fails what is still waiting after `close_timeout`.
  void Close();
  // After Close(): closes the writer's connection, the last one open, so
  // SQLite checkpoints its log into the database file and removes it (the
  // .db file alone then holds every commit). Reads still open their own.
  void CloseDatabase();

  size_t QueueDepth() const;

  // Reads (store_reads.cc): each opens its own read-only connection.

  // Runs, newest first.
  absl::StatusOr<std::vector<v1::RunSummary>> ListRuns() const;
  absl::StatusOr<v1::RunSummary> GetRun(const std::string& run_id) const;
  // The RunStart of the run's lead stream (lowest rank, its latest attempt).
  absl::StatusOr<v1::RunStart> GetLeadStart(const std::string& run_id) const;

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
  // Every run's hold on the closed loop's policy that is not released.
  absl::StatusOr<std::vector<HoldRow>> ListHolds() const;
  // The last `limit` hard batches of a run, in step order.
  absl::StatusOr<std::vector<v1::HardBatch>> ListHardBatches(
      const std::string& run_id, size_t limit) const;

  // Host incidents at or after `since_unix_nanos`, oldest first.
  absl::StatusOr<std::vector<HostIncidentRow>> ListHostIncidents(
      int64_t since_unix_nanos) const;

  // Directives of a run ("" for every run), by run and seq, each with its
  // transitions, oldest first.
  absl::StatusOr<std::vector<v1::DirectiveRecord>> ListDirectives(
      const std::string& run_id) const;

  // The reference runs set for a run (trainwatchctl baseline set), in the
  // order given; empty when none are set. A run need not be stored yet.
  absl::StatusOr<std::vector<v1::BaselineRef>> GetBaselines(
      const std::string& run_id) const;
  // Every run's set reference runs, by run id (read once at start).
  absl::StatusOr<std::vector<std::pair<std::string, std::vector<v1::BaselineRef>>>>
  ListBaselines() const;
  // The RunStart of one attempt's lead stream (its lowest rank); NOT_FOUND
  // when the run has no such attempt.
  absl::StatusOr<v1::RunStart> GetAttemptStart(const std::string& run_id,
                                               uint32_t attempt) const;

  // Events of a run, in step order.
  absl::StatusOr<std::vector<v1::RunEvent>> ListEvents(
      const std::string& run_id) const;

  // Writes a consistent copy of the database to `path` (which must not
  // exist) while the writer goes on: SQLite's VACUUM INTO on a read
  // connection of its own, a snapshot of what was committed when it began.
  absl::Status Backup(const std::string& path) const;

  static constexpr int kSchemaVersion = 12;

 private:
  // A statement on a read-only connection of its own (store_reads.cc);
  // declared in this order, the statement is finalized first.
  struct ReadQuery {
    sqlite::DbPtr db;
    sqlite::Stmt stmt;
  };

  explicit Store(StoreOptions options);
  absl::StatusOr<ReadQuery> Query(std::string_view sql) const;
  void WriterLoop();
  // Applies `ops` (holding `records` step records), retrying while the
  // transaction fails with a transient error. Returns false when it gave up
  // (closing): then `results` carry UNAVAILABLE.
  bool Commit(const std::vector<WriteOp>& ops, size_t records,
              std::vector<WriteResult>& results);
  const char* Vfs() const {
    return options_.vfs.empty() ? nullptr : options_.vfs.c_str();
  }

  const StoreOptions options_;
  std::string uri_;  // what connections open
  // Keeps a shared in-memory database alive between connections.
  sqlite::DbPtr memory_anchor_;
  std::unique_ptr<class StoreWriter> writer_;  // the writer thread's alone

  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<WriteOp> queue_ ABSL_GUARDED_BY(mu_);
  size_t queued_records_ ABSL_GUARDED_BY(mu_) = 0;  // step records in queue_
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  int64_t close_requested_ ABSL_GUARDED_BY(mu_) = 0;  // options_.clock's monotonic ns
  std::thread thread_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_STORE_STORE_H_
