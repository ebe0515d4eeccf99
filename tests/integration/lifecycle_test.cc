// The data lifecycle against the real server (docs/reliability.md#data-lifecycle):
// an online backup taken under a 16-stream load opens in a
// fresh server and holds every record acknowledged before it began;
// delete-run makes a run vanish from runs, steps and /metrics; a deleted
// run's space is reused (the file sizes are printed).
#include <grpcpp/grpcpp.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "harness.h"
#include "nlohmann/json.hpp"
#include "eventually.h"
#include "trainwatch/client.h"
#include "trainwatch/v1/trainwatch.grpc.pb.h"

namespace trainwatch::testing {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kStreams = 16;

CommandResult Ctl(const ServerProcess& server, std::vector<std::string> args) {
  args.insert(args.begin(), {BinDir() + "/trainwatchctl", "--server", server.grpc_address()});
  return RunCommand(args);
}

// Records stored per run, from `runs --json`.
std::map<std::string, uint64_t> StoredPerRun(const ServerProcess& server) {
  CommandResult r = Ctl(server, {"runs", "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::map<std::string, uint64_t> out;
  for (const auto& run : nlohmann::json::parse(r.out)) {
    out[run["run_id"].get<std::string>()] = run["steps"].get<uint64_t>();
  }
  return out;
}

std::string RunName(int i) { return "load-" + std::to_string(i); }

TEST(Lifecycle, ABackupUnderLoadOpensInAFreshServerWithEveryRecordAckedBeforeIt) {
  TempDir dir;
  ServerProcess server(dir.File("tw.db"));
  std::atomic<bool> stop{false};
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kStreams; ++i) {
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(
        {.address = server.grpc_address(), .run_id = RunName(i), .max_norm = 1.0});
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(std::move(*c));
  }
  std::vector<std::thread> trainers;
  for (int i = 0; i < kStreams; ++i) {
    trainers.emplace_back([&, i] {
      for (uint64_t step = 0; !stop.load(); ++step) {
        while (!clients[i]->Record({.step = step, .grad_norm = 0.5, .loss = 2.0})) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        if (step % 256 == 255) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    });
  }
  // Ingest under way on every stream (a few thousand steps acknowledged
  // each) before the backup begins.
  const bool under_way = Eventually([&] {
    for (const auto& c : clients) {
      if (c->Stats().acked < 2000) return false;
    }
    return true;
  });
  if (!under_way) {
    stop = true;
    for (std::thread& t : trainers) t.join();
    FAIL() << "ingest did not get under way on every stream";
  }
  // What was acknowledged before the backup began: each stream's steps are
  // acked in order, so its first `acked` steps are stored.
  std::vector<uint64_t> acked_before(kStreams);
  for (int i = 0; i < kStreams; ++i) acked_before[i] = clients[i]->Stats().acked;
  const std::string backup = dir.File("backup.db");
  CommandResult b = Ctl(server, {"backup", "--out", backup});
  ASSERT_EQ(b.exit_code, 0) << b.out << b.err;
  EXPECT_THAT(b.out, HasSubstr("a consistent copy"));
  // Ingest went on during the backup.
  std::vector<uint64_t> acked_after(kStreams);
  for (int i = 0; i < kStreams; ++i) acked_after[i] = clients[i]->Stats().acked;
  stop = true;
  for (std::thread& t : trainers) t.join();
  for (auto& c : clients) EXPECT_TRUE(c->Close().ok());
  uint64_t total_before = 0;
  for (uint64_t a : acked_before) total_before += a;
  ASSERT_GT(total_before, 1000u) << "no load to speak of";

  ServerProcess restored(backup);
  const std::map<std::string, uint64_t> stored = StoredPerRun(restored);
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(stored.contains(RunName(i))) << RunName(i);
    EXPECT_GE(stored.at(RunName(i)), acked_before[i]) << RunName(i);
  }
  // The copy is whole: its records read back in order, step 0 first.
  CommandResult steps = Ctl(restored, {"steps", "--run", RunName(0), "--to", "9", "--json"});
  ASSERT_EQ(steps.exit_code, 0) << steps.err;
  const auto first = nlohmann::json::parse(steps.out);
  ASSERT_EQ(first.size(), 10u);
  EXPECT_EQ(first[0]["step"], 0);
  std::printf("backup: %llu records acked before it began, %s bytes\n",
              static_cast<unsigned long long>(total_before),
              std::to_string(std::filesystem::file_size(backup)).c_str());
  // A backup never overwrites.
  CommandResult again = Ctl(server, {"backup", "--out", backup});
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_THAT(again.err, HasSubstr("exists"));
}

// `PRAGMA integrity_check` of a database file: "ok" when sound.
std::string IntegrityCheck(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    return "cannot open";
  }
  std::string result;
  sqlite3_exec(db, "PRAGMA integrity_check", [](void* out, int, char** values, char**) {
    *static_cast<std::string*>(out) += values[0] ? values[0] : "NULL";
    return 0;
  }, &result, nullptr);
  sqlite3_close(db);
  return result;
}

std::vector<std::string> StagingFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".trainwatch-backup-", 0) == 0) out.push_back(name);
  }
  return out;
}

std::string WriteLog(const TempDir& dir, const std::string& run, uint64_t steps);

// Sets an environment variable for its scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_.has_value()) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Two backups to one file at once: one writes a sound copy, the other fails
// cleanly (the partial file is created exclusively, the name taken with
// link(): never shared, never overwritten). The copy is the owner's alone
// (0600), and the server leaves no staging file behind.
TEST(Lifecycle, TwoBackupsToOneFileOneSucceedsTheOtherFailsCleanly) {
  TempDir dir;
  ServerProcess server(dir.File("tw.db"));
  ASSERT_EQ(Ctl(server, {"replay", WriteLog(dir, "big", 200000)}).exit_code, 0);
  const std::string out = dir.File("copy.db");
  for (int round = 0; round < 3; ++round) {
    std::filesystem::remove(out);
    CommandResult a, b;
    std::thread ta([&] { a = Ctl(server, {"backup", "--out", out}); });
    std::thread tb([&] { b = Ctl(server, {"backup", "--out", out}); });
    ta.join();
    tb.join();
    EXPECT_EQ((a.exit_code == 0) + (b.exit_code == 0), 1)
        << "a: " << a.exit_code << " " << a.err << "\nb: " << b.exit_code << " " << b.err;
    const CommandResult& failed = a.exit_code == 0 ? b : a;
    EXPECT_EQ(failed.exit_code, 1);
    EXPECT_THAT(failed.err, AnyOf(HasSubstr("another backup to"), HasSubstr("exists")));
    EXPECT_EQ(IntegrityCheck(out), "ok");
    EXPECT_EQ(std::filesystem::status(out).permissions() & std::filesystem::perms::all,
              std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
    EXPECT_FALSE(std::filesystem::exists(out + ".partial"));
  }
  EXPECT_THAT(StagingFiles(dir.path()), ::testing::IsEmpty());
}

// A .partial planted as a link is never followed: its target keeps its bytes.
TEST(Lifecycle, ABackupNeverFollowsALinkedPartialFile) {
  TempDir dir;
  ServerProcess server(dir.File("tw.db"));
  ASSERT_EQ(Ctl(server, {"replay", WriteLog(dir, "r", 100)}).exit_code, 0);
  const std::string victim = dir.File("precious.txt");
  { std::ofstream(victim) << "precious"; }
  std::filesystem::create_symlink(victim, dir.File("copy.db.partial"));
  CommandResult r = Ctl(server, {"backup", "--out", dir.File("copy.db")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("copy.db.partial exists"));
  std::ifstream in(victim);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "precious");
  EXPECT_FALSE(std::filesystem::exists(dir.File("copy.db")));
}

// The copy is staged in --backup-dir (the --db's directory by default), not
// the system's temp directory: a server with none (a read-only root
// filesystem) backs up; a staging file left by a killed server is removed
// at the next start; a --backup-dir that cannot be read stops the start.
TEST(Lifecycle, BackupsStageInTheBackupDirAndNeverInTmp) {
  TempDir dir;
  const std::string staging = dir.File("staging");
  std::filesystem::create_directory(staging);
  const std::string leftover = staging + "/.trainwatch-backup-4242-0";
  { std::ofstream(leftover) << "a copy a killed server left"; }
  {
    // The server starts (forks) with no temp directory; the test's own
    // commands need one, so TMPDIR is set back at once.
    std::optional<ServerProcess> server;
    {
      ScopedEnv no_tmp("TMPDIR", "/nonexistent-tmp");
      server.emplace(dir.File("tw.db"), 0, std::vector<std::string>{"--backup-dir", staging});
    }
    EXPECT_FALSE(std::filesystem::exists(leftover));
    ASSERT_EQ(Ctl(*server, {"replay", WriteLog(dir, "r", 1000)}).exit_code, 0);
    CommandResult b = Ctl(*server, {"backup", "--out", dir.File("copy.db")});
    EXPECT_EQ(b.exit_code, 0) << b.err;
    EXPECT_EQ(IntegrityCheck(dir.File("copy.db")), "ok");
    EXPECT_THAT(StagingFiles(staging), ::testing::IsEmpty());
  }
  CommandResult bad = RunCommand({BinDir() + "/trainwatch-server", "--db", dir.File("x.db"),
                                  "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                                  "--backup-dir", dir.File("no-such-dir")});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.err, HasSubstr("--backup-dir"));
  EXPECT_THAT(bad.err, HasSubstr("no-such-dir"));
}

// backup wants one server: each of a fleet's holds its own database.
TEST(Lifecycle, BackupWithAFleetListIsAUsageError) {
  CommandResult r = RunCommand({BinDir() + "/trainwatchctl", "--server", "127.0.0.1:1,127.0.0.1:2",
                                "backup", "--out", "/tmp/never-written.db"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("give one --server"));
}

// A JSONL step log of `steps` steps for `run`.
std::string WriteLog(const TempDir& dir, const std::string& run, uint64_t steps) {
  const std::string path = dir.File(run + ".jsonl");
  FILE* f = std::fopen(path.c_str(), "w");
  std::fprintf(f, "{\"run_start\": {\"run_id\": \"%s\", \"world_size\": 1, \"max_norm\": 1.0}}\n",
               run.c_str());
  for (uint64_t s = 0; s < steps; ++s) {
    std::fprintf(f, "{\"step\": %llu, \"grad_norm\": %.6f, \"loss\": %.6f, \"batch_ids\": [%llu]}\n",
                 static_cast<unsigned long long>(s), 0.5 + 0.001 * (s % 97),
                 2.0 + 0.0001 * (s % 113), static_cast<unsigned long long>(s));
  }
  std::fclose(f);
  return path;
}

TEST(Lifecycle, DeleteRunMakesTheRunVanishFromRunsStepsAndMetrics) {
  TempDir dir;
  ServerProcess server(dir.File("tw.db"));
  ASSERT_EQ(Ctl(server, {"replay", WriteLog(dir, "gone", 500)}).exit_code, 0);
  ASSERT_EQ(Ctl(server, {"replay", WriteLog(dir, "kept", 300)}).exit_code, 0);
  ASSERT_THAT(HttpGet(server.metrics_url()), HasSubstr("run=\"gone\""));

  CommandResult d = Ctl(server, {"delete-run", "gone"});
  ASSERT_EQ(d.exit_code, 0) << d.out << d.err;
  EXPECT_THAT(d.out, HasSubstr("deleted run gone: 500 step records"));
  const std::map<std::string, uint64_t> runs = StoredPerRun(server);
  EXPECT_FALSE(runs.contains("gone"));
  EXPECT_EQ(runs.at("kept"), 300u);
  CommandResult steps = Ctl(server, {"steps", "--run", "gone", "--json"});
  EXPECT_EQ(steps.exit_code, 1);
  EXPECT_THAT(steps.err, HasSubstr("NOT_FOUND"));
  const std::string metrics = HttpGet(server.metrics_url());
  EXPECT_THAT(metrics, Not(HasSubstr("run=\"gone\"")));
  EXPECT_THAT(metrics, HasSubstr("run=\"kept\""));

  CommandResult unknown = Ctl(server, {"delete-run", "never-was"});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_THAT(unknown.err, HasSubstr("NOT_FOUND"));
}

TEST(Lifecycle, ARunWithAnOpenStreamIsNotDeleted) {
  TempDir dir;
  ServerProcess server(dir.File("tw.db"));
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(
      {.address = server.grpc_address(), .run_id = "live", .max_norm = 1.0});
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Record({.step = 0, .grad_norm = 0.5}));
  ASSERT_TRUE((*c)->Flush(std::chrono::seconds(30)).ok());
  CommandResult d = Ctl(server, {"delete-run", "live"});
  EXPECT_EQ(d.exit_code, 1);
  EXPECT_THAT(d.err, HasSubstr("FAILED_PRECONDITION"));
  EXPECT_THAT(d.err, HasSubstr("open stream"));
  EXPECT_EQ(StoredPerRun(server).at("live"), 1u);
}

// A stream that has ended is not open: delete-run right after its trainer
// closes (while its health is polled, too) is never refused for it.
TEST(Lifecycle, DeleteRunRightAfterTheStreamClosesIsNotRefused) {
  TempDir dir;
  ServerProcess server(dir.File("tw.db"));
  auto stub = v1::TrainingHealth::NewStub(
      grpc::CreateChannel(server.grpc_address(), grpc::InsecureChannelCredentials()));
  std::atomic<bool> stop{false};
  std::atomic<int> polls{0};
  std::thread poller([&] {
    while (!stop.load()) {
      for (int i = 0; i < 40; ++i) {
        grpc::ClientContext ctx;
        v1::GetRunHealthRequest req;
        req.set_run_id("quick-" + std::to_string(i));
        v1::GetRunHealthResponse resp;
        stub->GetRunHealth(&ctx, req, &resp);
        ++polls;
      }
    }
  });
  int refused = 0;
  for (int i = 0; i < 40; ++i) {
    const std::string run = "quick-" + std::to_string(i);
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(
        {.address = server.grpc_address(), .run_id = run, .max_norm = 1.0});
    ASSERT_TRUE(c.ok()) << c.status();
    for (uint64_t step = 0; step < 300; ++step) {
      while (!(*c)->Record({.step = step, .grad_norm = 0.5, .loss = 2.0})) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    ASSERT_TRUE((*c)->Close().ok());
    grpc::ClientContext ctx;
    v1::DeleteRunRequest req;
    req.set_run_id(run);
    v1::DeleteRunResponse resp;
    grpc::Status st = stub->DeleteRun(&ctx, req, &resp);
    if (!st.ok()) {
      ++refused;
      ADD_FAILURE() << run << ": " << st.error_message();
    } else {
      EXPECT_EQ(resp.records(), 300u) << run;
    }
  }
  stop = true;
  poller.join();
  std::printf("delete-run right after close: %d of 40 refused, %d health polls meanwhile\n",
              refused, polls.load());
  EXPECT_TRUE(StoredPerRun(server).empty());
}

// Everything the server holds of a deleted run goes: the host incidents it
// raised leave /metrics and never count toward a later HostSuspect.
TEST(Lifecycle, ADeletedRunsHostIncidentsAreForgotten) {
  TempDir dir;
  ServerProcess server(dir.File("tw.db"));
  const auto nan_run = [&](const std::string& run) {
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(
        {.address = server.grpc_address(), .run_id = run, .max_norm = 1.0, .host = "lemon-1"});
    ASSERT_TRUE(c.ok()) << c.status();
    for (uint64_t step = 0; step < 200; ++step) {
      const double norm = step == 150 ? std::nan("") : 0.5;
      ASSERT_TRUE((*c)->Record({.step = step, .grad_norm = norm, .loss = 2.0}));
    }
    ASSERT_TRUE((*c)->Close().ok());
  };
  nan_run("doomed");
  const std::string series = "trainwatch_host_incidents_total{alertname=\"NonFiniteUpdate\",host=\"lemon-1\"}";
  ASSERT_TRUE(Eventually([&] { return HttpGet(server.metrics_url()).find(series) != std::string::npos; }))
      << HttpGet(server.metrics_url());
  CommandResult d = Ctl(server, {"delete-run", "doomed"});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_THAT(HttpGet(server.metrics_url()), Not(HasSubstr("host=\"lemon-1\"")));
  // Another run failing on the host is its first incident: no HostSuspect.
  nan_run("second");
  ASSERT_TRUE(Eventually([&] { return HttpGet(server.metrics_url()).find(series) != std::string::npos; }));
  CommandResult alerts = Ctl(server, {"alerts", "--json"});
  ASSERT_EQ(alerts.exit_code, 0) << alerts.err;
  EXPECT_THAT(alerts.out, HasSubstr("NonFiniteUpdate"));
  EXPECT_THAT(alerts.out, Not(HasSubstr("HostSuspect")));
  EXPECT_THAT(alerts.out, Not(HasSubstr("doomed")));
}

uint64_t FileBytes(const std::string& path) {
  return std::filesystem::exists(path) ? std::filesystem::file_size(path) : 0;
}

// A deleted run's pages are reused: a run of the same size ingested after
// it leaves the file about where it was, not twice that. (How many pages a
// run takes varies by +-15% from one ingest to the next: its chunks are
// cut by time as well as size.)
TEST(Lifecycle, ADeletedRunsSpaceIsReused) {
  TempDir dir;
  const std::string db = dir.File("tw.db");
  const std::string log_a = WriteLog(dir, "a", 60000);
  const std::string log_b = WriteLog(dir, "b", 60000);
  uint64_t with_a = 0, after_delete = 0, with_b = 0;
  {
    ServerProcess server(db);
    ASSERT_EQ(Ctl(server, {"replay", log_a}).exit_code, 0);
    ASSERT_EQ(server.Terminate(), 0);  // checkpoints the WAL into the file
    with_a = FileBytes(db);
  }
  {
    ServerProcess server(db);
    ASSERT_EQ(Ctl(server, {"delete-run", "a"}).exit_code, 0);
    ASSERT_EQ(server.Terminate(), 0);
    after_delete = FileBytes(db);
  }
  {
    ServerProcess server(db);
    ASSERT_EQ(Ctl(server, {"replay", log_b}).exit_code, 0);
    ASSERT_EQ(server.Terminate(), 0);
    with_b = FileBytes(db);
  }
  std::printf("file bytes: run a %llu, a deleted %llu, run b in its place %llu\n",
              static_cast<unsigned long long>(with_a),
              static_cast<unsigned long long>(after_delete),
              static_cast<unsigned long long>(with_b));
  EXPECT_LE(after_delete, with_a);
  EXPECT_LT(with_b, with_a + with_a / 2);
}

}  // namespace
}  // namespace trainwatch::testing
