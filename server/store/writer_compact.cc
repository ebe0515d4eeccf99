// The store writer's compaction: a stream's consecutive small chunks merged
// into chunks of up to kCompactRecords records (writer.h).
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
  size_t begin = 0, scanned = 0, scanned_bytes = 0;
  for (const Chunk& c : chunks) {
    scanned += c.n;
    scanned_bytes += c.blob.size();
  }
  while (status.ok() && begin < chunks.size()) {
    size_t end = begin, records = 0, bytes = 0;
    bool small = false;
    while (end < chunks.size() && records + chunks[end].n <= kCompactRecords &&
           bytes + chunks[end].blob.size() <= kCompactBytes) {
      records += chunks[end].n;
      bytes += chunks[end].blob.size();
      small = small || IsSmallChunk(chunks[end].n, chunks[end].blob.size());
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
    tail.bytes = tail.bytes > scanned_bytes ? tail.bytes - scanned_bytes : 0;
  } else if (begin < chunks.size()) {
    tail.from_step = chunks[begin].first;
    tail.records = tail.bytes = 0;
    for (size_t i = begin; i < chunks.size(); ++i) {
      tail.records += chunks[i].n;
      tail.bytes += chunks[i].blob.size();
    }
  } else {
    tail.records = tail.bytes = 0;
  }
  if (tail.records == 0) {
    small_.erase(it);
  } else if (tail.records > kCompactRecords || tail.bytes > kCompactBytes) {
    tail.queued = true;
    ready_.push_back(key);
  }
  return absl::OkStatus();
}

}  // namespace trainwatch
