#include "stored_data.h"

#include <sqlite3.h>

#include <functional>
#include <string_view>
#include <tuple>

#include "gtest/gtest.h"
#include "store/codec/step_codec.h"
#include "store/ranks/rank_digest.h"

namespace trainwatch::testing {
namespace {

// Runs `sql` on the file and calls `row` for each result row.
void Query(const std::string& db_path, const char* sql,
           const std::function<void(sqlite3_stmt*)>& row) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr);
  ASSERT_EQ(rc, SQLITE_OK) << "opening " << db_path << ": " << sqlite3_errstr(rc);
  sqlite3_busy_timeout(db, 10000);
  sqlite3_stmt* stmt = nullptr;
  rc = sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr);
  EXPECT_EQ(rc, SQLITE_OK) << sql << ": " << sqlite3_errmsg(db);
  if (rc == SQLITE_OK) {
    while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) row(stmt);
    EXPECT_EQ(rc, SQLITE_DONE) << sql << ": " << sqlite3_errmsg(db);
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
}

std::string Text(sqlite3_stmt* stmt, int column) {
  const unsigned char* text = sqlite3_column_text(stmt, column);
  return text == nullptr ? "" : reinterpret_cast<const char*>(text);
}

std::string_view Blob(sqlite3_stmt* stmt, int column) {
  return std::string_view(static_cast<const char*>(sqlite3_column_blob(stmt, column)),
                          static_cast<size_t>(sqlite3_column_bytes(stmt, column)));
}

// The digests of non-lead ranks not in a chunk yet (server/store/writer.h):
// rank_tail rows less what a chunk of the stream covers, in step order.
std::map<RunRank, std::vector<v1::StepRecord>> ReadOpenDigests(const std::string& db_path) {
  using Stream = std::tuple<std::string, uint32_t, uint32_t>;
  std::map<Stream, int64_t> in_chunks;
  Query(db_path,
        "SELECT r.run_id, c.rank, c.attempt, MAX(c.last_step) FROM step_chunks c "
        "JOIN runs r USING (run_key) GROUP BY r.run_id, c.rank, c.attempt",
        [&](sqlite3_stmt* stmt) {
          in_chunks[{Text(stmt, 0), static_cast<uint32_t>(sqlite3_column_int64(stmt, 1)),
                     static_cast<uint32_t>(sqlite3_column_int64(stmt, 2))}] =
              sqlite3_column_int64(stmt, 3);
        });
  std::map<RunRank, std::vector<v1::StepRecord>> out;
  Query(db_path,
        "SELECT r.run_id, t.records FROM rank_tail t JOIN runs r USING (run_key) "
        "ORDER BY t.seq",
        [&](sqlite3_stmt* stmt) {
          std::vector<RankTailEntry> streams;
          google::protobuf::RepeatedPtrField<v1::StepRecord> records;
          const absl::Status decoded = DecodeRankTail(Blob(stmt, 1), &streams, &records);
          EXPECT_TRUE(decoded.ok()) << "undecodable rank_tail row of run " << Text(stmt, 0)
                                    << ": " << decoded;
          for (int i = 0; decoded.ok() && i < records.size(); ++i) {
            auto chunked = in_chunks.find({Text(stmt, 0), streams[i].rank, streams[i].attempt});
            if (chunked != in_chunks.end() &&
                static_cast<int64_t>(records[i].step()) <= chunked->second) {
              continue;
            }
            out[{Text(stmt, 0), streams[i].rank}].push_back(std::move(records[i]));
          }
        });
  return out;
}

}  // namespace

std::map<RunRank, std::vector<v1::StepRecord>> ReadStoredRecords(
    const std::string& db_path) {
  std::map<RunRank, std::vector<v1::StepRecord>> out;
  Query(db_path,
        "SELECT r.run_id, c.rank, c.n, c.records FROM step_chunks c JOIN runs r "
        "USING (run_key) ORDER BY r.run_id, c.rank, c.attempt, c.first_step",
        [&](sqlite3_stmt* stmt) {
          // A chunk as store/codec/step_codec.h encodes it (or a StepBatch,
          // before).
          google::protobuf::RepeatedPtrField<v1::StepRecord> chunk;
          const absl::Status decoded = DecodeStepChunk(
              std::string_view(static_cast<const char*>(sqlite3_column_blob(stmt, 3)),
                               static_cast<size_t>(sqlite3_column_bytes(stmt, 3))),
              &chunk);
          EXPECT_TRUE(decoded.ok()) << "undecodable chunk of run " << Text(stmt, 0)
                                    << ": " << decoded;
          EXPECT_EQ(chunk.size(), sqlite3_column_int64(stmt, 2))
              << "chunk count column disagrees with its records";
          auto& records = out[{Text(stmt, 0),
                               static_cast<uint32_t>(sqlite3_column_int64(stmt, 1))}];
          for (v1::StepRecord& r : chunk) {
            records.push_back(std::move(r));
          }
        });
  for (auto& [stream, open] : ReadOpenDigests(db_path)) {
    auto& records = out[stream];
    for (v1::StepRecord& r : open) records.push_back(std::move(r));
  }
  return out;
}

std::map<RunRank, int64_t> CountStoredRecords(const std::string& db_path) {
  std::map<RunRank, int64_t> out;
  Query(db_path,
        "SELECT r.run_id, c.rank, SUM(c.n) FROM step_chunks c JOIN runs r "
        "USING (run_key) GROUP BY r.run_id, c.rank",
        [&](sqlite3_stmt* stmt) {
          out[{Text(stmt, 0), static_cast<uint32_t>(sqlite3_column_int64(stmt, 1))}] =
              sqlite3_column_int64(stmt, 2);
        });
  for (const auto& [stream, open] : ReadOpenDigests(db_path)) {
    out[stream] += static_cast<int64_t>(open.size());
  }
  return out;
}

int64_t CountOverlappingChunks(const std::string& db_path) {
  int64_t n = -1;
  Query(db_path,
        "SELECT COUNT(*) FROM step_chunks a JOIN step_chunks b ON "
        "a.run_key = b.run_key AND a.rank = b.rank AND a.attempt = b.attempt "
        "AND a.first_step < b.first_step AND a.last_step >= b.first_step",
        [&](sqlite3_stmt* stmt) { n = sqlite3_column_int64(stmt, 0); });
  return n;
}

std::map<RunRank, v1::RunStart> ReadStoredStarts(const std::string& db_path) {
  std::map<RunRank, v1::RunStart> out;
  Query(db_path,
        "SELECT r.run_id, s.rank, s.start FROM streams s JOIN runs r "
        "USING (run_key) ORDER BY r.run_id, s.rank, s.attempt",
        [&](sqlite3_stmt* stmt) {
          v1::RunStart start;
          const std::string_view blob = Blob(stmt, 2);
          EXPECT_TRUE(start.ParseFromArray(blob.data(), static_cast<int>(blob.size())))
              << "unparsable RunStart of run " << Text(stmt, 0);
          out[{Text(stmt, 0), static_cast<uint32_t>(sqlite3_column_int64(stmt, 1))}] =
              std::move(start);
        });
  return out;
}

std::vector<StoredAlert> ReadStoredAlerts(const std::string& db_path) {
  std::vector<StoredAlert> out;
  Query(db_path,
        "SELECT r.run_id, a.alertname, a.started_step, a.state FROM alerts a "
        "JOIN runs r USING (run_key) ORDER BY r.run_id, a.started_step",
        [&](sqlite3_stmt* stmt) {
          out.push_back({Text(stmt, 0), Text(stmt, 1),
                         static_cast<uint64_t>(sqlite3_column_int64(stmt, 2)),
                         Text(stmt, 3)});
        });
  return out;
}

std::vector<std::pair<std::string, uint64_t>> ReadStoredSpikes(
    const std::string& db_path) {
  std::vector<std::pair<std::string, uint64_t>> out;
  Query(db_path,
        "SELECT r.run_id, s.step FROM spikes s JOIN runs r USING (run_key) "
        "ORDER BY r.run_id, s.step",
        [&](sqlite3_stmt* stmt) {
          out.emplace_back(Text(stmt, 0),
                           static_cast<uint64_t>(sqlite3_column_int64(stmt, 1)));
        });
  return out;
}

}  // namespace trainwatch::testing
