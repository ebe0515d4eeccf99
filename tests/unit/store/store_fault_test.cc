// Store behaviour on storage faults: a transaction that fails with a transient
// error is retried until it commits (nothing acked meanwhile, every record
// stored once), other errors fail at once, and Close() during a persistent
// fault is bounded.
//
// Faults come from a SQLite VFS over the default one whose writes fail, as
// a full disk would (StoreOptions::vfs is the seam), and from a lock held by a
// second connection.
#include <sqlite3.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <mutex>
#include <thread>

#include "gtest/gtest.h"
#include "common/clock.h"
#include "store/sqlite.h"
#include "store/store.h"
#include "test_records.h"
#include "eventually.h"

namespace trainwatch {
namespace {

using ::trainwatch::testing::Eventually;

using std::chrono::milliseconds;
using testing::Start;
using testing::Steps;

// ---- A VFS whose writes fail on demand ------------------------------------

// While FaultVfs::rc is set, every xWrite and xTruncate fails with it (what
// the unix VFS returns when the disk is full is SQLITE_FULL). Reads, locks and
// shared memory pass through.
struct FaultVfs {
  static constexpr const char* kName = "trainwatch-fault";
  static std::atomic<int> rc;
  static std::atomic<int> failed_writes;
  static sqlite3_vfs* base;

  // Registers the VFS once (not as the default).
  static void Register();
};
std::atomic<int> FaultVfs::rc{0};
std::atomic<int> FaultVfs::failed_writes{0};
sqlite3_vfs* FaultVfs::base = nullptr;

struct FaultFile {
  sqlite3_file file;    // must be first: SQLite sees this
  sqlite3_file* real;   // the base VFS's file, allocated right after
};

sqlite3_file* Real(sqlite3_file* f) { return reinterpret_cast<FaultFile*>(f)->real; }

int Injected() {
  int rc = FaultVfs::rc.load();
  if (rc != 0) ++FaultVfs::failed_writes;
  return rc;
}

const sqlite3_io_methods kFaultIo = {
    3,
    /*xClose=*/[](sqlite3_file* f) { return Real(f)->pMethods->xClose(Real(f)); },
    /*xRead=*/
    [](sqlite3_file* f, void* buf, int n, sqlite3_int64 off) {
      return Real(f)->pMethods->xRead(Real(f), buf, n, off);
    },
    /*xWrite=*/
    [](sqlite3_file* f, const void* buf, int n, sqlite3_int64 off) {
      if (int rc = Injected(); rc != 0) return rc;
      return Real(f)->pMethods->xWrite(Real(f), buf, n, off);
    },
    /*xTruncate=*/
    [](sqlite3_file* f, sqlite3_int64 size) {
      if (int rc = Injected(); rc != 0) return rc;
      return Real(f)->pMethods->xTruncate(Real(f), size);
    },
    /*xSync=*/
    [](sqlite3_file* f, int flags) { return Real(f)->pMethods->xSync(Real(f), flags); },
    /*xFileSize=*/
    [](sqlite3_file* f, sqlite3_int64* size) {
      return Real(f)->pMethods->xFileSize(Real(f), size);
    },
    /*xLock=*/[](sqlite3_file* f, int l) { return Real(f)->pMethods->xLock(Real(f), l); },
    /*xUnlock=*/[](sqlite3_file* f, int l) { return Real(f)->pMethods->xUnlock(Real(f), l); },
    /*xCheckReservedLock=*/
    [](sqlite3_file* f, int* out) {
      return Real(f)->pMethods->xCheckReservedLock(Real(f), out);
    },
    /*xFileControl=*/
    [](sqlite3_file* f, int op, void* arg) {
      return Real(f)->pMethods->xFileControl(Real(f), op, arg);
    },
    /*xSectorSize=*/[](sqlite3_file* f) { return Real(f)->pMethods->xSectorSize(Real(f)); },
    /*xDeviceCharacteristics=*/
    [](sqlite3_file* f) { return Real(f)->pMethods->xDeviceCharacteristics(Real(f)); },
    /*xShmMap=*/
    [](sqlite3_file* f, int page, int size, int extend, void volatile** out) {
      return Real(f)->pMethods->xShmMap(Real(f), page, size, extend, out);
    },
    /*xShmLock=*/
    [](sqlite3_file* f, int offset, int n, int flags) {
      return Real(f)->pMethods->xShmLock(Real(f), offset, n, flags);
    },
    /*xShmBarrier=*/[](sqlite3_file* f) { Real(f)->pMethods->xShmBarrier(Real(f)); },
    /*xShmUnmap=*/
    [](sqlite3_file* f, int del) { return Real(f)->pMethods->xShmUnmap(Real(f), del); },
    /*xFetch=*/
    [](sqlite3_file* f, sqlite3_int64 off, int n, void** out) {
      return Real(f)->pMethods->xFetch(Real(f), off, n, out);
    },
    /*xUnfetch=*/
    [](sqlite3_file* f, sqlite3_int64 off, void* p) {
      return Real(f)->pMethods->xUnfetch(Real(f), off, p);
    },
};

void FaultVfs::Register() {
  static std::once_flag once;
  std::call_once(once, [] {
    static sqlite3_vfs vfs;
    base = sqlite3_vfs_find(nullptr);
    vfs.iVersion = 2;
    vfs.szOsFile = static_cast<int>(sizeof(FaultFile)) + base->szOsFile;
    vfs.mxPathname = base->mxPathname;
    vfs.zName = kName;
    vfs.xOpen = [](sqlite3_vfs*, sqlite3_filename name, sqlite3_file* file,
                   int flags, int* out_flags) {
      FaultFile* f = reinterpret_cast<FaultFile*>(file);
      f->real = reinterpret_cast<sqlite3_file*>(f + 1);
      int rc = base->xOpen(base, name, f->real, flags, out_flags);
      f->file.pMethods = f->real->pMethods != nullptr ? &kFaultIo : nullptr;
      return rc;
    };
    vfs.xDelete = [](sqlite3_vfs*, const char* name, int sync) {
      return base->xDelete(base, name, sync);
    };
    vfs.xAccess = [](sqlite3_vfs*, const char* name, int flags, int* out) {
      return base->xAccess(base, name, flags, out);
    };
    vfs.xFullPathname = [](sqlite3_vfs*, const char* name, int n, char* out) {
      return base->xFullPathname(base, name, n, out);
    };
    vfs.xDlOpen = [](sqlite3_vfs*, const char* name) { return base->xDlOpen(base, name); };
    vfs.xDlError = [](sqlite3_vfs*, int n, char* out) { base->xDlError(base, n, out); };
    vfs.xDlSym = [](sqlite3_vfs*, void* h, const char* sym) {
      return base->xDlSym(base, h, sym);
    };
    vfs.xDlClose = [](sqlite3_vfs*, void* h) { base->xDlClose(base, h); };
    vfs.xRandomness = [](sqlite3_vfs*, int n, char* out) {
      return base->xRandomness(base, n, out);
    };
    vfs.xSleep = [](sqlite3_vfs*, int us) { return base->xSleep(base, us); };
    vfs.xCurrentTime = [](sqlite3_vfs*, double* t) { return base->xCurrentTime(base, t); };
    vfs.xGetLastError = [](sqlite3_vfs*, int n, char* out) {
      return base->xGetLastError(base, n, out);
    };
    vfs.xCurrentTimeInt64 = [](sqlite3_vfs*, sqlite3_int64* t) {
      return base->xCurrentTimeInt64(base, t);
    };
    ASSERT_EQ(sqlite3_vfs_register(&vfs, /*makeDflt=*/0), SQLITE_OK);
  });
}

// ---- Helpers ---------------------------------------------------------------

WriteOp StartOp(const v1::RunStart& s) {
  return {.key = {s.run_id(), s.rank(), s.attempt()},
          .body = WriteOp::Start{s},
          .received_unix_nanos = 1000};
}
WriteOp BatchOp(const StreamKey& key, uint64_t from, uint64_t to) {
  return {.key = key,
          .body = WriteOp::Batch{Steps(from, to)},
          .received_unix_nanos = 2000};
}

// Submits an op; the future holds its result once its transaction ended.
std::future<WriteResult> Submit(Store& store, WriteOp op) {
  auto p = std::make_shared<std::promise<WriteResult>>();
  std::future<WriteResult> f = p->get_future();
  op.done = [p](WriteResult r) { p->set_value(std::move(r)); };
  store.Submit(std::move(op));
  return f;
}

bool Ready(const std::future<WriteResult>& f) {
  return f.wait_for(milliseconds(0)) == std::future_status::ready;
}

// Every StoreFault the store reported, in order.
class FaultLog {
 public:
  std::function<void(const StoreFault&)> Callback() {
    return [this](const StoreFault& f) {
      std::lock_guard<std::mutex> lock(mu_);
      faults_.push_back(f);
    };
  }
  std::vector<StoreFault> Get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return faults_;
  }
  size_t size() const { return Get().size(); }

 private:
  mutable std::mutex mu_;
  std::vector<StoreFault> faults_;
};

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tw-fault-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Steps stored for (run, rank), in order.
std::vector<uint64_t> StoredSteps(const Store& store, const std::string& run,
                                  uint32_t rank) {
  std::vector<uint64_t> steps;
  absl::Status s = store.ReadSteps(run, 0, 0, rank, 1000, [&](v1::StepRecords& c) {
    for (const auto& item : c.items()) steps.push_back(item.record().step());
    return true;
  });
  EXPECT_TRUE(s.ok()) << s;
  return steps;
}

std::vector<uint64_t> Range(uint64_t from, uint64_t to) {
  std::vector<uint64_t> v;
  for (uint64_t i = from; i < to; ++i) v.push_back(i);
  return v;
}

std::string IntegrityCheck(const std::string& path) {
  sqlite3* db = nullptr;
  sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
  sqlite3_stmt* s = nullptr;
  sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &s, nullptr);
  std::string out = sqlite3_step(s) == SQLITE_ROW
                        ? reinterpret_cast<const char*>(sqlite3_column_text(s, 0))
                        : sqlite3_errmsg(db);
  sqlite3_finalize(s);
  sqlite3_close(db);
  return out;
}

class StoreFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FaultVfs::Register();
    FaultVfs::rc = 0;
    FaultVfs::failed_writes = 0;
  }
  void TearDown() override { FaultVfs::rc = 0; }

  StoreOptions Options() {
    return {.path = dir_.File("tw.db"),
            .on_fault = faults_.Callback(),
            .retry_initial_backoff = milliseconds(1),
            .retry_max_backoff = milliseconds(20),
            .vfs = FaultVfs::kName};
  }
  std::unique_ptr<Store> Open(StoreOptions options) {
    absl::StatusOr<std::unique_ptr<Store>> s = Store::Open(std::move(options));
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  TempDir dir_;
  FaultLog faults_;
};

// ---- Tests -----------------------------------------------------------------

class StoreWriteFaultTest : public StoreFaultTest,
                            public ::testing::WithParamInterface<int> {};

TEST_P(StoreWriteFaultTest, WritesStallUnackedThenEveryRecordCommitsOnce) {
  std::unique_ptr<Store> store = Open(Options());
  ASSERT_NE(store, nullptr);
  const StreamKey a{"run-a", 0, 0}, b{"run-a", 1, 0};
  ASSERT_TRUE(Submit(*store, StartOp(Start("run-a"))).get().status.ok());
  ASSERT_TRUE(Submit(*store, BatchOp(a, 0, 100)).get().status.ok());

  FaultVfs::rc = GetParam();
  std::vector<std::future<WriteResult>> waiting;
  waiting.push_back(Submit(*store, BatchOp(a, 100, 200)));
  waiting.push_back(Submit(*store, StartOp(Start("run-a", 1))));  // a new stream
  waiting.push_back(Submit(*store, BatchOp(b, 0, 50)));
  waiting.push_back(Submit(*store, BatchOp(a, 150, 250)));  // a resend, half new
  // Several attempts fail, and nothing is answered meanwhile.
  ASSERT_TRUE(Eventually([&] {
    std::vector<StoreFault> f = faults_.Get();
    return !f.empty() && f.back().failed_attempts >= 5;
  }));
  EXPECT_GT(FaultVfs::failed_writes.load(), 0);
  for (const auto& f : waiting) EXPECT_FALSE(Ready(f));
  std::vector<StoreFault> reported = faults_.Get();
  EXPECT_EQ(reported.front().phase, StoreFault::Phase::kStarted);
  EXPECT_TRUE(reported.front().log);
  EXPECT_EQ(reported.front().path, dir_.File("tw.db"));
  EXPECT_EQ(sqlite::ResultCode(reported.front().error) & 0xff, GetParam() & 0xff)
      << reported.front().error;
  EXPECT_EQ(reported.back().phase, StoreFault::Phase::kRetrying);
  EXPECT_EQ(reported.back().waiting_ops, 4u);
  EXPECT_EQ(reported.back().waiting_records, 250u);
  // Readers still see what was committed before.
  EXPECT_EQ(StoredSteps(*store, "run-a", 0), Range(0, 100));

  // The fault clears: every op commits, each record once.
  FaultVfs::rc = 0;
  std::vector<WriteResult> results;
  for (auto& f : waiting) results.push_back(f.get());
  for (const WriteResult& r : results) EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(results[0].stored, 100u);
  EXPECT_EQ(results[2].stored, 50u);
  EXPECT_EQ(results[3].stored, 50u);  // 200..249, read back below
  reported = faults_.Get();
  EXPECT_EQ(reported.back().phase, StoreFault::Phase::kCleared);
  EXPECT_TRUE(reported.back().log);
  EXPECT_EQ(reported.back().waiting_records, 250u);
  EXPECT_GE(reported.back().failed_attempts, 5);
  EXPECT_EQ(StoredSteps(*store, "run-a", 0), Range(0, 250));
  EXPECT_EQ(StoredSteps(*store, "run-a", 1), Range(0, 50));

  // The exactly-once state on disk agrees: a resend after a restart is a
  // duplicate, and the file is sound.
  store->Close();
  store = Open({.path = dir_.File("tw.db")});
  ASSERT_NE(store, nullptr);
  WriteResult again = Submit(*store, BatchOp(a, 0, 250)).get();
  EXPECT_TRUE(again.status.ok());
  EXPECT_EQ(again.stored, 0u);
  store->Close();
  EXPECT_EQ(IntegrityCheck(dir_.File("tw.db")), "ok");
}

INSTANTIATE_TEST_SUITE_P(DiskFullAndIoError, StoreWriteFaultTest,
                         ::testing::Values(SQLITE_FULL, SQLITE_IOERR_WRITE),
                         [](const auto& info) {
                           return info.param == SQLITE_FULL ? std::string("DiskFull")
                                                            : std::string("IoError");
                         });

// A non-lead rank's open digests live in memory and in rank_tail rows: a
// transaction that fails after a group of them became a chunk is rolled
// back, the digests are read back from the file, and the retry stores each
// once.
TEST_F(StoreFaultTest, OpenDigestsRollBackWithTheirTransaction) {
  std::unique_ptr<Store> store = Open(Options());
  ASSERT_NE(store, nullptr);
  const StreamKey lead{"run-a", 0, 0}, other{"run-a", 1, 0};
  ASSERT_TRUE(Submit(*store, StartOp(Start("run-a"))).get().status.ok());
  ASSERT_TRUE(Submit(*store, StartOp(Start("run-a", 1))).get().status.ok());
  ASSERT_TRUE(Submit(*store, BatchOp(lead, 0, 100)).get().status.ok());
  for (uint64_t step = 0; step < 100; ++step) {  // 100 open digests
    ASSERT_TRUE(Submit(*store, BatchOp(other, step, step + 1)).get().status.ok());
  }
  FaultVfs::rc = SQLITE_FULL;
  std::vector<std::future<WriteResult>> waiting;
  for (uint64_t step = 100; step < 200; ++step) {  // the 128th makes a chunk
    waiting.push_back(Submit(*store, BatchOp(other, step, step + 1)));
  }
  ASSERT_TRUE(Eventually([&] {
    std::vector<StoreFault> f = faults_.Get();
    return !f.empty() && f.back().failed_attempts >= 3;
  }));
  EXPECT_EQ(StoredSteps(*store, "run-a", 1), Range(0, 100));
  FaultVfs::rc = 0;
  for (auto& f : waiting) EXPECT_EQ(f.get().stored, 1u);
  EXPECT_EQ(StoredSteps(*store, "run-a", 1), Range(0, 200));
  store->Close();
  store = Open({.path = dir_.File("tw.db")});
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(StoredSteps(*store, "run-a", 1), Range(0, 200));
  store->Close();
  EXPECT_EQ(IntegrityCheck(dir_.File("tw.db")), "ok");
}

// The retries' backoff, the fault's log interval and Close()'s bounded wait
// are measured and waited on the injected clock: hour-long settings run in
// fake hours, and a fault's figures are exact.
TEST_F(StoreFaultTest, RetriesLogAndCloseTimeoutRunOnTheInjectedClock) {
  using std::chrono::hours;
  FakeClock clock;
  StoreOptions options = Options();
  options.clock = &clock;
  options.retry_initial_backoff = hours(1);
  options.retry_max_backoff = hours(1);
  options.fault_log_interval = hours(2);
  options.close_timeout = hours(3);
  std::unique_ptr<Store> store = Open(options);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(Submit(*store, StartOp(Start("run-a"))).get().status.ok());
  FaultVfs::rc = SQLITE_FULL;
  std::future<WriteResult> batch = Submit(*store, BatchOp({"run-a", 0, 0}, 0, 10));
  // One attempt an hour: each fake hour, one more.
  ASSERT_TRUE(Eventually([&] { return faults_.size() == 1; }));
  for (size_t attempts = 2; attempts <= 3; ++attempts) {
    clock.Advance(hours(1));
    ASSERT_TRUE(Eventually([&] { return faults_.size() == attempts; })) << attempts;
  }
  std::vector<StoreFault> f = faults_.Get();
  EXPECT_EQ(f[0].phase, StoreFault::Phase::kStarted);
  EXPECT_TRUE(f[0].log);
  EXPECT_EQ(f[1].phase, StoreFault::Phase::kRetrying);
  EXPECT_EQ(f[1].seconds, 3600.0);
  EXPECT_FALSE(f[1].log) << "an hour since the last line, the interval is two";
  EXPECT_EQ(f[2].seconds, 7200.0);
  EXPECT_TRUE(f[2].log);
  EXPECT_FALSE(Ready(batch));

  // Close at fake hour 2 wakes the wait (one more attempt), then gives up
  // 3 fake hours later, at hour 5.
  std::future<void> closed = std::async(std::launch::async, [&] { store->Close(); });
  ASSERT_TRUE(Eventually([&] { return faults_.size() == 4; }));
  for (size_t attempts = 5; attempts <= 7; ++attempts) {
    clock.Advance(hours(1));
    ASSERT_TRUE(Eventually([&] { return faults_.size() == attempts; })) << attempts;
  }
  closed.get();
  f = faults_.Get();
  EXPECT_EQ(f.back().phase, StoreFault::Phase::kGaveUp);
  EXPECT_EQ(f.back().seconds, 5 * 3600.0);
  EXPECT_TRUE(absl::IsUnavailable(batch.get().status));
}

TEST_F(StoreFaultTest, LockedDatabaseIsRetriedUntilTheLockIsReleased) {
  StoreOptions options = Options();
  options.vfs = "";
  options.busy_timeout = milliseconds(10);
  std::unique_ptr<Store> store = Open(options);
  ASSERT_NE(store, nullptr);
  const StreamKey a{"run-a", 0, 0};
  ASSERT_TRUE(Submit(*store, StartOp(Start("run-a"))).get().status.ok());

  // Another process-like connection takes the write lock.
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(dir_.File("tw.db").c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr), SQLITE_OK);
  std::future<WriteResult> batch = Submit(*store, BatchOp(a, 0, 100));
  ASSERT_TRUE(Eventually([&] { return faults_.size() >= 3; }));
  EXPECT_FALSE(Ready(batch));
  EXPECT_EQ(sqlite::ResultCode(faults_.Get().front().error) & 0xff, SQLITE_BUSY);

  ASSERT_EQ(sqlite3_exec(other, "COMMIT", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(other);
  WriteResult r = batch.get();
  EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.stored, 100u);
  EXPECT_EQ(faults_.Get().back().phase, StoreFault::Phase::kCleared);
  EXPECT_EQ(StoredSteps(*store, "run-a", 0), Range(0, 100));
}

TEST_F(StoreFaultTest, CloseDuringAPersistentFaultFailsWhatWaitsWithUnavailable) {
  StoreOptions options = Options();
  options.close_timeout = milliseconds(100);
  std::unique_ptr<Store> store = Open(options);
  ASSERT_NE(store, nullptr);
  const StreamKey a{"run-a", 0, 0};
  ASSERT_TRUE(Submit(*store, StartOp(Start("run-a"))).get().status.ok());
  ASSERT_TRUE(Submit(*store, BatchOp(a, 0, 10)).get().status.ok());

  FaultVfs::rc = SQLITE_FULL;
  std::future<WriteResult> first = Submit(*store, BatchOp(a, 10, 20));
  ASSERT_TRUE(Eventually([&] { return faults_.size() >= 1; }));
  std::future<WriteResult> second = Submit(*store, BatchOp(a, 20, 30));  // queued
  store->Close();  // returns: bounded by close_timeout
  for (std::future<WriteResult>* f : {&first, &second}) {
    ASSERT_TRUE(Ready(*f));
    absl::Status s = f->get().status;
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_NE(s.message().find("not acknowledged"), std::string_view::npos) << s;
  }
  StoreFault last = faults_.Get().back();
  EXPECT_EQ(last.phase, StoreFault::Phase::kGaveUp);
  EXPECT_TRUE(last.log);
  EXPECT_EQ(last.waiting_ops, 2u);
  EXPECT_EQ(last.waiting_records, 20u);
  EXPECT_TRUE(absl::IsUnavailable(Submit(*store, BatchOp(a, 30, 40)).get().status));

  // Nothing of the failed ops is stored; their resend is, once.
  FaultVfs::rc = 0;
  store = Open({.path = dir_.File("tw.db")});
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(StoredSteps(*store, "run-a", 0), Range(0, 10));
  WriteResult resent = Submit(*store, BatchOp(a, 10, 30)).get();
  EXPECT_TRUE(resent.status.ok());
  EXPECT_EQ(resent.stored, 20u);
  EXPECT_EQ(StoredSteps(*store, "run-a", 0), Range(0, 30));
}

TEST_F(StoreFaultTest, ANonTransientErrorFailsTheOpsAtOnce) {
  StoreOptions options = Options();
  std::vector<absl::Status> errors;
  options.on_error = [&errors](const absl::Status& s) { errors.push_back(s); };
  std::unique_ptr<Store> store = Open(options);
  ASSERT_NE(store, nullptr);
  const StreamKey a{"run-a", 0, 0};
  ASSERT_TRUE(Submit(*store, StartOp(Start("run-a"))).get().status.ok());

  FaultVfs::rc = SQLITE_CORRUPT;
  WriteResult failed = Submit(*store, BatchOp(a, 0, 10)).get();
  EXPECT_FALSE(failed.status.ok());
  EXPECT_EQ(failed.stored, 0u);
  EXPECT_FALSE(sqlite::IsTransient(sqlite::ResultCode(failed.status))) << failed.status;
  EXPECT_EQ(faults_.size(), 0u);  // not retried
  EXPECT_EQ(errors.size(), 1u);

  // The store keeps serving, and the batch's resend is stored once.
  FaultVfs::rc = 0;
  WriteResult resent = Submit(*store, BatchOp(a, 0, 10)).get();
  EXPECT_TRUE(resent.status.ok()) << resent.status;
  EXPECT_EQ(resent.stored, 10u);
  EXPECT_EQ(StoredSteps(*store, "run-a", 0), Range(0, 10));
}

TEST(SqliteErrors, TransientCodesAreTheOnesThatClearByThemselves) {
  for (int rc : {SQLITE_FULL, SQLITE_IOERR, SQLITE_IOERR_WRITE, SQLITE_IOERR_FSYNC,
                 SQLITE_BUSY, SQLITE_BUSY_SNAPSHOT, SQLITE_LOCKED, SQLITE_CANTOPEN,
                 SQLITE_READONLY, SQLITE_NOMEM}) {
    EXPECT_TRUE(sqlite::IsTransient(rc)) << sqlite3_errstr(rc);
  }
  for (int rc : {SQLITE_CONSTRAINT, SQLITE_CONSTRAINT_PRIMARYKEY, SQLITE_CORRUPT,
                 SQLITE_NOTADB, SQLITE_MISUSE, SQLITE_ERROR, SQLITE_TOOBIG}) {
    EXPECT_FALSE(sqlite::IsTransient(rc)) << sqlite3_errstr(rc);
  }
  EXPECT_EQ(sqlite::ResultCode(sqlite::Error(nullptr, SQLITE_IOERR_WRITE, "x")),
            SQLITE_IOERR_WRITE);
  EXPECT_EQ(sqlite::ResultCode(absl::UnavailableError("not from SQLite")), 0);
  EXPECT_EQ(sqlite::ResultCode(absl::OkStatus()), 0);
}

}  // namespace
}  // namespace trainwatch
