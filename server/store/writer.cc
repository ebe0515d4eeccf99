#include "store/writer.h"

#include <cstring>
#include <limits>
#include <type_traits>
#include <variant>

#include "absl/strings/str_cat.h"
#include "store/codec/step_codec.h"
#include "store/ranks/rank_digest.h"
#include "store/ranks/rank_tail.h"
#include "store/writer_internal.h"
#include "trainwatch/v1/alert_names.h"

namespace trainwatch {

absl::StatusOr<std::unique_ptr<StoreWriter>> StoreWriter::Create(
    sqlite::DbPtr db, const StoreOptions& options) {
  std::unique_ptr<StoreWriter> w(new StoreWriter(std::move(db), options));
  if (absl::Status s = w->Prepare(); !s.ok()) return s;
  return w;
}

absl::Status StoreWriter::Prepare() {
  struct {
    sqlite::Stmt* stmt;
    const char* sql;
  } const stmts[] = {
      {&select_run_, "SELECT run_key, lead_rank FROM runs WHERE run_id = ?1"},
      {&insert_run_,
       "INSERT INTO runs (run_id, start, lead_rank, attempt, started_ns, "
       "last_seen_ns) VALUES (?1, ?2, ?3, ?4, ?5, ?5)"},
      // The run's description follows its lead stream: the lowest rank, and
      // for that rank the latest attempt. A new attempt reopens the run.
      {&update_run_start_,
       "UPDATE runs SET start = ?2, lead_rank = ?3, attempt = ?4, "
       "last_seen_ns = ?5, state = 'running' WHERE run_key = ?1 AND "
       "(?3 < lead_rank OR (?3 = lead_rank AND ?4 >= attempt))"},
      {&set_run_state_, "UPDATE runs SET state = ?2 WHERE run_key = ?1"},
      {&update_run_progress_,
       "UPDATE runs SET last_step = max(coalesce(last_step, -1), ?2), "
       "steps = steps + ?3, last_seen_ns = ?4 WHERE run_key = ?1"},
      {&select_stream_,
       "SELECT last_step FROM streams WHERE run_key = ?1 AND rank = ?2 AND "
       "attempt = ?3"},
      {&insert_stream_,
       "INSERT INTO streams (run_key, rank, attempt, start, started_ns) "
       "VALUES (?1, ?2, ?3, ?4, ?5)"},
      {&update_stream_,
       "UPDATE streams SET last_step = ?4 WHERE run_key = ?1 AND rank = ?2 "
       "AND attempt = ?3"},
      {&insert_chunk_,
       "INSERT INTO step_chunks (run_key, rank, attempt, first_step, "
       "last_step, n, records) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"},
      {&upsert_alert_,
       "INSERT INTO alerts (run_key, alertname, started_step, severity, state, "
       "resolved_step, started_ns, resolved_ns, peak_value, summary, "
       "description, likely_cause, fix, batch_ids, rank, onset_step, "
       "caused_by, host) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, "
       "?12, ?13, ?14, ?15, ?16, ?17, ?18) "
       "ON CONFLICT (run_key, alertname, started_step) DO UPDATE SET "
       "state = excluded.state, resolved_step = excluded.resolved_step, "
       "resolved_ns = excluded.resolved_ns, peak_value = excluded.peak_value, "
       "description = excluded.description, batch_ids = excluded.batch_ids, "
       "severity = excluded.severity, host = excluded.host, "
       "caused_by = excluded.caused_by"},
      {&insert_spike_,
       "INSERT OR IGNORE INTO spikes (run_key, step, grad_norm, ratio_to_ema, "
       "sigmas, batch_ids) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"},
      {&insert_hard_batch_,
       "INSERT OR IGNORE INTO hard_batches (run_key, step, high_steps, peak, "
       "level, peak_is_ratio, batch_ids) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"},
      {&update_spike_outcome_,
       "UPDATE spikes SET outcome = ?3, batches_skipped = ?4 "
       "WHERE run_key = ?1 AND step = ?2"},
      {&upsert_directive_,
       "INSERT INTO directives (run_key, seq, id, state, directive) VALUES (?1, ?2, ?3, ?4, ?5) "
       "ON CONFLICT (run_key, seq) DO UPDATE SET state = excluded.state, "
       "directive = excluded.directive"},
      {&upsert_hold_,
       "INSERT INTO directive_holds (run_id, until_ns, who, set_ns) VALUES (?1, ?2, ?3, ?4) "
       "ON CONFLICT (run_id) DO UPDATE SET until_ns = excluded.until_ns, "
       "who = excluded.who, set_ns = excluded.set_ns"},
      {&insert_directive_transition_,
       "INSERT OR REPLACE INTO directive_transitions (run_key, seq, n, id, state, who, time_ns, "
       "why) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"},
      {&insert_host_incident_,
       "INSERT OR IGNORE INTO host_incidents (host, time_ns, run_id, alertname) "
       "VALUES (?1, ?2, ?3, ?4)"},
      {&select_chunks_from_,
       "SELECT rowid, first_step, last_step, n, records FROM step_chunks "
       "WHERE run_key = ?1 AND rank = ?2 AND attempt = ?3 AND first_step >= ?4 "
       "ORDER BY first_step LIMIT 256"},  // kCompactScanRows
      {&delete_chunk_, "DELETE FROM step_chunks WHERE rowid = ?1"},
      {&insert_tail_, "INSERT INTO rank_tail (seq, run_key, records) VALUES (?1, ?2, ?3)"},
      {&delete_tails_before_, "DELETE FROM rank_tail WHERE seq < ?1"},
      {&delete_chunks_before_,
       "DELETE FROM step_chunks WHERE run_key = ?1 AND rank = ?2 AND "
       "attempt = ?3 AND last_step < ?4"},
      {&insert_event_,
       "INSERT OR IGNORE INTO events (run_key, rank, attempt, step, kind, "
       "detail, time_ns) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"},
  };
  for (const auto& [stmt, sql] : stmts) {
    absl::StatusOr<sqlite::Stmt> s = sqlite::Stmt::Prepare(db_.get(), sql);
    if (!s.ok()) return s.status();
    *stmt = std::move(*s);
  }
  return absl::OkStatus();
}

absl::Status StoreWriter::ApplyOne(const WriteOp& op, WriteResult& result) {
  return std::visit(
      [&](const auto& body) -> absl::Status {
        using T = std::decay_t<decltype(body)>;
        if constexpr (std::is_same_v<T, WriteOp::Start>) return ApplyStart(op, result);
        if constexpr (std::is_same_v<T, WriteOp::Batch>) return ApplyBatch(op, result);
        if constexpr (std::is_same_v<T, WriteOp::Event>) return ApplyEvent(op);
        if constexpr (std::is_same_v<T, WriteOp::Alert>) return ApplyAlert(op);
        if constexpr (std::is_same_v<T, WriteOp::Spike>) return ApplySpike(op);
        if constexpr (std::is_same_v<T, WriteOp::HardBatch>) return ApplyHardBatch(op);
        if constexpr (std::is_same_v<T, WriteOp::SpikeOutcome>) return ApplySpikeOutcome(op);
        if constexpr (std::is_same_v<T, WriteOp::HostIncident>) return ApplyHostIncident(op);
        if constexpr (std::is_same_v<T, WriteOp::DeleteRun>) return ApplyDeleteRun(op, result);
        if constexpr (std::is_same_v<T, WriteOp::Directive>) return ApplyDirective(op);
        if constexpr (std::is_same_v<T, WriteOp::Hold>) return ApplyHold(op);
        if constexpr (std::is_same_v<T, WriteOp::Baselines>) return ApplyBaselines(op);
      },
      op.body);
}

void StoreWriter::AfterDelete() {
  deleted_run_ = false;
  // What the caches knew of the run is gone with it, as after a failed
  // transaction. The freed pages stay on SQLite's free list, which new
  // records fill before the file grows (store.cc: no auto_vacuum).
  ForgetCaches();
}

void StoreWriter::ForgetCaches() {
  run_keys_.clear();
  lead_ranks_.clear();
  streams_.clear();
  tails_loaded_ = false;  // the digests in memory: read back from the file
  small_.clear();
  ready_.clear();
}

absl::Status StoreWriter::Apply(const std::vector<WriteOp>& ops,
                               std::vector<WriteResult>& results) {
  results.assign(ops.size(), WriteResult{});
  progress_.clear();
  absl::Status status = absl::OkStatus();
  // A failed COMMIT or ROLLBACK can leave the transaction open; end it, or
  // BEGIN would fail on every retry.
  if (!sqlite3_get_autocommit(db_.get())) {
    status = sqlite::Exec(db_.get(), "ROLLBACK");
  }
  // IMMEDIATE: take the write lock now, so a lock held by another
  // connection is waited for (busy timeout) before any work is done.
  if (status.ok()) status = sqlite::Exec(db_.get(), "BEGIN IMMEDIATE");
  for (size_t i = 0; status.ok() && i < ops.size(); ++i) {
    status = ApplyOne(ops[i], results[i]);
    // An op that cannot apply (no RunStart) fails alone, not the transaction.
    if (absl::IsFailedPrecondition(status) && sqlite::ResultCode(status) == 0) {
      results[i].status = status;
      status = absl::OkStatus();
    }
  }
  if (status.ok()) {
    int64_t now_ns = 0;
    for (const WriteOp& op : ops) now_ns = std::max(now_ns, op.received_unix_nanos);
    status = EndTails(now_ns);
  }
  for (auto [key, st] : dirty_) {
    st->dirty = false;
    if (!status.ok()) continue;
    update_stream_.Bind(1, st->run_key).Bind(2, int64_t{key->rank})
        .Bind(3, int64_t{key->attempt}).Bind(4, *st->last_step);
    status = update_stream_.Run();
  }
  dirty_.clear();
  for (const auto& [run_key, p] : progress_) {
    if (!status.ok()) break;
    update_run_progress_.Bind(1, run_key).Bind(2, p.max_step)
        .Bind(3, p.added).Bind(4, p.last_seen_ns);
    status = update_run_progress_.Run();
  }
  if (status.ok()) status = sqlite::Exec(db_.get(), "COMMIT");
  if (status.ok() && deleted_run_) AfterDelete();
  if (!status.ok()) {
    deleted_run_ = false;
    // SQLite may have rolled back already (disk full, I/O error); then this
    // fails harmlessly.
    if (!sqlite3_get_autocommit(db_.get())) {
      sqlite::Exec(db_.get(), "ROLLBACK").IgnoreError();
    }
    // The caches may hold state of the rolled-back transaction.
    ForgetCaches();
    for (WriteResult& r : results) r = WriteResult{.status = status};
    return status;
  }
  return absl::OkStatus();
}

}  // namespace trainwatch
