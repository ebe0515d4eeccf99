#include "store/store.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "store/schema.h"
#include "store/writer.h"

namespace trainwatch {
namespace {

// Fills a RunSummary from a `runs` row read by the columns of kRunColumns.
// The last column counts the run's firing alerts (alerts_firing, a partial
// index, keeps it to the few firing rows), so that a listing shows what
// `alerts --active` shows.
constexpr const char* kRunColumns =
    "run_id, start, attempt, started_ns, last_seen_ns, last_step, steps, "
    "state, (SELECT COUNT(*) FROM alerts a WHERE a.state = 'firing' AND "
    "a.run_key = runs.run_key)";

v1::RunSummary RunFromRow(const sqlite::Stmt& s) {
  v1::RunSummary run;
  v1::RunStart start;
  std::string_view blob = s.Blob(1);
  start.ParseFromArray(blob.data(), static_cast<int>(blob.size()));
  run.set_run_id(std::string(s.Text(0)));
  run.set_world_size(start.world_size() == 0 ? 1 : start.world_size());
  run.set_attempt(static_cast<uint32_t>(s.Int(2)));
  run.set_precision(start.precision());
  run.set_max_norm(start.max_norm());
  run.set_warmup_steps(start.warmup_steps());
  run.mutable_labels()->insert(start.labels().begin(), start.labels().end());
  run.set_started_unix_nanos(s.Int(3));
  run.set_last_seen_unix_nanos(s.Int(4));
  if (!s.IsNull(5)) run.set_last_step(static_cast<uint64_t>(s.Int(5)));
  run.set_steps(static_cast<uint64_t>(s.Int(6)));
  run.set_state(std::string(s.Text(7)));
  run.set_active_alerts(static_cast<uint32_t>(s.Int(8)));
  return run;
}

template <typename Repeated>
void UnpackIds(std::string_view blob, Repeated* out) {
  size_t n = blob.size() / sizeof(int64_t);
  out->Resize(static_cast<int>(n), 0);
  if (n > 0) std::memcpy(out->mutable_data(), blob.data(), n * sizeof(int64_t));
}

}  // namespace

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
  std::string pragmas = absl::StrCat(
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
      StoreWriter::Create(std::move(*db));
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
      queued_records_ += op.records.size();
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
    if (!closing_) close_requested_ = std::chrono::steady_clock::now();
    closing_ = true;
    cv_.Signal();
  }
  if (thread_.joinable()) thread_.join();
}

size_t Store::QueueDepth() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

void Store::WriterLoop() {
  std::vector<WriteOp> ops;
  std::vector<WriteResult> results;
  while (true) {
    size_t records = 0;
    {
      absl::MutexLock lock(&mu_);
      while (!closing_ && queue_.empty()) cv_.Wait(&mu_);
      if (queue_.empty()) return;  // closing and drained
      size_t weight = 0;
      while (!queue_.empty() && weight < options_.max_records_per_txn) {
        size_t n = queue_.front().records.size();
        weight += n + 1;
        records += n;
        ops.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      queued_records_ -= records;
    }
    bool done = Commit(ops, records, results);
    // Gave up while closing: what is still queued fails the same way.
    absl::Status gave_up = done ? absl::OkStatus() : results.front().status;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].done) ops[i].done(std::move(results[i]));
    }
    ops.clear();
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

bool Store::Commit(std::vector<WriteOp>& ops, size_t records,
                   std::vector<WriteResult>& results) {
  using Clock = std::chrono::steady_clock;
  StoreFault fault{.path = options_.path};
  Clock::time_point fault_start, last_log;
  std::chrono::milliseconds backoff = options_.retry_initial_backoff;
  auto report = [&](StoreFault::Phase phase, Clock::time_point now,
                    bool log) {
    fault.phase = phase;
    fault.seconds = std::chrono::duration<double>(now - fault_start).count();
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
    Clock::time_point t0 = Clock::now();
    absl::Status status = writer_->Apply(ops, results);
    Clock::time_point now = Clock::now();
    if (status.ok()) {
      if (fault.failed_attempts > 0) {
        report(StoreFault::Phase::kCleared, now, /*log=*/true);
      }
      if (options_.on_commit) {
        size_t stored = 0;
        for (const WriteResult& r : results) stored += r.fresh.size();
        options_.on_commit(std::chrono::duration<double>(now - t0).count(),
                           stored, QueueDepth());
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
    Clock::time_point wake = now + backoff;
    bool closing = false, give_up = false;
    {
      absl::MutexLock lock(&mu_);
      closing = closing_;
      if (closing) {
        Clock::time_point give_up_at =
            std::max(close_requested_, fault_start) + options_.close_timeout;
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
             now - last_log >= options_.fault_log_interval);
    }
    backoff = std::min(backoff * 2, options_.retry_max_backoff);
    absl::MutexLock lock(&mu_);
    // Close() wakes the wait: its bounded wait may end before `wake`.
    const absl::Time deadline = absl::Now() + absl::FromChrono(wake - Clock::now());
    while (!(closing_ && !closing)) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) break;  // timed out
    }
  }
}

absl::StatusOr<sqlite::DbPtr> Store::OpenReader() const {
  absl::StatusOr<sqlite::DbPtr> db =
      sqlite::Open(uri_, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, Vfs());
  if (db.ok()) {
    sqlite3_busy_timeout(db->get(),
                         static_cast<int>(options_.busy_timeout.count()));
  }
  return db;
}

absl::StatusOr<std::vector<v1::RunSummary>> Store::ListRuns() const {
  absl::StatusOr<sqlite::DbPtr> db = OpenReader();
  if (!db.ok()) return db.status();
  absl::StatusOr<sqlite::Stmt> s = sqlite::Stmt::Prepare(
      db->get(), absl::StrCat("SELECT ", kRunColumns,
                              " FROM runs ORDER BY started_ns DESC, run_key DESC"));
  if (!s.ok()) return s.status();
  std::vector<v1::RunSummary> runs;
  while (true) {
    absl::StatusOr<bool> row = s->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    runs.push_back(RunFromRow(*s));
  }
  return runs;
}

absl::StatusOr<v1::RunSummary> Store::GetRun(const std::string& run_id) const {
  absl::StatusOr<sqlite::DbPtr> db = OpenReader();
  if (!db.ok()) return db.status();
  absl::StatusOr<sqlite::Stmt> s = sqlite::Stmt::Prepare(
      db->get(),
      absl::StrCat("SELECT ", kRunColumns, " FROM runs WHERE run_id = ?1"));
  if (!s.ok()) return s.status();
  s->Bind(1, run_id);
  absl::StatusOr<bool> row = s->Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::NotFoundError(absl::StrCat("no run \"", run_id, "\""));
  return RunFromRow(*s);
}

absl::StatusOr<v1::RunStart> Store::GetLeadStart(
    const std::string& run_id) const {
  absl::StatusOr<sqlite::DbPtr> db = OpenReader();
  if (!db.ok()) return db.status();
  absl::StatusOr<sqlite::Stmt> s = sqlite::Stmt::Prepare(
      db->get(), "SELECT start FROM runs WHERE run_id = ?1");
  if (!s.ok()) return s.status();
  s->Bind(1, run_id);
  absl::StatusOr<bool> row = s->Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::NotFoundError(absl::StrCat("no run \"", run_id, "\""));
  v1::RunStart start;
  std::string_view blob = s->Blob(0);
  if (!start.ParseFromArray(blob.data(), static_cast<int>(blob.size()))) {
    return absl::DataLossError(absl::StrCat("the RunStart of ", run_id, " does not parse"));
  }
  return start;
}

absl::Status Store::ReadSteps(
    const std::string& run_id, uint64_t from_step, uint64_t to_step,
    std::optional<uint32_t> rank, size_t chunk_records,
    const std::function<bool(v1::StepRecords&)>& sink) const {
  absl::StatusOr<sqlite::DbPtr> db = OpenReader();
  if (!db.ok()) return db.status();
  // One read transaction, so the records form one consistent snapshot.
  if (absl::Status s = sqlite::Exec(db->get(), "BEGIN"); !s.ok()) return s;
  absl::StatusOr<sqlite::Stmt> s = sqlite::Stmt::Prepare(
      db->get(),
      "SELECT c.rank, c.attempt, c.records FROM step_chunks c "
      "JOIN runs r ON r.run_key = c.run_key WHERE r.run_id = ?1 "
      "AND (?2 < 0 OR c.rank = ?2) AND c.last_step >= ?3 AND c.first_step <= ?4 "
      "ORDER BY c.rank, c.attempt, c.first_step");
  if (!s.ok()) return s.status();
  const int64_t from = static_cast<int64_t>(std::min<uint64_t>(from_step, INT64_MAX));
  const int64_t to = to_step == 0 ? INT64_MAX
                                  : static_cast<int64_t>(std::min<uint64_t>(to_step, INT64_MAX));
  s->Bind(1, run_id).Bind(2, rank.has_value() ? int64_t{*rank} : int64_t{-1})
      .Bind(3, from).Bind(4, to);
  v1::StepRecords out;
  v1::StepBatch chunk;
  size_t rows = 0;
  while (true) {
    absl::StatusOr<bool> row = s->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    ++rows;
    std::string_view blob = s->Blob(2);
    if (!chunk.ParseFromArray(blob.data(), static_cast<int>(blob.size()))) {
      return absl::DataLossError(absl::StrCat(
          "a stored chunk of run ", run_id, " does not parse"));
    }
    uint32_t r = static_cast<uint32_t>(s->Int(0));
    uint32_t attempt = static_cast<uint32_t>(s->Int(1));
    for (v1::StepRecord& rec : *chunk.mutable_records()) {
      if (rec.step() < from_step || (to_step != 0 && rec.step() > to_step)) {
        continue;
      }
      v1::StepRecords::Item* item = out.add_items();
      item->set_rank(r);
      item->set_attempt(attempt);
      item->mutable_record()->Swap(&rec);
      if (static_cast<size_t>(out.items_size()) >= chunk_records) {
        if (!sink(out)) return absl::OkStatus();
        out.Clear();
      }
    }
  }
  if (out.items_size() > 0) sink(out);
  if (rows == 0) {
    // Tell an unknown run from a known run with nothing in range.
    absl::StatusOr<v1::RunSummary> run = GetRun(run_id);
    if (!run.ok()) return run.status();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::Alert>> Store::ListAlerts(
    const std::string& run_id, bool active_only) const {
  absl::StatusOr<sqlite::DbPtr> db = OpenReader();
  if (!db.ok()) return db.status();
  absl::StatusOr<sqlite::Stmt> s = sqlite::Stmt::Prepare(
      db->get(),
      "SELECT r.run_id, a.alertname, a.severity, a.state, a.started_step, "
      "a.resolved_step, a.started_ns, a.resolved_ns, a.peak_value, a.summary, "
      "a.description, a.likely_cause, a.fix, a.batch_ids, a.rank, a.host, "
      "a.onset_step, a.caused_by FROM alerts a "
      "JOIN runs r ON r.run_key = a.run_key WHERE (?1 = '' OR r.run_id = ?1) "
      "AND (?2 = 0 OR a.state = 'firing') "
      "ORDER BY a.started_ns DESC, a.started_step DESC");
  if (!s.ok()) return s.status();
  s->Bind(1, run_id).Bind(2, int64_t{active_only ? 1 : 0});
  std::vector<v1::Alert> alerts;
  while (true) {
    absl::StatusOr<bool> row = s->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    v1::Alert& a = alerts.emplace_back();
    a.set_run(std::string(s->Text(0)));
    a.set_alertname(std::string(s->Text(1)));
    a.set_severity(std::string(s->Text(2)));
    a.set_state(std::string(s->Text(3)));
    a.set_started_step(static_cast<uint64_t>(s->Int(4)));
    if (!s->IsNull(5)) a.set_resolved_step(static_cast<uint64_t>(s->Int(5)));
    a.set_started_unix_nanos(s->Int(6));
    if (!s->IsNull(7)) a.set_resolved_unix_nanos(s->Int(7));
    a.set_peak_value(s->IsNull(8) ? std::nan("") : s->Double(8));
    a.set_summary(std::string(s->Text(9)));
    a.set_description(std::string(s->Text(10)));
    a.set_likely_cause(std::string(s->Text(11)));
    a.set_fix(std::string(s->Text(12)));
    UnpackIds(s->Blob(13), a.mutable_batch_ids());
    a.set_rank(static_cast<uint32_t>(s->Int(14)));
    a.set_host(std::string(s->Text(15)));
    a.set_onset_step(static_cast<uint64_t>(s->Int(16)));
    a.set_caused_by(std::string(s->Text(17)));
  }
  if (alerts.empty() && !run_id.empty()) {
    absl::StatusOr<v1::RunSummary> run = GetRun(run_id);
    if (!run.ok()) return run.status();
  }
  return alerts;
}

absl::StatusOr<std::vector<v1::Spike>> Store::ListSpikes(
    const std::string& run_id) const {
  absl::StatusOr<sqlite::DbPtr> db = OpenReader();
  if (!db.ok()) return db.status();
  absl::StatusOr<sqlite::Stmt> s = sqlite::Stmt::Prepare(
      db->get(),
      "SELECT s.step, s.grad_norm, s.ratio_to_ema, s.sigmas, s.batch_ids, "
      "s.outcome, s.batches_skipped "
      "FROM spikes s JOIN runs r ON r.run_key = s.run_key WHERE r.run_id = ?1 "
      "ORDER BY s.step");
  if (!s.ok()) return s.status();
  s->Bind(1, run_id);
  std::vector<v1::Spike> spikes;
  while (true) {
    absl::StatusOr<bool> row = s->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    v1::Spike& sp = spikes.emplace_back();
    sp.set_step(static_cast<uint64_t>(s->Int(0)));
    sp.set_grad_norm(s->Double(1));
    sp.set_ratio_to_ema(s->Double(2));
    sp.set_sigmas(s->Double(3));
    UnpackIds(s->Blob(4), sp.mutable_batch_ids());
    sp.set_outcome(std::string(s->Text(5)));
    sp.set_batches_skipped(s->Int(6) != 0);
  }
  return spikes;
}

absl::StatusOr<std::vector<HostIncidentRow>> Store::ListHostIncidents(
    int64_t since_unix_nanos) const {
  absl::StatusOr<sqlite::DbPtr> db = OpenReader();
  if (!db.ok()) return db.status();
  absl::StatusOr<sqlite::Stmt> s = sqlite::Stmt::Prepare(
      db->get(),
      "SELECT host, alertname, run_id, time_ns FROM host_incidents "
      "WHERE time_ns >= ?1 ORDER BY time_ns");
  if (!s.ok()) return s.status();
  s->Bind(1, since_unix_nanos);
  std::vector<HostIncidentRow> rows;
  while (true) {
    absl::StatusOr<bool> row = s->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    rows.push_back(HostIncidentRow{.host = std::string(s->Text(0)),
                                   .alertname = std::string(s->Text(1)),
                                   .run_id = std::string(s->Text(2)),
                                   .unix_nanos = s->Int(3)});
  }
  return rows;
}

absl::StatusOr<std::vector<v1::RunEvent>> Store::ListEvents(
    const std::string& run_id) const {
  absl::StatusOr<sqlite::DbPtr> db = OpenReader();
  if (!db.ok()) return db.status();
  absl::StatusOr<sqlite::Stmt> s = sqlite::Stmt::Prepare(
      db->get(),
      "SELECT e.step, e.kind, e.detail, e.time_ns FROM events e JOIN runs r "
      "ON r.run_key = e.run_key WHERE r.run_id = ?1 ORDER BY e.step, e.time_ns");
  if (!s.ok()) return s.status();
  s->Bind(1, run_id);
  std::vector<v1::RunEvent> events;
  while (true) {
    absl::StatusOr<bool> row = s->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    v1::RunEvent& e = events.emplace_back();
    e.set_step(static_cast<uint64_t>(s->Int(0)));
    e.set_kind(static_cast<v1::EventKind>(s->Int(1)));
    e.set_detail(std::string(s->Text(2)));
    e.set_time_unix_nanos(s->Int(3));
  }
  return events;
}

}  // namespace trainwatch
