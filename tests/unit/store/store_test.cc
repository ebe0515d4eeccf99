// Store tests on a private in-memory database.
#include "store/store.h"

#include <sqlite3.h>

#include <bit>
#include <cstdio>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "store/codec/step_codec.h"
#include "store/writer.h"
#include "eventually.h"
#include "test_records.h"

namespace trainwatch {
namespace {

using testing::Start;
using testing::StepRecords;
using testing::Steps;

// Submits an op and waits for its result.
WriteResult SubmitAndWait(Store& store, WriteOp op) {
  std::promise<WriteResult> p;
  op.done = [&p](WriteResult r) { p.set_value(std::move(r)); };
  store.Submit(std::move(op));
  return p.get_future().get();
}

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Store>> s = Store::Open({.path = ":memory:"});
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
  }

  WriteResult Write(WriteOp op) { return SubmitAndWait(*store_, std::move(op)); }
  WriteResult StartStream(const v1::RunStart& s) {
    return Write({.key = {s.run_id(), s.rank(), s.attempt()},
                  .body = WriteOp::Start{s},
                  .received_unix_nanos = 1000});
  }
  WriteResult Batch(const StreamKey& key, StepRecords recs) {
    return Write({.key = key,
                  .body = WriteOp::Batch{std::move(recs)},
                  .received_unix_nanos = 2000});
  }
  std::vector<v1::StepRecords::Item> Read(const std::string& run,
                                          uint64_t from = 0, uint64_t to = 0,
                                          std::optional<uint32_t> rank = {}) {
    std::vector<v1::StepRecords::Item> items;
    absl::Status s = store_->ReadSteps(run, from, to, rank, 7,
                                       [&](v1::StepRecords& c) {
                                         for (auto& i : c.items()) items.push_back(i);
                                         return true;
                                       });
    EXPECT_TRUE(s.ok()) << s;
    return items;
  }

  std::unique_ptr<Store> store_;
};

TEST_F(StoreTest, StoresAndReadsBackRecordsInOrder) {
  ASSERT_TRUE(StartStream(Start("r1")).status.ok());
  StreamKey key{"r1", 0, 0};
  WriteResult w1 = Batch(key, Steps(0, 50));
  ASSERT_TRUE(w1.status.ok()) << w1.status;
  EXPECT_EQ(w1.stored, 50u);
  ASSERT_TRUE(Batch(key, Steps(50, 100)).status.ok());

  std::vector<v1::StepRecords::Item> items = Read("r1");
  ASSERT_EQ(items.size(), 100u);
  for (size_t i = 0; i < items.size(); ++i) {
    EXPECT_EQ(items[i].record().step(), i);
    EXPECT_EQ(items[i].record().batch_ids(0), static_cast<int64_t>(2 * i));
  }
  EXPECT_EQ(Read("r1", 10, 19).size(), 10u);
  EXPECT_EQ(Read("r1", 95).size(), 5u);
}

TEST_F(StoreTest, ResentAndOlderStepsAreStoredOnce) {
  ASSERT_TRUE(StartStream(Start("r1")).status.ok());
  StreamKey key{"r1", 0, 0};
  ASSERT_TRUE(Batch(key, Steps(0, 10)).status.ok());
  WriteResult resend = Batch(key, Steps(5, 15));  // 5..9 already stored
  ASSERT_TRUE(resend.status.ok());
  EXPECT_EQ(resend.stored, 5u);
  std::vector<v1::StepRecords::Item> added = Read("r1", 10);
  ASSERT_EQ(added.size(), 5u);
  EXPECT_EQ(added.front().record().step(), 10u);
  WriteResult dup = Batch(key, Steps(0, 15));
  EXPECT_EQ(dup.stored, 0u);
  EXPECT_EQ(Read("r1").size(), 15u);

  absl::StatusOr<v1::RunSummary> run = store_->GetRun("r1");
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->steps(), 15u);
  EXPECT_EQ(run->last_step(), 14u);
}

TEST_F(StoreTest, StepsGoingBackwardsInsideABatchAreDropped) {
  ASSERT_TRUE(StartStream(Start("r1")).status.ok());
  StepRecords recs = Steps(0, 5);
  recs[3].set_step(1);  // goes backwards
  WriteResult w = Batch({"r1", 0, 0}, recs);
  EXPECT_EQ(w.stored, 4u);
  std::vector<uint64_t> steps;
  for (const v1::StepRecords::Item& item : Read("r1")) steps.push_back(item.record().step());
  EXPECT_EQ(steps, (std::vector<uint64_t>{0, 1, 2, 4}));
}

TEST_F(StoreTest, RanksAndAttemptsAreSeparateStreams) {
  ASSERT_TRUE(StartStream(Start("r1", 0, 0)).status.ok());
  ASSERT_TRUE(StartStream(Start("r1", 1, 0)).status.ok());
  ASSERT_TRUE(StartStream(Start("r1", 0, 1)).status.ok());
  ASSERT_TRUE(Batch({"r1", 0, 0}, Steps(0, 20)).status.ok());
  ASSERT_TRUE(Batch({"r1", 1, 0}, Steps(0, 20)).status.ok());
  // A restart from a checkpoint at step 10: its steps are stored again.
  ASSERT_EQ(Batch({"r1", 0, 1}, Steps(10, 30)).stored, 20u);
  EXPECT_EQ(Read("r1").size(), 60u);
  std::vector<v1::StepRecords::Item> rank1 = Read("r1", 0, 0, 1u);
  ASSERT_EQ(rank1.size(), 20u);
  EXPECT_EQ(rank1.front().rank(), 1u);
  absl::StatusOr<v1::RunSummary> run = store_->GetRun("r1");
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->attempt(), 1u);
  EXPECT_EQ(run->labels().at("model"), "tiny");
}

// Records as a rank sends them: its own loss, the global norm, a shard.
StepRecords RankRecords(uint64_t from, uint64_t to) {
  StepRecords recs = Steps(from, to, 1.2345678901);
  for (v1::StepRecord& r : recs) {
    r.set_loss(2.5);
    r.set_shard_sq_sum(0.1 + 1e-9 * static_cast<double>(r.step()));
    r.set_step_time_s(1.0000001);
  }
  return recs;
}

TEST_F(StoreTest, TheLeadKeepsEveryFieldTheOtherRanksADigest) {
  // Rank 2 starts first: the lead is the lowest rank stored, whatever the
  // order, and a rank is told by the lead at the time of its write.
  ASSERT_TRUE(StartStream(Start("r1", 2, 0)).status.ok());
  ASSERT_TRUE(Batch({"r1", 2, 0}, RankRecords(0, 5)).status.ok());
  ASSERT_TRUE(StartStream(Start("r1", 0, 0)).status.ok());
  ASSERT_TRUE(StartStream(Start("r1", 1, 0)).status.ok());
  for (uint32_t rank : {0u, 1u, 2u}) {
    ASSERT_EQ(Batch({"r1", rank, 0}, RankRecords(5, 10)).stored, 5u);
  }
  std::vector<v1::StepRecords::Item> lead = Read("r1", 5, 9, 0u);
  ASSERT_EQ(lead.size(), 5u);
  EXPECT_EQ(lead[0].record().grad_norm(), 1.2345678901);
  EXPECT_EQ(lead[0].record().loss(), 2.5);
  EXPECT_EQ(lead[0].record().batch_ids_size(), 1);
  for (uint32_t rank : {1u, 2u}) {
    std::vector<v1::StepRecords::Item> other = Read("r1", 5, 9, rank);
    ASSERT_EQ(other.size(), 5u) << rank;
    const v1::StepRecord& r = other[0].record();
    EXPECT_EQ(r.step(), 5u);
    EXPECT_NE(r.grad_norm(), 1.2345678901);
    EXPECT_NEAR(r.grad_norm(), 1.2345678901, 1e-4);
    EXPECT_NEAR(r.shard_sq_sum(), 0.1, 1e-5);
    EXPECT_NEAR(r.step_time_s(), 1.0, 1e-4);
    EXPECT_FALSE(r.has_loss()) << rank;
    EXPECT_EQ(r.batch_ids_size(), 0);
  }
  // Written while it was the lead, rank 2's first records stay whole.
  EXPECT_EQ(Read("r1", 0, 4, 2u)[0].record().loss(), 2.5);
}

TEST(StoreFileTest, FullRankRecordsKeepEveryFieldOfEveryRank) {
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(
      {.path = ":memory:", .rank_records = StoreOptions::RankRecords::kFull});
  ASSERT_TRUE(store.ok()) << store.status();
  for (uint32_t rank : {0u, 1u}) {
    std::promise<WriteResult> started, wrote;
    (*store)->Submit({.key = {"r1", rank, 0},
                      .body = WriteOp::Start{Start("r1", rank)},
                      .done = [&](WriteResult r) { started.set_value(std::move(r)); }});
    ASSERT_TRUE(started.get_future().get().status.ok());
    (*store)->Submit({.key = {"r1", rank, 0},
                      .body = WriteOp::Batch{RankRecords(0, 3)},
                      .done = [&](WriteResult r) { wrote.set_value(std::move(r)); }});
    ASSERT_EQ(wrote.get_future().get().stored, 3u);
  }
  size_t seen = 0;
  ASSERT_TRUE((*store)->ReadSteps("r1", 0, 0, 1u, 100, [&](v1::StepRecords& c) {
    for (const auto& item : c.items()) {
      EXPECT_EQ(item.record().grad_norm(), 1.2345678901);
      EXPECT_EQ(item.record().loss(), 2.5);
      ++seen;
    }
    return true;
  }).ok());
  EXPECT_EQ(seen, 3u);
}

TEST_F(StoreTest, KStartReportsWhereAStreamLeftOff) {
  ASSERT_TRUE(StartStream(Start("r1")).status.ok());
  ASSERT_TRUE(Batch({"r1", 0, 0}, Steps(0, 42)).status.ok());
  WriteResult again = StartStream(Start("r1"));
  ASSERT_TRUE(again.last_step.has_value());
  EXPECT_EQ(*again.last_step, 41u);
}

TEST_F(StoreTest, BatchWithoutRunStartFailsAlone) {
  WriteResult w = Batch({"ghost", 0, 0}, Steps(0, 3));
  EXPECT_TRUE(absl::IsFailedPrecondition(w.status)) << w.status;
  ASSERT_TRUE(StartStream(Start("r1")).status.ok());
  EXPECT_TRUE(Batch({"r1", 0, 0}, Steps(0, 3)).status.ok());
}

TEST_F(StoreTest, EventsAreStoredOnceAndFinishTheRun) {
  ASSERT_TRUE(StartStream(Start("r1")).status.ok());
  v1::RunEvent e;
  e.set_step(100);
  e.set_kind(v1::CHECKPOINT_SAVED);
  e.set_detail("ckpt-100");
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(Write({.key = {"r1", 0, 0},
                       .body = WriteOp::Event{e},
                       .received_unix_nanos = 5})
                    .status.ok());
  }
  e.set_kind(v1::RUN_FINISHED);
  ASSERT_TRUE(Write({.key = {"r1", 0, 0},
                     .body = WriteOp::Event{e},
                     .received_unix_nanos = 6})
                  .status.ok());
  absl::StatusOr<std::vector<v1::RunEvent>> events = store_->ListEvents("r1");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].detail(), "ckpt-100");
  EXPECT_EQ(store_->GetRun("r1")->state(), "finished");
}

TEST_F(StoreTest, SpikeOutcomeAlertHostAndHostIncidentsAreKept) {
  ASSERT_TRUE(StartStream(Start("r1")).status.ok());
  v1::Spike spike;
  spike.set_step(150);
  spike.set_grad_norm(40);
  spike.add_batch_ids(1200);
  ASSERT_TRUE(Write({.key = {"r1", 0, 0},
                     .body = WriteOp::Spike{spike}})
                  .status.ok());
  spike.set_outcome("recovered");
  spike.set_batches_skipped(true);
  ASSERT_TRUE(Write({.key = {"r1", 0, 0},
                     .body = WriteOp::SpikeOutcome{spike}})
                  .status.ok());
  absl::StatusOr<std::vector<v1::Spike>> spikes = store_->ListSpikes("r1");
  ASSERT_TRUE(spikes.ok()) << spikes.status();
  ASSERT_EQ(spikes->size(), 1u);
  EXPECT_EQ((*spikes)[0].outcome(), "recovered");
  EXPECT_TRUE((*spikes)[0].batches_skipped());
  EXPECT_EQ((*spikes)[0].batch_ids(0), 1200);

  v1::Alert alert;
  alert.set_alertname("RankStraggler");
  alert.set_run("r1");
  alert.set_severity(v1::SEVERITY_WARNING);
  alert.set_state(v1::ALERT_STATE_FIRING);
  alert.set_started_step(10);
  alert.set_rank(5);
  alert.set_host("node-3");
  ASSERT_TRUE(Write({.key = {"r1", 0, 0},
                     .body = WriteOp::Alert{alert}})
                  .status.ok());
  absl::StatusOr<std::vector<v1::Alert>> alerts = store_->ListAlerts("r1", false);
  ASSERT_TRUE(alerts.ok()) << alerts.status();
  ASSERT_EQ(alerts->size(), 1u);
  EXPECT_EQ((*alerts)[0].host(), "node-3");

  for (int64_t t : {100, 200, 200}) {  // the repeat is stored once
    ASSERT_TRUE(Write({.body = WriteOp::HostIncident{{.host = "node-3",
                                    .alertname = "RankStraggler",
                                    .run_id = "r1",
                                    .unix_nanos = t}}})
                    .status.ok());
  }
  absl::StatusOr<std::vector<HostIncidentRow>> rows = store_->ListHostIncidents(150);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0].host, "node-3");
  EXPECT_EQ((*rows)[0].run_id, "r1");
  EXPECT_EQ((*rows)[0].unix_nanos, 200);
  EXPECT_EQ(store_->ListHostIncidents(0)->size(), 2u);
}

TEST_F(StoreTest, UnknownRunIsNotFound) {
  absl::Status s = store_->ReadSteps("nope", 0, 0, std::nullopt, 10,
                                     [](v1::StepRecords&) { return true; });
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_TRUE(absl::IsNotFound(store_->GetRun("nope").status()));
}

TEST_F(StoreTest, SubmitAfterCloseFailsWithUnavailable) {
  store_->Close();
  WriteResult w = StartStream(Start("r1"));
  EXPECT_TRUE(absl::IsUnavailable(w.status)) << w.status;
}

TEST(StoreFileTest, ReopenKeepsExactlyOnceState) {
  std::string path = ::testing::TempDir() + "/store_reopen_test.db";
  std::remove(path.c_str());
  for (int round = 0; round < 2; ++round) {
    absl::StatusOr<std::unique_ptr<Store>> store = Store::Open({.path = path});
    ASSERT_TRUE(store.ok()) << store.status();
    std::promise<WriteResult> started, wrote;
    v1::RunStart s = Start("r1");
    (*store)->Submit({.key = {"r1", 0, 0},
                      .body = WriteOp::Start{s},
                      .done = [&](WriteResult r) { started.set_value(std::move(r)); }});
    ASSERT_TRUE(started.get_future().get().status.ok());
    // The second round resends steps 0..99 after a "restart": only 100..149 are new.
    (*store)->Submit({.key = {"r1", 0, 0},
                      .body = WriteOp::Batch{Steps(0, round == 0 ? 100 : 150)},
                      .done = [&](WriteResult r) { wrote.set_value(std::move(r)); }});
    EXPECT_EQ(wrote.get_future().get().stored, round == 0 ? 100u : 50u);
  }
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open({.path = path});
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->GetRun("r1")->steps(), 150u);
}

// The page size of the file on disk, read with a connection of our own.
int PageSize(const std::string& path) {
  sqlite3* db = nullptr;
  int size = -1;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db, "PRAGMA page_size", -1, &stmt, nullptr) == SQLITE_OK &&
        sqlite3_step(stmt) == SQLITE_ROW) {
      size = sqlite3_column_int(stmt, 0);
    }
    sqlite3_finalize(stmt);
  }
  sqlite3_close(db);
  return size;
}

// A path in the test's temporary directory, with no database there.
std::string FreshDb(const std::string& name) {
  const std::string path = ::testing::TempDir() + "/" + name;
  for (const char* suffix : {"", "-wal", "-shm"}) std::remove((path + suffix).c_str());
  return path;
}

// Opens a store on `options`, starts run r1 and stores `records`.
void WriteRecords(const StoreOptions& options, StepRecords records) {
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  std::promise<WriteResult> started, wrote;
  (*store)->Submit({.key = {"r1", 0, 0},
                    .body = WriteOp::Start{Start("r1")},
                    .done = [&](WriteResult r) { started.set_value(std::move(r)); }});
  ASSERT_TRUE(started.get_future().get().status.ok());
  const size_t n = static_cast<size_t>(records.size());
  (*store)->Submit({.key = {"r1", 0, 0},
                    .body = WriteOp::Batch{std::move(records)},
                    .done = [&](WriteResult r) { wrote.set_value(std::move(r)); }});
  EXPECT_EQ(wrote.get_future().get().stored, n);
}

// Stores steps [from, to) of run r1.
void WriteSteps(const StoreOptions& options, uint64_t from, uint64_t to) {
  WriteRecords(options, Steps(from, to));
}

TEST(StoreFileTest, ANewDatabaseGetsThePageSizeAnExistingOneKeepsItsOwn) {
  const std::string fresh = ::testing::TempDir() + "/store_page_fresh.db";
  const std::string old = ::testing::TempDir() + "/store_page_old.db";
  for (const std::string& p : {fresh, old}) {
    for (const char* suffix : {"", "-wal", "-shm"}) std::remove((p + suffix).c_str());
  }
  // `old` made by a store of SQLite's default pages, `fresh` by today's.
  WriteSteps({.path = old, .page_size = 4096}, 0, 2000);
  WriteSteps({.path = old}, 2000, 4000);  // reopened by a store of 8 KiB pages
  WriteSteps({.path = fresh}, 0, 4000);
  EXPECT_EQ(PageSize(old), 4096);
  EXPECT_EQ(PageSize(fresh), StoreOptions{}.page_size);
  EXPECT_EQ(StoreOptions{}.page_size, 8192);
  for (const std::string& p : {fresh, old}) {
    absl::StatusOr<std::unique_ptr<Store>> store = Store::Open({.path = p});
    ASSERT_TRUE(store.ok());
    EXPECT_EQ((*store)->GetRun("r1")->steps(), 4000u) << p;
  }
}

// Runs `sql` on the file with a connection of our own; the first column of
// the last row, or the error.
std::string Sql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  std::string out;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) return "cannot open";
  char* error = nullptr;
  auto row = [](void* o, int n, char** values, char**) {
    *static_cast<std::string*>(o) = n > 0 && values[0] ? values[0] : "NULL";
    return 0;
  };
  if (sqlite3_exec(db, sql.c_str(), row, &out, &error) != SQLITE_OK) {
    out = std::string("error: ") + (error ? error : "?");
    sqlite3_free(error);
  }
  sqlite3_close(db);
  return out;
}

// The file's chunk count once the writer's merges have made it `want`, or
// what it is when Eventually gives up waiting for that.
std::string ChunksOnceMerged(const std::string& path, const std::string& want) {
  std::string chunks;
  testing::Eventually([&] {
    chunks = Sql(path, "SELECT count(*) FROM step_chunks");
    return chunks == want;
  });
  return chunks;
}

// A database of schema version 5 kept step_chunks WITHOUT ROWID; version 6
// makes it a rowid table and keeps every chunk.
TEST(StoreFileTest, AVersion5DatabaseIsMigratedWithItsRecords) {
  const std::string path = FreshDb("store_v5.db");
  ASSERT_NO_FATAL_FAILURE(WriteSteps({.path = path}, 0, 3000));
  // Back to version 5's layout, as a server of that version left it.
  ASSERT_EQ(Sql(path, R"sql(
    CREATE TABLE c5 (run_key INTEGER NOT NULL, rank INTEGER NOT NULL,
      attempt INTEGER NOT NULL, first_step INTEGER NOT NULL,
      last_step INTEGER NOT NULL, n INTEGER NOT NULL, records BLOB NOT NULL,
      PRIMARY KEY (run_key, rank, attempt, first_step)) WITHOUT ROWID;
    INSERT INTO c5 SELECT run_key, rank, attempt, first_step, last_step, n,
      records FROM step_chunks;
    DROP TABLE step_chunks;
    ALTER TABLE c5 RENAME TO step_chunks;
    PRAGMA user_version = 5;
    SELECT count(*) FROM step_chunks;)sql"),
            "1");
  ASSERT_NE(Sql(path, "SELECT rowid FROM step_chunks").rfind("error", 0),
            std::string::npos)
      << "version 5's table has no rowid";

  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open({.path = path});
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->GetRun("r1")->steps(), 3000u);
  uint64_t read = 0, next = 0;
  ASSERT_TRUE((*store)->ReadSteps("r1", 0, 0, std::nullopt, 1024,
                                  [&](v1::StepRecords& chunk) {
                                    for (const auto& item : chunk.items()) {
                                      EXPECT_EQ(item.record().step(), next++);
                                      ++read;
                                    }
                                    return true;
                                  }).ok());
  EXPECT_EQ(read, 3000u);
  store->reset();
  EXPECT_EQ(Sql(path, "PRAGMA user_version"), absl::StrCat(Store::kSchemaVersion));
  EXPECT_EQ(Sql(path, "SELECT count(rowid) FROM step_chunks"), "1");
}

// Rewrites every chunk of the file as the store wrote it before the columnar
// format: a serialized StepBatch of the records (what writer.cc encoded).
void RewriteChunksInTheOldFormat(const std::string& path) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* select = nullptr;
  sqlite3_stmt* update = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT rowid, records FROM step_chunks", -1,
                               &select, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_prepare_v2(db, "UPDATE step_chunks SET records = ?2 WHERE rowid = ?1",
                               -1, &update, nullptr), SQLITE_OK);
  std::vector<std::pair<int64_t, std::string>> old;
  while (sqlite3_step(select) == SQLITE_ROW) {
    std::string_view blob(static_cast<const char*>(sqlite3_column_blob(select, 1)),
                          static_cast<size_t>(sqlite3_column_bytes(select, 1)));
    v1::StepBatch batch;
    ASSERT_TRUE(DecodeStepChunk(blob, batch.mutable_records()).ok());
    old.emplace_back(sqlite3_column_int64(select, 0), batch.SerializeAsString());
  }
  for (const auto& [rowid, blob] : old) {
    sqlite3_bind_int64(update, 1, rowid);
    sqlite3_bind_blob(update, 2, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
    ASSERT_EQ(sqlite3_step(update), SQLITE_DONE);
    sqlite3_reset(update);
  }
  sqlite3_finalize(select);
  sqlite3_finalize(update);
  sqlite3_close(db);
}

// Records whose doubles include what a lossy path would lose.
StepRecords OddRecords(uint64_t from, uint64_t to) {
  StepRecords recs = Steps(from, to);
  for (v1::StepRecord& r : recs) {
    r.set_loss(std::bit_cast<double>(uint64_t{0x7ff8000000000000} | r.step()));
    r.set_lr(r.step() % 2 ? -0.0 : 3e-4 / static_cast<double>(r.step() + 1));
    if (r.step() % 100 == 0) (*r.mutable_layer_stats())["l0"].set_grad_norm(1.5);
  }
  return recs;
}

// Version 6 stored each chunk as a serialized StepBatch. Version 7 keeps
// those chunks as they are, reads them back bit for bit beside the columnar
// ones it writes, and an older server is told the file is newer.
TEST(StoreFileTest, AVersion6DatabaseKeepsItsChunksAndReadsThemBack) {
  const std::string path = FreshDb("store_v6.db");
  ASSERT_NO_FATAL_FAILURE(WriteRecords({.path = path}, OddRecords(0, 2500)));
  ASSERT_NO_FATAL_FAILURE(RewriteChunksInTheOldFormat(path));
  ASSERT_EQ(Sql(path, "PRAGMA user_version = 6; PRAGMA user_version"), "6");
  ASSERT_EQ(Sql(path, "SELECT hex(substr(records, 1, 1)) FROM step_chunks"), "12")
      << "a StepBatch starts with the tag of its records";

  // Migrates, then adds a chunk.
  ASSERT_NO_FATAL_FAILURE(WriteRecords({.path = path}, OddRecords(2500, 4000)));
  EXPECT_EQ(Sql(path, "PRAGMA user_version"), absl::StrCat(Store::kSchemaVersion));
  EXPECT_EQ(Sql(path, "SELECT group_concat(f, ',') FROM (SELECT "
                      "hex(substr(records, 1, 1)) AS f FROM step_chunks ORDER BY first_step)"),
            "12,17");
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open({.path = path});
  ASSERT_TRUE(store.ok()) << store.status();
  const StepRecords want = OddRecords(0, 4000);
  int next = 0;
  ASSERT_TRUE((*store)->ReadSteps("r1", 0, 0, std::nullopt, 1000,
                                  [&](v1::StepRecords& chunk) {
                                    for (const auto& item : chunk.items()) {
                                      const v1::StepRecord& got = item.record();
                                      const v1::StepRecord& w = want[next++];
                                      EXPECT_EQ(got.step(), w.step());
                                      EXPECT_EQ(std::bit_cast<uint64_t>(got.loss()),
                                                std::bit_cast<uint64_t>(w.loss()));
                                      EXPECT_EQ(std::bit_cast<uint64_t>(got.lr()),
                                                std::bit_cast<uint64_t>(w.lr()));
                                      EXPECT_EQ(got.batch_ids(0), w.batch_ids(0));
                                      EXPECT_EQ(got.layer_stats_size(), w.layer_stats_size());
                                    }
                                    return true;
                                  }).ok());
  EXPECT_EQ(next, 4000);
}

// Small batches make small chunks; when idle the writer merges runs of
// them (with a large chunk among them too) into chunks of up to 2,048
// records, and the records, their order and exactly-once stay as they were.
TEST(StoreFileTest, SmallChunksAreMergedWhenTheWriterIsIdle) {
  const std::string path = FreshDb("store_compact.db");
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open({.path = path});
  ASSERT_TRUE(store.ok()) << store.status();
  auto write = [&](WriteOp op) { return SubmitAndWait(**store, std::move(op)); };
  ASSERT_TRUE(write({.key = {"r1", 0, 0}, .body = WriteOp::Start{Start("r1")}})
                  .status.ok());
  uint64_t step = 0;
  for (uint64_t size : std::vector<uint64_t>(5, 100)) {
    ASSERT_EQ(write({.key = {"r1", 0, 0},
                     .body = WriteOp::Batch{OddRecords(step, step + size)}}).stored, size);
    step += size;
  }
  ASSERT_EQ(write({.key = {"r1", 0, 0},
                   .body = WriteOp::Batch{OddRecords(step, step + 1000)}}).stored, 1000u);
  step += 1000;
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(write({.key = {"r1", 0, 0},
                     .body = WriteOp::Batch{OddRecords(step, step + 100)}}).stored, 100u);
    step += 100;
  }
  // 5 x 100, 1,000 and 5 x 100 make the first merged chunk (the next would
  // pass 2,048); the last 15 chunks wait for more.
  const std::string chunks = ChunksOnceMerged(path, "16");
  ASSERT_EQ(chunks, "16");
  EXPECT_EQ(Sql(path, "SELECT n || ' ' || first_step || '-' || last_step FROM step_chunks "
                      "ORDER BY first_step LIMIT 1"),
            "2000 0-1999");

  const StepRecords want = OddRecords(0, step);
  uint64_t next = 0;
  ASSERT_TRUE((*store)->ReadSteps("r1", 0, 0, std::nullopt, 1000,
                                  [&](v1::StepRecords& chunk) {
                                    for (const auto& item : chunk.items()) {
                                      const v1::StepRecord& w = want[static_cast<int>(next++)];
                                      EXPECT_EQ(item.record().step(), w.step());
                                      EXPECT_EQ(std::bit_cast<uint64_t>(item.record().loss()),
                                                std::bit_cast<uint64_t>(w.loss()));
                                    }
                                    return true;
                                  }).ok());
  EXPECT_EQ(next, step);
  EXPECT_EQ(write({.key = {"r1", 0, 0},
                   .body = WriteOp::Batch{OddRecords(0, step + 1)}}).stored, 1u)
      << "a resend stores only the step not stored before";
  EXPECT_EQ((*store)->GetRun("r1")->steps(), step + 1);
}

// MoE reports (their counts coded by store/codec/moe_counts.h) read back
// exactly after the writer stored them in small batches and merged those.
TEST(StoreFileTest, MoeCountsReadBackExactlyAfterMerges) {
  const std::string path = FreshDb("store_moe.db");
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open({.path = path});
  ASSERT_TRUE(store.ok()) << store.status();
  auto write = [&](WriteOp op) { return SubmitAndWait(**store, std::move(op)); };
  ASSERT_TRUE(write({.key = {"r1", 0, 0}, .body = WriteOp::Start{Start("r1")}})
                  .status.ok());
  StepRecords want = OddRecords(0, 2100);
  for (v1::StepRecord& r : want) {
    if (r.step() % 7 == 3) continue;  // records without a report among them
    for (int l = 0; l < 3; ++l) {
      v1::MoeLayerStats& layer = *r.mutable_moe()->add_layers();
      layer.set_layer(std::to_string(l));
      const int experts = l == 2 && r.step() >= 600 ? 4 : 8;  // a layer that changes
      for (int e = 0; e < experts; ++e) {
        layer.add_tokens_per_expert(65536 + 1000 * e + (r.step() * 7919 + e) % 700);
      }
      layer.set_aux_loss(1.01);
    }
  }
  for (int from = 0; from < want.size(); from += 100) {
    StepRecords batch(want.begin() + from, want.begin() + from + 100);
    ASSERT_EQ(write({.key = {"r1", 0, 0}, .body = WriteOp::Batch{std::move(batch)}}).stored,
              100u);
  }
  // 20 x 100 make a merged chunk (the next would pass 2,048); the last waits.
  const std::string chunks = ChunksOnceMerged(path, "2");
  EXPECT_EQ(chunks, "2");
  EXPECT_EQ(Sql(path, "SELECT group_concat(n || ':' || hex(substr(records, 1, 1)), ',') FROM "
                      "(SELECT * FROM step_chunks ORDER BY first_step)"),
            "2000:1F,100:1F");
  int next = 0;
  ASSERT_TRUE((*store)->ReadSteps("r1", 0, 0, std::nullopt, 1000,
                                  [&](v1::StepRecords& chunk) {
                                    for (const auto& item : chunk.items()) {
                                      const v1::StepRecord& w = want[next++];
                                      EXPECT_EQ(item.record().step(), w.step());
                                      EXPECT_EQ(item.record().moe().SerializeAsString(),
                                                w.moe().SerializeAsString())
                                          << "step " << w.step();
                                    }
                                    return true;
                                  }).ok());
  EXPECT_EQ(next, want.size());
}

// Chunks are bounded in bytes too: a batch of 16 records with a 48 x 128
// MoE report each (~200 KB) is not small and stays as written (merging it
// would code its counts again for nothing), and one-record batches of them
// (~12 KB each) merge into chunks of at most kCompactBytes of their parts.
TEST(StoreFileTest, LargeMoeChunksStayAsWrittenAndMergedOnesStayUnderTheirBytes) {
  const std::string path = FreshDb("store_moe_bytes.db");
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open({.path = path});
  ASSERT_TRUE(store.ok()) << store.status();
  auto write = [&](WriteOp op) { return SubmitAndWait(**store, std::move(op)); };
  ASSERT_TRUE(write({.key = {"r1", 0, 0}, .body = WriteOp::Start{Start("r1")}})
                  .status.ok());
  StepRecords want = OddRecords(0, 460);
  uint64_t noise = 1;
  for (v1::StepRecord& r : want) {
    for (int l = 0; l < 48; ++l) {
      v1::MoeLayerStats& layer = *r.mutable_moe()->add_layers();
      layer.set_layer("layers." + std::to_string(l));
      for (int e = 0; e < 128; ++e) {
        noise = noise * 6364136223846793005u + 1442695040888963407u;
        layer.add_tokens_per_expert(60000 + (noise >> 33) % 8000);
      }
    }
  }
  int from = 0;
  for (; from < 160; from += 16) {
    StepRecords batch(want.begin() + from, want.begin() + from + 16);
    ASSERT_EQ(write({.key = {"r1", 0, 0}, .body = WriteOp::Batch{std::move(batch)}}).stored,
              16u);
  }
  for (; from < want.size(); ++from) {
    StepRecords batch(want.begin() + from, want.begin() + from + 1);
    ASSERT_EQ(write({.key = {"r1", 0, 0}, .body = WriteOp::Batch{std::move(batch)}}).stored,
              1u);
  }
  ASSERT_TRUE(testing::Eventually([&] {
    return std::stoi(Sql(path, "SELECT count(*) FROM step_chunks WHERE n > 16")) >= 2;
  })) << "the one-record chunks were not merged";
  EXPECT_EQ(Sql(path, "SELECT count(*) FROM step_chunks WHERE n = 16 AND last_step < 160"),
            "10");
  EXPECT_EQ(Sql(path, "SELECT count(*) FROM step_chunks WHERE length(records) > " +
                          std::to_string(StoreWriter::kCompactBytes)),
            "0");
  int next = 0;
  ASSERT_TRUE((*store)->ReadSteps("r1", 0, 0, std::nullopt, 1000,
                                  [&](v1::StepRecords& chunk) {
                                    for (const auto& item : chunk.items()) {
                                      const v1::StepRecord& w = want[next++];
                                      EXPECT_EQ(item.record().moe().SerializeAsString(),
                                                w.moe().SerializeAsString())
                                          << "step " << w.step();
                                    }
                                    return true;
                                  }).ok());
  EXPECT_EQ(next, want.size());
}

// A stream of one-record batches: each idle merge takes the 256 chunks a
// scan reads, so it progresses (and stops) rather than waiting for 2,048
// records that one scan never sees.
TEST(StoreFileTest, OneRecordBatchesAreMergedAScanAtATime) {
  const std::string path = FreshDb("store_compact_ones.db");
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open({.path = path});
  ASSERT_TRUE(store.ok()) << store.status();
  std::promise<WriteResult> started;
  (*store)->Submit({.key = {"r1", 0, 0},
                    .body = WriteOp::Start{Start("r1")},
                    .done = [&](WriteResult r) { started.set_value(std::move(r)); }});
  ASSERT_TRUE(started.get_future().get().status.ok());
  constexpr uint64_t kSteps = 2100;
  std::promise<void> last;
  for (uint64_t step = 0; step < kSteps; ++step) {
    WriteOp op{.key = {"r1", 0, 0},
               .body = WriteOp::Batch{OddRecords(step, step + 1)}};
    if (step + 1 == kSteps) op.done = [&](WriteResult) { last.set_value(); };
    (*store)->Submit(std::move(op));
  }
  last.get_future().wait();
  // Past 2,048 records: the first 256 chunks become one; the 1,844 records
  // after them wait for more.
  const std::string chunks = ChunksOnceMerged(path, "1845");
  EXPECT_EQ(chunks, "1845");
  EXPECT_EQ(Sql(path, "SELECT n FROM step_chunks ORDER BY first_step LIMIT 1"), "256");
  EXPECT_EQ((*store)->GetRun("r1")->steps(), kSteps);
  uint64_t next = 0;
  ASSERT_TRUE((*store)->ReadSteps("r1", 0, 0, std::nullopt, 1000,
                                  [&](v1::StepRecords& chunk) {
                                    for (const auto& item : chunk.items()) {
                                      EXPECT_EQ(item.record().step(), next++);
                                    }
                                    return true;
                                  }).ok());
  EXPECT_EQ(next, kSteps);
}

// Starts r1's ranks on `store`.
void StartRanks(Store& store, std::initializer_list<uint32_t> ranks) {
  for (uint32_t rank : ranks) {
    std::promise<WriteResult> started;
    store.Submit({.key = {"r1", rank, 0},
                  .body = WriteOp::Start{Start("r1", rank)},
                  .done = [&](WriteResult r) { started.set_value(std::move(r)); }});
    ASSERT_TRUE(started.get_future().get().status.ok());
  }
}

// Steps [from, to) of ranks 0 and 1, a record a batch, as trainers at a
// step a second send them; returns once the last is committed.
void WriteRankSteps(Store& store, uint64_t from, uint64_t to) {
  std::promise<void> last;
  for (uint64_t step = from; step < to; ++step) {
    for (uint32_t rank : {0u, 1u}) {
      WriteOp op{.key = {"r1", rank, 0}, .body = WriteOp::Batch{RankRecords(step, step + 1)}};
      if (step + 1 == to && rank == 1) op.done = [&](WriteResult) { last.set_value(); };
      store.Submit(std::move(op));
    }
  }
  last.get_future().wait();
}

// The steps of rank `rank` that ReadSteps returns, in its order.
std::vector<uint64_t> StepsOf(const Store& store, uint32_t rank) {
  std::vector<uint64_t> steps;
  EXPECT_TRUE(store.ReadSteps("r1", 0, 0, rank, 100, [&](v1::StepRecords& c) {
    for (const auto& item : c.items()) steps.push_back(item.record().step());
    return true;
  }).ok());
  return steps;
}

std::vector<uint64_t> Range(uint64_t from, uint64_t to) {
  std::vector<uint64_t> out;
  for (uint64_t s = from; s < to; ++s) out.push_back(s);
  return out;
}

// A non-lead rank at a record a batch: its digests become chunks of
// kRankCompactRecords, written from memory, never a row a record; the ones
// not in a chunk yet live in rank_tail rows, are read back with the rest,
// and come back after a restart; a finished stream's go into a chunk.
TEST(StoreFileTest, OtherRanksDigestsWaitInMemoryAndBecomeWholeChunks) {
  const std::string path = FreshDb("store_rank_tail.db");
  {
    absl::StatusOr<std::unique_ptr<Store>> store = Store::Open({.path = path});
    ASSERT_TRUE(store.ok()) << store.status();
    StartRanks(**store, {0, 1});
    WriteRankSteps(**store, 0, 300);
    // 300 = 2 x 128 + 44: two chunks, 44 open digests.
    EXPECT_EQ(Sql(path, "SELECT group_concat(n, ',') FROM (SELECT n FROM step_chunks "
                        "WHERE rank = 1 ORDER BY first_step)"),
              "128,128");
    const int tail_rows = std::stoi(Sql(path, "SELECT count(*) FROM rank_tail"));
    EXPECT_GE(tail_rows, 1);
    EXPECT_LE(tail_rows, 44) << "rows holding no open digest are deleted";
    EXPECT_EQ(StepsOf(**store, 1), Range(0, 300));
  }
  {
    // A restart: the open digests are read back, merged with what follows.
    absl::StatusOr<std::unique_ptr<Store>> store = Store::Open({.path = path});
    ASSERT_TRUE(store.ok()) << store.status();
    StartRanks(**store, {0, 1});
    EXPECT_EQ(StepsOf(**store, 1), Range(0, 300));
    WriteRankSteps(**store, 300, 400);
    EXPECT_EQ(Sql(path, "SELECT group_concat(n, ',') FROM (SELECT n FROM step_chunks "
                        "WHERE rank = 1 ORDER BY first_step)"),
              "128,128,128");
    EXPECT_EQ(StepsOf(**store, 1), Range(0, 400));
    EXPECT_EQ(StepsOf(**store, 0), Range(0, 400));
    // All ranks, ordered by rank, attempt and step.
    std::vector<std::pair<uint32_t, uint64_t>> all;
    ASSERT_TRUE((*store)->ReadSteps("r1", 350, 0, std::nullopt, 7, [&](v1::StepRecords& c) {
      for (const auto& item : c.items()) all.emplace_back(item.rank(), item.record().step());
      return true;
    }).ok());
    ASSERT_EQ(all.size(), 100u);
    EXPECT_EQ(all.front(), (std::pair<uint32_t, uint64_t>{0, 350}));
    EXPECT_EQ(all[49], (std::pair<uint32_t, uint64_t>{0, 399}));
    EXPECT_EQ(all[50], (std::pair<uint32_t, uint64_t>{1, 350}));
    EXPECT_EQ(all.back(), (std::pair<uint32_t, uint64_t>{1, 399}));
    // The stream finishes: its 16 open digests go into a chunk, the rows go.
    std::promise<WriteResult> finished;
    v1::RunEvent e;
    e.set_step(399);
    e.set_kind(v1::RUN_FINISHED);
    (*store)->Submit({.key = {"r1", 1, 0},
                      .body = WriteOp::Event{e},
                      .done = [&](WriteResult r) { finished.set_value(std::move(r)); }});
    ASSERT_TRUE(finished.get_future().get().status.ok());
    EXPECT_EQ(Sql(path, "SELECT n FROM step_chunks WHERE rank = 1 ORDER BY first_step DESC "
                        "LIMIT 1"),
              "16");
    EXPECT_EQ(Sql(path, "SELECT count(*) FROM rank_tail"), "0");
    EXPECT_EQ(StepsOf(**store, 1), Range(0, 400));
  }
}

// Retention: a non-lead rank keeps its last rank_retention_steps steps (and
// at most a chunk and max(retention / 8, a group) more); the lead all.
TEST(StoreFileTest, OtherRanksAreKeptForTheirRetention) {
  const std::string path = FreshDb("store_rank_retention.db");
  absl::StatusOr<std::unique_ptr<Store>> store =
      Store::Open({.path = path, .rank_retention_steps = 1000});
  ASSERT_TRUE(store.ok()) << store.status();
  StartRanks(**store, {0, 1});
  constexpr uint64_t kSteps = 3000;
  WriteRankSteps(**store, 0, kSteps);
  const int64_t oldest = std::stoll(Sql(path, "SELECT min(first_step) FROM step_chunks WHERE rank = 1"));
  EXPECT_LE(oldest, int64_t{kSteps - 1000});
  EXPECT_GE(oldest, int64_t{kSteps - 1000 - 2 * 128});
  const std::vector<uint64_t> kept = StepsOf(**store, 1);
  ASSERT_FALSE(kept.empty());
  EXPECT_EQ(kept, Range(kept.front(), kSteps));
  EXPECT_EQ(StepsOf(**store, 0), Range(0, kSteps));
}

// A chunk that does not decode is reported with its run and stream.
TEST(StoreFileTest, ACorruptChunkIsDataLossNamingItsStream) {
  const std::string path = FreshDb("store_corrupt.db");
  ASSERT_NO_FATAL_FAILURE(WriteSteps({.path = path}, 0, 100));
  ASSERT_EQ(Sql(path, "UPDATE step_chunks SET records = substr(records, 1, 10); "
                      "SELECT count(*) FROM step_chunks"), "1");
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open({.path = path});
  ASSERT_TRUE(store.ok()) << store.status();
  absl::Status s = (*store)->ReadSteps("r1", 0, 0, std::nullopt, 10,
                                       [](v1::StepRecords&) { return true; });
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("run r1 (rank 0, attempt 0): step chunk:"), std::string::npos) << s;
}

}  // namespace
}  // namespace trainwatch
