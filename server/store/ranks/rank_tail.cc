#include "store/ranks/rank_tail.h"

#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "store/sqlite.h"

namespace trainwatch {

absl::Status ForEachOpenDigest(sqlite3* db, std::optional<int64_t> run_key,
                               std::optional<uint32_t> rank,
                               const std::function<absl::Status(const OpenDigest&)>& open) {
  absl::StatusOr<sqlite::Stmt> rows = sqlite::Stmt::Prepare(
      db, "SELECT seq, run_key, records FROM rank_tail WHERE ?1 < 0 OR run_key = ?1 "
          "ORDER BY seq");
  if (!rows.ok()) return rows.status();
  absl::StatusOr<sqlite::Stmt> chunked = sqlite::Stmt::Prepare(
      db, "SELECT max(last_step) FROM step_chunks WHERE run_key = ?1 AND rank = ?2 "
          "AND attempt = ?3");
  if (!chunked.ok()) return chunked.status();
  rows->Bind(1, run_key.value_or(-1));
  // The last step each stream's chunks hold (nullopt: none).
  absl::flat_hash_map<std::tuple<int64_t, uint32_t, uint32_t>, std::optional<int64_t>>
      in_chunks;
  std::vector<RankTailEntry> streams;
  google::protobuf::RepeatedPtrField<v1::StepRecord> recs;
  while (true) {
    absl::StatusOr<bool> row = rows->Step();
    if (!row.ok()) return row.status();
    if (!*row) return absl::OkStatus();
    const int64_t seq = rows->Int(0), key = rows->Int(1);
    if (absl::Status d = DecodeRankTail(rows->Blob(2), &streams, &recs); !d.ok()) {
      return absl::DataLossError(absl::StrCat("rank_tail row ", seq, ": ", d.message()));
    }
    for (int i = 0; i < recs.size(); ++i) {
      const RankTailEntry& s = streams[static_cast<size_t>(i)];
      if (rank.has_value() && s.rank != *rank) continue;
      auto done = in_chunks.find({key, s.rank, s.attempt});
      if (done == in_chunks.end()) {
        chunked->Bind(1, key).Bind(2, int64_t{s.rank}).Bind(3, int64_t{s.attempt});
        absl::StatusOr<bool> got = chunked->Step();
        std::optional<int64_t> last;
        if (got.ok() && *got && !chunked->IsNull(0)) last = chunked->Int(0);
        chunked->Reset();
        if (!got.ok()) return got.status();
        done = in_chunks.emplace(std::tuple{key, s.rank, s.attempt}, last).first;
      }
      const uint64_t step = recs[i].step();
      if (done->second.has_value() &&
          step <= static_cast<uint64_t>(std::max<int64_t>(*done->second, 0))) {
        continue;
      }
      OpenDigest d{.seq = seq, .run_key = key, .stream = s, .record = &recs[i]};
      if (absl::Status st = open(d); !st.ok()) return st;
    }
  }
}

}  // namespace trainwatch
