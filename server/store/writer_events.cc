// The store writer's run events: events, alerts, spikes and hard batches,
// spike outcomes, host incidents, directives and holds, and a run's deletion.
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

absl::Status StoreWriter::ApplyEvent(const WriteOp& op) {
  absl::StatusOr<StreamState*> stream = StartedStream(op.key);
  if (!stream.ok()) return stream.status();
  const int64_t run_key = (*stream)->run_key;
  const v1::RunEvent& e = std::get<WriteOp::Event>(op.body).event;
  insert_event_.Bind(1, run_key).Bind(2, int64_t{op.key.rank})
      .Bind(3, int64_t{op.key.attempt}).Bind(4, ToDb(e.step()))
      .Bind(5, int64_t{e.kind()}).Bind(6, e.detail())
      .Bind(7, e.time_unix_nanos() != 0 ? e.time_unix_nanos()
                                        : op.received_unix_nanos);
  if (absl::Status s = insert_event_.Run(); !s.ok()) return s;
  if (e.kind() == v1::RUN_FINISHED || e.kind() == v1::RUN_FAILED) {
    // A finished stream's open digests wait for nothing more.
    if (auto buf = rank_buffers_.find(op.key); buf != rank_buffers_.end()) {
      if (absl::Status s = FlushDigests(buf->first, buf->second, **stream); !s.ok()) return s;
    }
    set_run_state_.Bind(1, run_key)
        .Bind(2, e.kind() == v1::RUN_FINISHED ? "finished" : "failed");
    if (absl::Status s = set_run_state_.Run(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status StoreWriter::ApplyAlert(const WriteOp& op) {
  absl::StatusOr<int64_t> run_key = StartedRun(op.key.run_id);
  if (!run_key.ok()) return run_key.status();
  const v1::Alert& a = std::get<WriteOp::Alert>(op.body).alert;
  upsert_alert_.Bind(1, *run_key).Bind(2, a.alertname())
      .Bind(3, ToDb(a.started_step()))
      .Bind(4, v1::SeverityName(a.severity()))
      .Bind(5, v1::StateName(a.state())).Bind(7, a.started_unix_nanos())
      .Bind(9, a.peak_value()).Bind(10, a.summary())
      .Bind(11, a.description()).Bind(12, a.likely_cause())
      .Bind(13, a.fix()).BindBlob(14, PackIds(a.batch_ids()))
      .Bind(15, int64_t{a.rank()}).Bind(16, ToDb(a.onset_step()))
      .Bind(17, a.caused_by()).Bind(18, a.host());
  if (a.state() == v1::ALERT_STATE_RESOLVED) {
    upsert_alert_.Bind(6, ToDb(a.resolved_step()))
        .Bind(8, a.resolved_unix_nanos());
  }
  return upsert_alert_.Run();
}

absl::Status StoreWriter::ApplySpike(const WriteOp& op) {
  absl::StatusOr<int64_t> run_key = StartedRun(op.key.run_id);
  if (!run_key.ok()) return run_key.status();
  const v1::Spike& sp = std::get<WriteOp::Spike>(op.body).spike;
  insert_spike_.Bind(1, *run_key).Bind(2, ToDb(sp.step()))
      .Bind(3, sp.grad_norm()).Bind(4, sp.ratio_to_ema())
      .Bind(5, sp.sigmas()).BindBlob(6, PackIds(sp.batch_ids()));
  return insert_spike_.Run();
}

absl::Status StoreWriter::ApplyHardBatch(const WriteOp& op) {
  absl::StatusOr<int64_t> run_key = StartedRun(op.key.run_id);
  if (!run_key.ok()) return run_key.status();
  const v1::HardBatch& h = std::get<WriteOp::HardBatch>(op.body).hard_batch;
  insert_hard_batch_.Bind(1, *run_key).Bind(2, ToDb(h.step()))
      .Bind(3, int64_t{h.high_steps()}).Bind(4, h.peak()).Bind(5, h.level())
      .Bind(6, int64_t{h.peak_is_ratio() ? 1 : 0}).BindBlob(7, PackIds(h.batch_ids()));
  return insert_hard_batch_.Run();
}

absl::Status StoreWriter::ApplySpikeOutcome(const WriteOp& op) {
  absl::StatusOr<int64_t> run_key = StartedRun(op.key.run_id);
  if (!run_key.ok()) return run_key.status();
  const v1::Spike& sp = std::get<WriteOp::SpikeOutcome>(op.body).spike;
  update_spike_outcome_.Bind(1, *run_key).Bind(2, ToDb(sp.step()))
      .Bind(3, sp.outcome())
      .Bind(4, int64_t{sp.batches_skipped() ? 1 : 0});
  return update_spike_outcome_.Run();
}

absl::Status StoreWriter::ApplyHostIncident(const WriteOp& op) {
  const HostIncidentRow& i = std::get<WriteOp::HostIncident>(op.body).incident;
  insert_host_incident_.Bind(1, i.host).Bind(2, i.unix_nanos)
      .Bind(3, i.run_id).Bind(4, i.alertname);
  return insert_host_incident_.Run();
}

// Rare (a person's command): prepared per op, not kept.
absl::Status StoreWriter::ApplyBaselines(const WriteOp& op) {
  const auto& refs = std::get<WriteOp::Baselines>(op.body).refs;
  absl::StatusOr<sqlite::Stmt> clear =
      sqlite::Stmt::Prepare(db_.get(), "DELETE FROM baselines WHERE run_id = ?1");
  if (!clear.ok()) return clear.status();
  clear->Bind(1, op.key.run_id);
  if (absl::Status s = clear->Run(); !s.ok()) return s;
  absl::StatusOr<sqlite::Stmt> insert = sqlite::Stmt::Prepare(
      db_.get(), "INSERT OR IGNORE INTO baselines (run_id, n, ref_run, ref_attempt) "
                 "VALUES (?1, ?2, ?3, ?4)");
  if (!insert.ok()) return insert.status();
  int64_t n = 0;
  for (const v1::BaselineRef& ref : refs) {
    insert->Bind(1, op.key.run_id).Bind(2, n++).Bind(3, ref.run()).Bind(
        4, static_cast<int64_t>(ref.attempt()));
    if (absl::Status s = insert->Run(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status StoreWriter::ApplyHold(const WriteOp& op) {
  const HoldRow& h = std::get<WriteOp::Hold>(op.body).hold;
  upsert_hold_.Bind(1, op.key.run_id).Bind(2, h.until_unix_nanos).Bind(3, h.who)
      .Bind(4, h.set_unix_nanos);
  return upsert_hold_.Run();
}

absl::Status StoreWriter::ApplyDirective(const WriteOp& op) {
  const WriteOp::Directive& d = std::get<WriteOp::Directive>(op.body);
  if (d.record.directive().id().empty()) return absl::OkStatus();
  absl::StatusOr<int64_t> run_key = StartedRun(op.key.run_id);
  if (!run_key.ok()) return run_key.status();
  const int64_t seq = ToDb(d.record.directive().seq());
  v1::DirectiveRecord row = d.record;
  row.clear_transitions();
  upsert_directive_.Bind(1, *run_key).Bind(2, seq).Bind(3, row.directive().id())
      .Bind(4, row.state()).BindBlob(5, row.SerializeAsString());
  if (absl::Status s = upsert_directive_.Run(); !s.ok()) return s;
  if (!d.add_transition || d.record.transitions().empty()) return absl::OkStatus();
  const v1::DirectiveTransition& t = *d.record.transitions().rbegin();
  insert_directive_transition_.Bind(1, *run_key).Bind(2, seq)
      .Bind(3, int64_t{d.record.transitions_size() - 1}).Bind(4, row.directive().id())
      .Bind(5, t.state()).Bind(6, t.who()).Bind(7, t.unix_nanos()).Bind(8, t.why());
  return insert_directive_transition_.Run();
}

absl::Status StoreWriter::ApplyDeleteRun(const WriteOp& op, WriteResult& result) {
  absl::StatusOr<std::optional<int64_t>> found = LookupRun(op.key.run_id);
  if (!found.ok()) return found.status();
  if (!found->has_value()) {
    result.status = absl::NotFoundError(absl::StrCat("no run \"", op.key.run_id, "\""));
    return absl::OkStatus();
  }
  const int64_t run_key = **found;
  const auto count = [&](const char* sql, size_t* out) -> absl::Status {
    absl::StatusOr<sqlite::Stmt> s = sqlite::Stmt::Prepare(db_.get(), sql);
    if (!s.ok()) return s.status();
    s->Bind(1, run_key);
    absl::StatusOr<bool> row = s->Step();
    if (!row.ok()) return row.status();
    *out = *row ? static_cast<size_t>(s->Int(0)) : 0;
    return absl::OkStatus();
  };
  if (absl::Status s = count("SELECT steps FROM runs WHERE run_key = ?1", &result.stored);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = count("SELECT count(*) FROM alerts WHERE run_key = ?1",
                             &result.deleted_alerts);
      !s.ok()) {
    return s;
  }
  for (const char* sql :
       {"DELETE FROM step_chunks WHERE run_key = ?1", "DELETE FROM streams WHERE run_key = ?1",
        "DELETE FROM events WHERE run_key = ?1", "DELETE FROM alerts WHERE run_key = ?1",
        "DELETE FROM spikes WHERE run_key = ?1", "DELETE FROM hard_batches WHERE run_key = ?1",
        "DELETE FROM rank_tail WHERE run_key = ?1",
        "DELETE FROM directives WHERE run_key = ?1",
        "DELETE FROM directive_transitions WHERE run_key = ?1",
        "DELETE FROM runs WHERE run_key = ?1"}) {
    absl::StatusOr<sqlite::Stmt> s = sqlite::Stmt::Prepare(db_.get(), sql);
    if (!s.ok()) return s.status();
    s->Bind(1, run_key);
    if (absl::Status r = s->Run(); !r.ok()) return r;
  }
  for (const char* sql : {"DELETE FROM host_incidents WHERE run_id = ?1",
                          "DELETE FROM directive_holds WHERE run_id = ?1",
                          "DELETE FROM baselines WHERE run_id = ?1"}) {
    absl::StatusOr<sqlite::Stmt> by_id = sqlite::Stmt::Prepare(db_.get(), sql);
    if (!by_id.ok()) return by_id.status();
    by_id->Bind(1, op.key.run_id);
    if (absl::Status r = by_id->Run(); !r.ok()) return r;
  }
  deleted_run_ = true;
  return absl::OkStatus();
}

}  // namespace trainwatch
