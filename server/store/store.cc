#include "store/store.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "store/schema.h"
#include "store/writer.h"

namespace trainwatch {

std::string DescribeStoreFault(const StoreFault& f) {
  std::string waiting =
      absl::StrFormat("%d records in %d write op%s", f.waiting_records,
                      f.waiting_ops, f.waiting_ops == 1 ? "" : "s");
  switch (f.phase) {
    case StoreFault::Phase::kStarted:
      return absl::StrCat(
          "store failing: cannot write to ", f.path, ": ", f.error.message(),
          "; acknowledgements stop (clients keep their records and resend "
          "them) and the transaction is retried until it commits; ",
          waiting, " wait");
    case StoreFault::Phase::kRetrying:
      return absl::StrFormat(
          "store still failing after %.0f s (%d attempts): cannot write to "
          "%s: %s; %s wait",
          f.seconds, f.failed_attempts, f.path, f.error.message(), waiting);
    case StoreFault::Phase::kCleared:
      return absl::StrFormat(
          "store recovered after %.1f s (%d failed attempts, last: %s); %s "
          "that waited are committed and acknowledged",
          f.seconds, f.failed_attempts, f.error.message(), waiting);
    case StoreFault::Phase::kGaveUp:
      return absl::StrFormat(
          "store still failing at shutdown after %.1f s (%d attempts): cannot "
          "write to %s: %s; %s are not stored (never acknowledged: clients "
          "resend them)",
          f.seconds, f.failed_attempts, f.path, f.error.message(), waiting);
  }
  return "store fault";
}

Store::Store(StoreOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<Store>> Store::Open(StoreOptions options) {
  std::unique_ptr<Store> store(new Store(std::move(options)));
  const std::string& path = store->options_.path;
  bool memory = path.empty() || path == ":memory:";
  if (memory) {
    // Each in-memory store gets its own name so tests do not share data.
    static std::atomic<int> counter{0};
    store->uri_ = absl::StrCat("file:trainwatch-mem-", counter++,
                               "?mode=memory&cache=shared");
    absl::StatusOr<sqlite::DbPtr> anchor = sqlite::Open(
        store->uri_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, store->Vfs());
    if (!anchor.ok()) return anchor.status();
    store->memory_anchor_ = std::move(*anchor);
  } else {
    store->uri_ = path;
  }
  absl::StatusOr<sqlite::DbPtr> db = sqlite::Open(
      store->uri_,
      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
      store->Vfs());
  if (!db.ok()) return db.status();
  sqlite3_busy_timeout(db->get(),
                       static_cast<int>(store->options_.busy_timeout.count()));
  // page_size first: it takes effect only before the database's first
  // table (and cannot change once in WAL mode). No auto_vacuum: its pointer
  // map costs ingest ~8% of its records a second (tools/perf/ab_servers.sh),
  // and a deleted run's pages stay on the free list, which new records fill
  // before the file grows.
  std::string pragmas = absl::StrCat(
      "PRAGMA page_size = ", store->options_.page_size, ";",
      memory ? "" : "PRAGMA journal_mode = WAL;",
      "PRAGMA synchronous = ", store->options_.synchronous, ";",
      "PRAGMA cache_size = -65536;");
  if (absl::Status s = sqlite::Exec(db->get(), pragmas.c_str()); !s.ok()) {
    return s;
  }
  if (absl::Status s = MigrateSchema(db->get(), kSchemaVersion); !s.ok()) {
    return s;
  }
  absl::StatusOr<std::unique_ptr<StoreWriter>> writer =
      StoreWriter::Create(std::move(*db), store->options_);
  if (!writer.ok()) return writer.status();
  store->writer_ = std::move(*writer);
  store->thread_ = std::thread([s = store.get()] { s->WriterLoop(); });
  return store;
}

Store::~Store() { Close(); }

void Store::Submit(WriteOp op) {
  {
    absl::MutexLock lock(&mu_);
    if (!closing_) {
      queued_records_ += op.records();
      queue_.push_back(std::move(op));
      cv_.Signal();
      return;
    }
  }
  if (op.done) {
    op.done(WriteResult{.status = absl::UnavailableError("the store is closed")});
  }
}

void Store::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (!closing_) close_requested_ = options_.clock->MonotonicNanos();
    closing_ = true;
    cv_.Signal();
  }
  if (thread_.joinable()) thread_.join();
}

void Store::CloseDatabase() {
  Close();
  writer_.reset();
  memory_anchor_.reset();
}

size_t Store::QueueDepth() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

// How long the writer waits for an op before it merges small chunks.
constexpr absl::Duration kCompactAfterIdle = absl::Milliseconds(2);
// Streams waiting for a merge past which the writer merges after each
// commit, idle or not, about as many records as the commit stored: a run of
// thousands of ranks at a record a batch keeps the writer from ever idling,
// and every stream's chunks would wait as a row a record.
constexpr size_t kCompactBacklog = 32;

void Store::WriterLoop() {
  pthread_setname_np(pthread_self(), "tw-store");
  std::vector<WriteOp> ops;
  std::vector<WriteResult> results;
  while (true) {
    size_t records = 0;
    bool compact = false;
    {
      absl::MutexLock lock(&mu_);
      while (!closing_ && queue_.empty() && !writer_->WantsCompaction()) {
        cv_.Wait(&mu_);
      }
      if (queue_.empty() && closing_) return;  // closing and drained
      // Idle: merge small chunks (StoreWriter::CompactOne), one stream at a
      // time, so an op that arrives meanwhile waits for one merge at most;
      // and only after kCompactAfterIdle without an op, so that a load of
      // small batches is not slowed by merges between them (its chunks are
      // merged at its next lull, or after its commits once kCompactBacklog
      // streams wait).
      if (queue_.empty()) {
        const absl::Time deadline = absl::Now() + kCompactAfterIdle;
        while (!closing_ && queue_.empty()) {
          if (cv_.WaitWithDeadline(&mu_, deadline)) break;  // timed out
        }
        if (queue_.empty() && closing_) return;
      }
      compact = queue_.empty();
      size_t weight = 0;
      while (!queue_.empty() && weight < options_.max_records_per_txn) {
        size_t n = queue_.front().records();
        weight += n + 1;
        records += n;
        ops.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      queued_records_ -= records;
    }
    if (compact) {
      if (absl::Status s = writer_->CompactOne(); !s.ok() && options_.on_error) {
        options_.on_error(s);
      }
      continue;
    }
    bool done = Commit(ops, records, results);
    // Gave up while closing: what is still queued fails the same way.
    absl::Status gave_up = done ? absl::OkStatus() : results.front().status;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].done) ops[i].done(std::move(results[i]));
    }
    ops.clear();
    // After the callbacks, so the acks do not wait for the merges. Each
    // call takes one stream off the backlog (it comes back only with a new
    // group), so the loop ends.
    size_t merged = 0;
    for (size_t tries = writer_->CompactionBacklog();
         done && tries > 0 && merged < records &&
         writer_->CompactionBacklog() >= kCompactBacklog;
         --tries) {
      if (absl::Status s = writer_->CompactOne(&merged); !s.ok()) {
        if (options_.on_error) options_.on_error(s);
        break;
      }
    }
    if (!done) {
      std::deque<WriteOp> left;
      {
        absl::MutexLock lock(&mu_);
        left.swap(queue_);
        queued_records_ = 0;
      }
      for (WriteOp& op : left) {
        if (op.done) op.done(WriteResult{.status = gave_up});
      }
      return;
    }
  }
}

bool Store::Commit(const std::vector<WriteOp>& ops, size_t records,
                   std::vector<WriteResult>& results) {
  const Clock& clock = *options_.clock;
  auto nanos = [](std::chrono::milliseconds d) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  };
  StoreFault fault{.path = options_.path};
  int64_t fault_start = 0, last_log = 0;  // clock.MonotonicNanos()
  std::chrono::milliseconds backoff = options_.retry_initial_backoff;
  auto report = [&](StoreFault::Phase phase, int64_t now, bool log) {
    fault.phase = phase;
    fault.seconds = static_cast<double>(now - fault_start) * 1e-9;
    fault.log = log;
    {
      absl::MutexLock lock(&mu_);
      fault.waiting_ops = ops.size() + queue_.size();
      fault.waiting_records = records + queued_records_;
    }
    if (log) last_log = now;
    if (options_.on_fault) options_.on_fault(fault);
  };
  while (true) {
    const int64_t t0 = clock.MonotonicNanos();
    absl::Status status = writer_->Apply(ops, results);
    const int64_t now = clock.MonotonicNanos();
    if (status.ok()) {
      if (fault.failed_attempts > 0) {
        report(StoreFault::Phase::kCleared, now, /*log=*/true);
      }
      if (options_.on_commit) {
        size_t stored = 0;
        for (const WriteResult& r : results) stored += r.stored;
        options_.on_commit(static_cast<double>(now - t0) * 1e-9, stored, QueueDepth());
      }
      return true;
    }
    if (!sqlite::IsTransient(sqlite::ResultCode(status))) {
      if (options_.on_error) options_.on_error(status);
      return true;
    }
    // A transient fault: the ops stay, the transaction is retried.
    fault.error = status;
    if (++fault.failed_attempts == 1) fault_start = now;
    int64_t wake = now + nanos(backoff);
    bool closing = false, give_up = false;
    {
      absl::MutexLock lock(&mu_);
      closing = closing_;
      if (closing) {
        const int64_t give_up_at =
            std::max(close_requested_, fault_start) + nanos(options_.close_timeout);
        give_up = now >= give_up_at;
        wake = std::min(wake, give_up_at);
      }
    }
    if (give_up) {
      absl::Status unavailable = absl::UnavailableError(absl::StrCat(
          "the server is stopping and its store cannot write to ",
          options_.path, " (", status.message(),
          "): not stored and not acknowledged; resend it"));
      for (WriteResult& r : results) r.status = unavailable;
      report(StoreFault::Phase::kGaveUp, now, /*log=*/true);
      return false;
    }
    if (fault.failed_attempts == 1) {
      report(StoreFault::Phase::kStarted, now, /*log=*/true);
    } else {
      report(StoreFault::Phase::kRetrying, now,
             now - last_log >= nanos(options_.fault_log_interval));
    }
    backoff = std::min(backoff * 2, options_.retry_max_backoff);
    absl::MutexLock lock(&mu_);
    // Close() wakes the wait: its bounded wait may end before `wake`.
    while (!(closing_ && !closing)) {
      if (clock.WaitUntil(cv_, mu_, wake)) break;  // timed out
    }
  }
}

}  // namespace trainwatch
