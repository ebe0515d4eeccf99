// The store writer's non-lead ranks: their digests held open per stream,
// appended as rank_tail rows, written as chunks of kRankCompactRecords, and
// what retention no longer keeps of them.
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

}  // namespace trainwatch
