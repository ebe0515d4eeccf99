#include "store/writer.h"

#include <cstring>
#include <limits>
#include <type_traits>
#include <variant>

#include "absl/strings/str_cat.h"
#include "store/codec/step_codec.h"
#include "store/ranks/rank_digest.h"
#include "store/ranks/rank_tail.h"
#include "trainwatch/v1/alert_names.h"

namespace trainwatch {
namespace {

// Steps live in SQLite's signed 64-bit integers; larger ones are clamped on
// the way in (no real run gets near 2^63 steps).
int64_t ToDb(uint64_t step) {
  return step > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
             ? std::numeric_limits<int64_t>::max()
             : static_cast<int64_t>(step);
}

std::string PackIds(const google::protobuf::RepeatedField<int64_t>& ids) {
  std::string out(ids.size() * sizeof(int64_t), '\0');
  if (!ids.empty()) std::memcpy(out.data(), ids.data(), out.size());
  return out;
}

}  // namespace

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

absl::StatusOr<int64_t> StoreWriter::EnsureRun(const WriteOp& op) {
  const v1::RunStart& start = std::get<WriteOp::Start>(op.body).start;
  std::string blob = start.SerializeAsString();
  absl::StatusOr<std::optional<int64_t>> found = LookupRun(op.key.run_id);
  if (!found.ok()) return found.status();
  if (!found->has_value()) {
    insert_run_.Bind(1, op.key.run_id).BindBlob(2, blob)
        .Bind(3, int64_t{op.key.rank}).Bind(4, int64_t{op.key.attempt})
        .Bind(5, op.received_unix_nanos);
    if (absl::Status s = insert_run_.Run(); !s.ok()) return s;
    int64_t run_key = sqlite3_last_insert_rowid(db_.get());
    run_keys_[op.key.run_id] = run_key;
    lead_ranks_[run_key] = op.key.rank;
    return run_key;
  }
  int64_t run_key = **found;
  auto [lead, added] = lead_ranks_.emplace(run_key, op.key.rank);
  if (!added) lead->second = std::min(lead->second, op.key.rank);
  update_run_start_.Bind(1, run_key).BindBlob(2, blob)
      .Bind(3, int64_t{op.key.rank}).Bind(4, int64_t{op.key.attempt})
      .Bind(5, op.received_unix_nanos);
  if (absl::Status s = update_run_start_.Run(); !s.ok()) return s;
  return run_key;
}

absl::StatusOr<std::optional<int64_t>> StoreWriter::LookupRun(
    const std::string& run_id) {
  auto it = run_keys_.find(run_id);
  if (it != run_keys_.end()) return it->second;
  select_run_.Bind(1, run_id);
  absl::StatusOr<bool> row = select_run_.Step();
  int64_t found = (row.ok() && *row) ? select_run_.Int(0) : -1;
  int64_t lead = found >= 0 ? select_run_.Int(1) : 0;
  select_run_.Reset();
  if (!row.ok()) return row.status();
  if (found < 0) return std::nullopt;
  run_keys_.emplace(run_id, found);
  lead_ranks_.emplace(found, static_cast<uint32_t>(lead));
  return found;
}

absl::StatusOr<StoreWriter::StreamState*> StoreWriter::LoadStream(
    const StreamKey& key, std::optional<int64_t> run_key) {
  auto it = streams_.find(key);
  if (it != streams_.end()) return &it->second;
  if (!run_key.has_value()) {
    absl::StatusOr<std::optional<int64_t>> found = LookupRun(key.run_id);
    if (!found.ok()) return found.status();
    if (!found->has_value()) return nullptr;
    run_key = **found;
  }
  select_stream_.Bind(1, *run_key).Bind(2, int64_t{key.rank})
      .Bind(3, int64_t{key.attempt});
  absl::StatusOr<bool> row = select_stream_.Step();
  if (!row.ok()) {
    select_stream_.Reset();
    return row.status();
  }
  if (!*row) {
    select_stream_.Reset();
    return nullptr;
  }
  StreamState state{.run_key = *run_key};
  if (!select_stream_.IsNull(0)) state.last_step = select_stream_.Int(0);
  select_stream_.Reset();
  return &streams_.emplace(key, state).first->second;
}

absl::StatusOr<StoreWriter::StreamState*> StoreWriter::StartedStream(
    const StreamKey& key) {
  absl::StatusOr<StreamState*> stream = LoadStream(key, std::nullopt);
  if (!stream.ok()) return stream.status();
  if (*stream == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("no RunStart stored for run ", key.run_id, " rank ",
                     key.rank, " attempt ", key.attempt));
  }
  return *stream;
}

absl::StatusOr<int64_t> StoreWriter::StartedRun(const std::string& run_id) {
  absl::StatusOr<std::optional<int64_t>> run_key = LookupRun(run_id);
  if (!run_key.ok()) return run_key.status();
  if (!run_key->has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no RunStart stored for run ", run_id));
  }
  return **run_key;
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
      },
      op.body);
}

absl::Status StoreWriter::ApplyStart(const WriteOp& op, WriteResult& result) {
  absl::StatusOr<int64_t> run_key = EnsureRun(op);
  if (!run_key.ok()) return run_key.status();
  absl::StatusOr<StreamState*> stream = LoadStream(op.key, *run_key);
  if (!stream.ok()) return stream.status();
  if (*stream == nullptr) {
    insert_stream_.Bind(1, *run_key).Bind(2, int64_t{op.key.rank})
        .Bind(3, int64_t{op.key.attempt})
        .BindBlob(4, std::get<WriteOp::Start>(op.body).start.SerializeAsString())
        .Bind(5, op.received_unix_nanos);
    if (absl::Status s = insert_stream_.Run(); !s.ok()) return s;
    streams_.emplace(op.key, StreamState{.run_key = *run_key});
  } else if ((*stream)->last_step.has_value()) {
    result.last_step = static_cast<uint64_t>(*(*stream)->last_step);
  }
  return absl::OkStatus();
}

absl::Status StoreWriter::ApplyBatch(const WriteOp& op, WriteResult& result) {
  const google::protobuf::RepeatedPtrField<v1::StepRecord>& records =
      std::get<WriteOp::Batch>(op.body).records;
  absl::StatusOr<StreamState*> stream = StartedStream(op.key);
  if (!stream.ok()) return stream.status();
  StreamState& st = **stream;
  picked_.clear();
  for (int i = 0; i < records.size(); ++i) {
    int64_t step = ToDb(records[i].step());
    if (st.last_step.has_value() && step <= *st.last_step) continue;
    st.last_step = step;
    if (!st.dirty) {
      st.dirty = true;
      dirty_.emplace_back(&streams_.find(op.key)->first, &st);
    }
    picked_.push_back(i);
  }
  if (picked_.empty()) return absl::OkStatus();
  int64_t first = ToDb(records[picked_.front()].step());
  const bool rank_stream = IsRankStream(op.key, st.run_key);
  result.stored = picked_.size();
  RunProgress& p = progress_[st.run_key];
  p.max_step = std::max(p.max_step, *st.last_step);
  p.added += static_cast<int64_t>(picked_.size());
  p.last_seen_ns = std::max(p.last_seen_ns, op.received_unix_nanos);
  if (rank_stream && digest_ranks_) return AddDigests(op, st, records);
  insert_chunk_.Bind(1, st.run_key).Bind(2, int64_t{op.key.rank})
      .Bind(3, int64_t{op.key.attempt}).Bind(4, first)
      .Bind(5, *st.last_step)
      .Bind(6, static_cast<int64_t>(picked_.size()))
      .BindBlob(7, EncodeStepChunk(records, picked_));
  if (absl::Status s = insert_chunk_.Run(); !s.ok()) return s;
  if (rank_stream) {
    if (absl::Status s = Prune(op.key, st); !s.ok()) return s;
  }
  // Compaction's bookkeeping: from a stream's first small chunk on, the
  // records of its chunks.
  const bool small_chunk = picked_.size() < kSmallChunk;
  auto tail = small_.find(op.key);
  if (tail == small_.end() && small_chunk) {
    tail = small_.emplace(op.key, SmallChunks{.run_key = st.run_key, .from_step = first})
               .first;
  }
  if (tail != small_.end()) {
    // Past kCompactRecords at least one group of them is complete.
    tail->second.records += picked_.size();
    if (!tail->second.queued && tail->second.records > kCompactRecords) {
      tail->second.queued = true;
      ready_.push_back(op.key);
    }
  }
  return absl::OkStatus();
}

absl::Status StoreWriter::AddDigests(
    const WriteOp& op, StreamState& st,
    const google::protobuf::RepeatedPtrField<v1::StepRecord>& records) {
  if (absl::Status s = EnsureTailsLoaded(); !s.ok()) return s;
  auto [open, fresh] = open_tails_.try_emplace(st.run_key);
  if (fresh) open->second.seq = next_tail_seq_++;
  OpenTail& tail = open->second;
  auto [it, added] = rank_buffers_.try_emplace(op.key);
  RankBuffer& buf = it->second;
  buf.run_key = st.run_key;
  for (size_t i : picked_) {
    const RankDigest d = MakeRankDigest(records[static_cast<int>(i)]);
    tail.streams.push_back({op.key.rank, op.key.attempt});
    RankDigestToRecord(d, tail.records.Add());
    if (buf.digests.empty()) {
      buf.oldest_seq = tail.seq;
      buf.oldest_ns = op.received_unix_nanos;
      oldest_.emplace(buf.oldest_seq, &it->first);
    }
    buf.digests.push_back(d);
    if (buf.digests.size() >= kRankCompactRecords) {
      if (absl::Status s = FlushDigests(it->first, buf, st); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status StoreWriter::FlushDigests(const StreamKey& key, RankBuffer& buf,
                                       StreamState& st) {
  if (buf.digests.empty()) return absl::OkStatus();
  digests_.Clear();
  for (const RankDigest& d : buf.digests) RankDigestToRecord(d, digests_.Add());
  insert_chunk_.Bind(1, buf.run_key).Bind(2, int64_t{key.rank})
      .Bind(3, int64_t{key.attempt}).Bind(4, ToDb(buf.digests.front().step))
      .Bind(5, ToDb(buf.digests.back().step))
      .Bind(6, static_cast<int64_t>(buf.digests.size()))
      .BindBlob(7, EncodeStepChunk(digests_));
  if (absl::Status s = insert_chunk_.Run(); !s.ok()) return s;
  oldest_.erase({buf.oldest_seq, &key});
  buf.digests.clear();
  return Prune(key, st);
}

absl::Status StoreWriter::EnsureTailsLoaded() {
  if (tails_loaded_) return absl::OkStatus();
  rank_buffers_.clear();
  oldest_.clear();
  open_tails_.clear();
  absl::StatusOr<sqlite::Stmt> max_seq =
      sqlite::Stmt::Prepare(db_.get(), "SELECT coalesce(max(seq), 0) FROM rank_tail");
  if (!max_seq.ok()) return max_seq.status();
  absl::StatusOr<bool> row = max_seq->Step();
  if (!row.ok()) return row.status();
  next_tail_seq_ = max_seq->Int(0) + 1;
  absl::StatusOr<sqlite::Stmt> run_id =
      sqlite::Stmt::Prepare(db_.get(), "SELECT run_id FROM runs WHERE run_key = ?1");
  if (!run_id.ok()) return run_id.status();
  absl::flat_hash_map<int64_t, std::string> run_ids;
  absl::Status status = ForEachOpenDigest(
      db_.get(), std::nullopt, std::nullopt, [&](const OpenDigest& d) -> absl::Status {
        auto name = run_ids.find(d.run_key);
        if (name == run_ids.end()) {
          run_id->Bind(1, d.run_key);
          absl::StatusOr<bool> found = run_id->Step();
          std::string id = (found.ok() && *found) ? std::string(run_id->Text(0)) : "";
          run_id->Reset();
          if (!found.ok()) return found.status();
          name = run_ids.emplace(d.run_key, std::move(id)).first;
        }
        auto [it, added] = rank_buffers_.try_emplace(
            StreamKey{name->second, d.stream.rank, d.stream.attempt});
        RankBuffer& buf = it->second;
        buf.run_key = d.run_key;
        if (buf.digests.empty()) {
          buf.oldest_seq = d.seq;
          buf.oldest_ns = 0;  // not known: counts from the next commit
          oldest_.emplace(d.seq, &it->first);
        }
        buf.digests.push_back(MakeRankDigest(*d.record));
        return absl::OkStatus();
      });
  if (!status.ok()) return status;
  tail_deleted_below_ = 0;
  tails_loaded_ = true;
  return absl::OkStatus();
}

absl::Status StoreWriter::EndTails(int64_t now_ns) {
  if (!tails_loaded_) return absl::OkStatus();
  for (auto& [run_key, tail] : open_tails_) {
    insert_tail_.Bind(1, tail.seq).Bind(2, run_key)
        .BindBlob(3, EncodeRankTail(tail.streams, tail.records));
    if (absl::Status s = insert_tail_.Run(); !s.ok()) return s;
  }
  open_tails_.clear();
  // A stream that stopped sending (a dead rank, a finished run) would keep
  // every row since its oldest digest: after kMaxDigestAge its digests go
  // into a chunk of their own, however few.
  while (!oldest_.empty()) {
    const StreamKey* key = oldest_.begin()->second;
    RankBuffer& buf = rank_buffers_.find(*key)->second;
    if (buf.oldest_ns == 0) buf.oldest_ns = now_ns;  // read back at a restart
    if (now_ns - buf.oldest_ns < absl::ToInt64Nanoseconds(kMaxDigestAge)) break;
    absl::StatusOr<StreamState*> st = StartedStream(*key);
    if (!st.ok()) return st.status();
    if (absl::Status s = FlushDigests(*key, buf, **st); !s.ok()) return s;
  }
  const int64_t live = oldest_.empty() ? next_tail_seq_ : oldest_.begin()->first;
  if (live > tail_deleted_below_) {
    delete_tails_before_.Bind(1, live);
    if (absl::Status s = delete_tails_before_.Run(); !s.ok()) return s;
    tail_deleted_below_ = live;
  }
  return absl::OkStatus();
}

bool StoreWriter::IsRankStream(const StreamKey& key, int64_t run_key) const {
  auto lead = lead_ranks_.find(run_key);
  return lead != lead_ranks_.end() && key.rank > lead->second;
}

absl::Status StoreWriter::Prune(const StreamKey& key, StreamState& st) {
  if (rank_retention_steps_ == 0 || !st.last_step.has_value()) {
    return absl::OkStatus();
  }
  const uint64_t newest = static_cast<uint64_t>(*st.last_step);
  if (newest < rank_retention_steps_) return absl::OkStatus();
  const int64_t keep_from = ToDb(newest - rank_retention_steps_);
  // Once per eighth of the retention (and per compaction group at least): a
  // delete scans the stream's rows.
  const int64_t every = static_cast<int64_t>(
      std::max<uint64_t>(rank_retention_steps_ / 8, kRankCompactRecords));
  if (keep_from - st.kept_from < every) return absl::OkStatus();
  delete_chunks_before_.Bind(1, st.run_key).Bind(2, int64_t{key.rank})
      .Bind(3, int64_t{key.attempt}).Bind(4, keep_from);
  if (absl::Status s = delete_chunks_before_.Run(); !s.ok()) return s;
  st.kept_from = keep_from;
  return absl::OkStatus();
}

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
                          "DELETE FROM directive_holds WHERE run_id = ?1"}) {
    absl::StatusOr<sqlite::Stmt> by_id = sqlite::Stmt::Prepare(db_.get(), sql);
    if (!by_id.ok()) return by_id.status();
    by_id->Bind(1, op.key.run_id);
    if (absl::Status r = by_id->Run(); !r.ok()) return r;
  }
  deleted_run_ = true;
  return absl::OkStatus();
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

absl::Status StoreWriter::CompactOne(size_t* merged_records) {
  if (ready_.empty()) return absl::OkStatus();
  const StreamKey key = std::move(ready_.front());
  ready_.pop_front();
  auto it = small_.find(key);
  if (it == small_.end()) return absl::OkStatus();
  SmallChunks& tail = it->second;
  tail.queued = false;
  struct Chunk {
    int64_t rowid, first, last;
    size_t n;
    std::string blob;
  };
  absl::Status status = sqlite::Exec(db_.get(), "BEGIN IMMEDIATE");
  std::vector<Chunk> chunks;
  if (status.ok()) {
    select_chunks_from_.Bind(1, tail.run_key).Bind(2, int64_t{key.rank})
        .Bind(3, int64_t{key.attempt}).Bind(4, tail.from_step);
    status = select_chunks_from_.ForEachRow([&](const sqlite::Stmt& row) {
      chunks.push_back(Chunk{.rowid = row.Int(0), .first = row.Int(1), .last = row.Int(2),
                             .n = static_cast<size_t>(row.Int(3)),
                             .blob = std::string(row.Blob(4))});
    });
    select_chunks_from_.Reset();
  }
  google::protobuf::RepeatedPtrField<v1::StepRecord> merged, part;
  auto merge = [&](size_t begin, size_t end) -> absl::Status {
    merged.Clear();
    for (size_t i = begin; i < end; ++i) {
      if (absl::Status s = DecodeStepChunk(chunks[i].blob, &part); !s.ok()) return s;
      for (v1::StepRecord& r : part) merged.Add()->Swap(&r);
      delete_chunk_.Bind(1, chunks[i].rowid);
      if (absl::Status s = delete_chunk_.Run(); !s.ok()) return s;
    }
    insert_chunk_.Bind(1, tail.run_key).Bind(2, int64_t{key.rank})
        .Bind(3, int64_t{key.attempt}).Bind(4, chunks[begin].first)
        .Bind(5, chunks[end - 1].last).Bind(6, static_cast<int64_t>(merged.size()))
        .BindBlob(7, EncodeStepChunk(merged));
    return insert_chunk_.Run();
  };
  // Greedy groups of consecutive chunks of at most kCompactRecords records;
  // a group is merged once the next chunk does not fit in it and if it holds
  // a small chunk. The last one may still grow and waits, unless the scan
  // stopped at its LIMIT: then it is merged too, so that every call makes
  // progress (a stream of one-record batches has many small chunks).
  const bool limited = chunks.size() == kCompactScanRows;
  size_t begin = 0, scanned = 0;
  for (const Chunk& c : chunks) scanned += c.n;
  while (status.ok() && begin < chunks.size()) {
    size_t end = begin, records = 0;
    bool small = false;
    while (end < chunks.size() && records + chunks[end].n <= kCompactRecords) {
      records += chunks[end].n;
      small = small || chunks[end].n < kSmallChunk;
      ++end;
    }
    if (end == chunks.size() && !limited) break;  // open
    if (end == begin) {
      ++begin;  // a chunk larger than a merged one
      continue;
    }
    if (small && end - begin >= 2) {
      status = merge(begin, end);
      if (merged_records != nullptr) *merged_records += records;
    }
    begin = end;
  }
  if (status.ok()) status = sqlite::Exec(db_.get(), "COMMIT");
  if (!status.ok()) {
    if (!sqlite3_get_autocommit(db_.get())) {
      sqlite::Exec(db_.get(), "ROLLBACK").IgnoreError();
    }
    small_.erase(it);
    return status;
  }
  // What is left: past the LIMIT, what ApplyBatch counted beyond the scan
  // (due again once it is more than a merged chunk); else the open group.
  if (limited) {
    tail.from_step = chunks.back().last + 1;
    tail.records = tail.records > scanned ? tail.records - scanned : 0;
  } else if (begin < chunks.size()) {
    tail.from_step = chunks[begin].first;
    tail.records = 0;
    for (size_t i = begin; i < chunks.size(); ++i) tail.records += chunks[i].n;
  } else {
    tail.records = 0;
  }
  if (tail.records == 0) {
    small_.erase(it);
  } else if (tail.records > kCompactRecords) {
    tail.queued = true;
    ready_.push_back(key);
  }
  return absl::OkStatus();
}

}  // namespace trainwatch
