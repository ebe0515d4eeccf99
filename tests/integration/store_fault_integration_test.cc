// Storage faults against the real server: the database locked by another
// connection, SIGTERM while it stays locked, and a full disk (a small tmpfs).
// In each, the server stops acknowledging while a trainer keeps recording,
// says so on /metrics and in its log, and once the fault clears every record
// is stored exactly once. Recovery time and the records buffered are printed
// (measured, not asserted).
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sqlite3.h>
#include <sys/mount.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "harness.h"
#include "stored_data.h"
#include "trainwatch/client.h"
#include "eventually.h"

namespace trainwatch::testing {
namespace {

using ::trainwatch::testing::Eventually;

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point from) {
  return std::chrono::duration<double>(Clock::now() - from).count();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

double Metric(const ServerProcess& server, const std::string& series) {
  return MetricValue(HttpGet(server.metrics_url()), series);
}

// A training loop: records one step every 500 us (about 2,000 steps/s) on a
// thread of its own until stopped, as a trainer does whatever the server does.
class Trainer {
 public:
  Trainer(const std::string& address, const std::string& run) {
    ClientOptions options;
    options.address = address;
    options.run_id = run;
    options.max_norm = 1.0;
    options.initial_backoff = std::chrono::milliseconds(20);
    options.max_backoff = std::chrono::milliseconds(200);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
    thread_ = std::thread([this] {
      for (uint64_t step = 0; !stop_; ++step) {
        client_->Record({.step = step, .grad_norm = 0.5 + 1e-4 * (step % 100)});
        recorded_ = step + 1;
        std::this_thread::sleep_for(std::chrono::microseconds(500));
      }
    });
  }
  ~Trainer() { Stop(); }

  // Stops recording; returns how many steps were recorded (0..n-1).
  uint64_t Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return recorded_;
  }
  Client& client() { return *client_; }
  uint64_t acked() const { return client_->Stats().acked; }
  uint64_t recorded() const { return recorded_; }

 private:
  std::unique_ptr<Client> client_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> recorded_{0};
  std::thread thread_;
};

// Another connection holding the database's write lock (BEGIN EXCLUSIVE), as
// a backup tool or an operator's sqlite3 shell would.
class DbLock {
 public:
  explicit DbLock(const std::string& path) {
    EXPECT_EQ(sqlite3_open(path.c_str(), &db_), SQLITE_OK);
    sqlite3_busy_timeout(db_, 60000);  // the server commits often: wait a turn
    char* err = nullptr;
    EXPECT_EQ(sqlite3_exec(db_, "BEGIN EXCLUSIVE", nullptr, nullptr, &err), SQLITE_OK)
        << (err != nullptr ? err : "");
    sqlite3_free(err);
  }
  ~DbLock() { Release(); }
  void Release() {
    if (db_ == nullptr) return;
    EXPECT_EQ(sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db_);
    db_ = nullptr;
  }

 private:
  sqlite3* db_ = nullptr;
};

// Reads the database file as an operator would with sqlite3: the records of
// `run`, and whether they are steps 0..n-1 each exactly once.
struct Stored {
  int64_t records = -1, min_step = -1, max_step = -1, overlapping_chunks = -1;
  std::string integrity;
};
Stored ReadStored(const std::string& db_path, const std::string& run) {
  Stored out;
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* s = nullptr;
  sqlite3_prepare_v2(db,
                     "SELECT SUM(c.n), MIN(c.first_step), MAX(c.last_step) FROM "
                     "step_chunks c JOIN runs r USING (run_key) WHERE r.run_id = ?1",
                     -1, &s, nullptr);
  sqlite3_bind_text(s, 1, run.c_str(), -1, SQLITE_TRANSIENT);
  if (sqlite3_step(s) == SQLITE_ROW) {
    out.records = sqlite3_column_int64(s, 0);
    out.min_step = sqlite3_column_int64(s, 1);
    out.max_step = sqlite3_column_int64(s, 2);
  }
  sqlite3_finalize(s);
  out.overlapping_chunks = CountOverlappingChunks(db_path);
  sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &s, nullptr);
  if (sqlite3_step(s) == SQLITE_ROW) {
    out.integrity = reinterpret_cast<const char*>(sqlite3_column_text(s, 0));
  }
  sqlite3_finalize(s);
  sqlite3_close(db);
  return out;
}

// Steps 0..n-1 stored, each exactly once (non-overlapping chunks covering
// 0..n-1 with n records in all).
void ExpectEachStepOnce(const std::string& db_path, const std::string& run, uint64_t n) {
  Stored stored = ReadStored(db_path, run);
  EXPECT_EQ(stored.records, static_cast<int64_t>(n));
  EXPECT_EQ(stored.min_step, 0);
  EXPECT_EQ(stored.max_step, static_cast<int64_t>(n) - 1);
  EXPECT_EQ(stored.overlapping_chunks, 0);
  EXPECT_EQ(stored.integrity, "ok");
}

// While the store fails: the gauge is up, failed attempts keep counting, and
// the client's acked count does not move between two failed attempts while
// it keeps recording.
void ExpectStalled(const ServerProcess& server, Trainer& trainer) {
  ASSERT_TRUE(Eventually([&] { return Metric(server, "trainwatch_store_failing") == 1; }))
      << "trainwatch_store_failing never became 1; see " << server.log_path();
  double errors = Metric(server, "trainwatch_store_errors_total");
  EXPECT_GE(errors, 1);
  // Anything committed before the fault was acked long ago (the first failed
  // attempt alone takes the busy timeout): from here on acked must stand still.
  uint64_t acked = trainer.acked(), recorded = trainer.recorded();
  ASSERT_TRUE(Eventually([&] {
    return Metric(server, "trainwatch_store_errors_total") >= errors + 1;
  })) << "no further failed attempt";
  EXPECT_EQ(trainer.acked(), acked) << "acks while the store cannot write";
  EXPECT_GT(trainer.recorded(), recorded) << "the trainer should keep recording";
  EXPECT_EQ(Metric(server, "trainwatch_store_failing"), 1);
}

// Holds the fault until the trainer has this many records not acknowledged,
// so recovery is measured with a backlog.
constexpr uint64_t kBacklog = 10000;

// The server's store lines, for the test output.
void PrintStoreLog(const ServerProcess& server) {
  std::istringstream log(ReadFile(server.log_path()));
  for (std::string line; std::getline(log, line);) {
    if (line.find(": store ") != std::string::npos) std::printf("  log| %s\n", line.c_str());
  }
}

TEST(StoreFaultIntegration, LockedDatabaseStopsAcksSaysSoAndRecoversExactlyOnce) {
  TempDir dir;
  const std::string db = dir.File("tw.db");
  ServerProcess server(db);
  Trainer trainer(server.grpc_address(), "locked");
  ASSERT_TRUE(Eventually([&] { return trainer.acked() >= 2000; }));
  EXPECT_EQ(Metric(server, "trainwatch_store_failing"), 0);

  auto lock = std::make_unique<DbLock>(db);
  ASSERT_NO_FATAL_FAILURE(ExpectStalled(server, trainer));
  std::string log = ReadFile(server.log_path());
  EXPECT_THAT(log, HasSubstr("store failing: cannot write to " + db));
  EXPECT_THAT(log, HasSubstr("database is locked"));
  ASSERT_TRUE(Eventually([&] { return trainer.recorded() - trainer.acked() >= kBacklog; }));

  Clock::time_point released = Clock::now();
  uint64_t buffered = trainer.recorded() - trainer.acked();
  uint64_t recorded_at_release = trainer.recorded();
  lock.reset();
  ASSERT_TRUE(Eventually([&] { return Metric(server, "trainwatch_store_failing") == 0; }));
  double gauge_cleared = Seconds(released);
  ASSERT_TRUE(Eventually([&] { return trainer.acked() >= recorded_at_release; }));
  double caught_up = Seconds(released);
  std::printf("locked: %llu records buffered at release; store_failing 0 after "
              "%.2f s; acks caught up with them after %.2f s\n",
              static_cast<unsigned long long>(buffered), gauge_cleared, caught_up);

  uint64_t n = trainer.Stop();
  absl::Status flushed = trainer.client().Flush(std::chrono::seconds(60));
  ASSERT_TRUE(flushed.ok()) << flushed;
  ClientStats stats = trainer.client().Stats();
  EXPECT_EQ(stats.acked, n);
  EXPECT_EQ(stats.dropped, 0u);
  EXPECT_THAT(ReadFile(server.log_path()), HasSubstr("store recovered after"));
  PrintStoreLog(server);
  ExpectEachStepOnce(db, "locked", n);
  EXPECT_EQ(Metric(server, "trainwatch_steps_total{run=\"locked\"}"), static_cast<double>(n));
}

TEST(StoreFaultIntegration, SigtermWhileLockedExitsAndTheClientResendsToTheNextServer) {
  TempDir dir;
  const std::string db = dir.File("tw.db");
  auto server = std::make_unique<ServerProcess>(db);
  const int port = server->grpc_port();
  Trainer trainer(server->grpc_address(), "sigterm");
  ASSERT_TRUE(Eventually([&] { return trainer.acked() >= 2000; }));

  auto lock = std::make_unique<DbLock>(db);
  ASSERT_TRUE(Eventually([&] { return Metric(*server, "trainwatch_store_failing") == 1; }));
  // The store never recovers while it stops: the server still exits (the
  // store gives up after its close timeout and fails what waits, unacked).
  Clock::time_point t0 = Clock::now();
  EXPECT_EQ(server->Terminate(), 0) << "see " << server->log_path();
  std::printf("sigterm: the server exited %.1f s after SIGTERM with the database locked\n",
              Seconds(t0));
  EXPECT_THAT(ReadFile(server->log_path()), HasSubstr("store still failing at shutdown"));
  PrintStoreLog(*server);
  lock.reset();

  server = std::make_unique<ServerProcess>(db, port);
  uint64_t n = trainer.Stop();
  absl::Status flushed = trainer.client().Flush(std::chrono::seconds(60));
  ASSERT_TRUE(flushed.ok()) << flushed;
  EXPECT_EQ(trainer.client().Stats().dropped, 0u);
  EXPECT_EQ(trainer.client().Stats().acked, n);
  ExpectEachStepOnce(db, "sigterm", n);
}

// Mounts a small tmpfs in a mount namespace of this process's own, so nothing
// outlives the test. Fails the test loudly where mounting is not allowed.
class SmallTmpfs {
 public:
  SmallTmpfs(const std::string& path, const std::string& size) : path_(path) {
    std::filesystem::create_directories(path);
    if (unshare(CLONE_NEWNS) != 0 ||
        mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        mount("tmpfs", path.c_str(), "tmpfs", 0, ("size=" + size).c_str()) != 0) {
      ADD_FAILURE() << "cannot mount a " << size << " tmpfs on " << path << ": "
                    << std::strerror(errno)
                    << ". This test fills a real filesystem: run it as root with "
                       "CAP_SYS_ADMIN (e.g. docker run --cap-add SYS_ADMIN); the "
                       "injected disk-full fault is covered by store_fault_test.";
      return;
    }
    mounted_ = true;
  }
  ~SmallTmpfs() {
    if (mounted_) umount2(path_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }

 private:
  std::string path_;
  bool mounted_ = false;
};

// Writes zeros to `path` until the filesystem is full; returns bytes written.
int64_t FillUp(const std::string& path) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return -1;
  static const std::string chunk(64 * 1024, '\0');
  int64_t total = 0;
  for (size_t n = chunk.size(); n > 0;) {
    ssize_t w = write(fd, chunk.data(), n);
    if (w > 0) {
      total += w;
    } else if (errno == ENOSPC) {
      n /= 2;  // fill the last pages too
    } else {
      break;
    }
  }
  close(fd);
  return total;
}

TEST(StoreFaultIntegration, DiskFullOnASmallTmpfsStopsAcksAndRecoversWhenSpaceIsFreed) {
  TempDir dir;
  SmallTmpfs fs(dir.File("fs"), "16m");
  ASSERT_TRUE(fs.mounted());
  // The database lives on the tmpfs; the harness puts the server log next to
  // the path it is given, so give it a symlink (SQLite follows it and keeps
  // its -wal and -shm files beside the real file): the log stays writable.
  const std::string db = dir.File("tw.db");
  std::filesystem::create_symlink(dir.File("fs/tw.db"), db);
  ServerProcess server(db);
  Trainer trainer(server.grpc_address(), "full");
  ASSERT_TRUE(Eventually([&] { return trainer.acked() >= 2000; }));

  int64_t filled = FillUp(dir.File("fs/filler"));
  ASSERT_GT(filled, 0);
  ASSERT_NO_FATAL_FAILURE(ExpectStalled(server, trainer));
  EXPECT_THAT(ReadFile(server.log_path()), HasSubstr("store failing: cannot write to " + db));
  EXPECT_THAT(ReadFile(server.log_path()), HasSubstr("disk is full"));
  ASSERT_TRUE(Eventually([&] { return trainer.recorded() - trainer.acked() >= kBacklog; }));

  Clock::time_point freed = Clock::now();
  uint64_t buffered = trainer.recorded() - trainer.acked();
  uint64_t recorded_at_free = trainer.recorded();
  ASSERT_EQ(unlink(dir.File("fs/filler").c_str()), 0);
  ASSERT_TRUE(Eventually([&] { return Metric(server, "trainwatch_store_failing") == 0; }));
  double gauge_cleared = Seconds(freed);
  ASSERT_TRUE(Eventually([&] { return trainer.acked() >= recorded_at_free; }));
  double caught_up = Seconds(freed);
  std::printf("disk full: filled %.1f MiB; %llu records buffered when space was "
              "freed; store_failing 0 after %.2f s; acks caught up after %.2f s\n",
              static_cast<double>(filled) / (1 << 20),
              static_cast<unsigned long long>(buffered), gauge_cleared, caught_up);

  uint64_t n = trainer.Stop();
  absl::Status flushed = trainer.client().Flush(std::chrono::seconds(60));
  ASSERT_TRUE(flushed.ok()) << flushed;
  EXPECT_EQ(trainer.client().Stats().dropped, 0u);
  EXPECT_THAT(ReadFile(server.log_path()), HasSubstr("store recovered after"));
  PrintStoreLog(server);
  ExpectEachStepOnce(db, "full", n);
}

}  // namespace
}  // namespace trainwatch::testing
