// The store writer's stream ledger and record writer: runs and streams by
// key (the exactly-once state: each stream's last step), RunStart, and a
// batch's new records as one chunk.
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
  const WriteOp::Batch& batch = std::get<WriteOp::Batch>(op.body);
  const google::protobuf::RepeatedPtrField<v1::StepRecord>& records = batch.records();
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
      .Bind(6, static_cast<int64_t>(picked_.size()));
  const std::string blob = EncodeStepChunk(records, picked_, batch.moe_counts());
  insert_chunk_.BindBlobUntilRun(7, blob);
  if (absl::Status s = insert_chunk_.Run(); !s.ok()) return s;
  if (rank_stream) {
    if (absl::Status s = Prune(op.key, st); !s.ok()) return s;
  }
  // Compaction's bookkeeping: from a stream's first small chunk on, the
  // records of its chunks.
  const bool small_chunk = IsSmallChunk(picked_.size(), blob.size());
  auto tail = small_.find(op.key);
  if (tail == small_.end() && small_chunk) {
    tail = small_.emplace(op.key, SmallChunks{.run_key = st.run_key, .from_step = first})
               .first;
  }
  if (tail != small_.end()) {
    // Past kCompactRecords (or kCompactBytes) at least one group of them is
    // complete.
    tail->second.records += picked_.size();
    tail->second.bytes += blob.size();
    if (!tail->second.queued && (tail->second.records > kCompactRecords ||
                                 tail->second.bytes > kCompactBytes)) {
      tail->second.queued = true;
      ready_.push_back(op.key);
    }
  }
  return absl::OkStatus();
}

}  // namespace trainwatch
