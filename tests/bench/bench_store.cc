// Store commit throughput, and the reference it is judged against (docs/performance.md):
// a raw SQLite prepared-insert loop, one row per step, in the same
// binary so the ratio is measured under the same conditions.
//
//  - BM_StoreCommit/B: one batch of B records submitted, waited for (one
//    transaction per batch: the latency-bound case).
//  - BM_StoreCommitPipelined/B: 64 batches of B submitted, then all waited
//    for (the writer groups them into transactions, as under load).
//  Both at the store's page size and at SQLite's default 4 KiB (page:P).
//  - BM_ChunkEncode, BM_ChunkDecode: a chunk of 1,024 records, columnar
//    (format:1) against a serialized StepBatch (format:0); float32:1 the
//    records as trainwatch.torch sends them (the tensor values float32,
//    clip_coef clip_fields' float32 one).
//  - BM_MoeChunkEncode, BM_MoeChunkDecode: chunks of 100 records (and of 16
//    for the encoder, a stored batch as the perf runs send them), each with
//    (moe:1) or without (moe:0) a 48-layer x 128-expert MoE report of a
//    realistic run; bytes_per_count is what the counts add to the chunk.
//  - BM_RawSqliteRowPerStep: 1,024 rows a transaction, 14 columns, text run
//    id, WAL, synchronous=NORMAL, a prepared INSERT, a unique index on
//    (run, rank, attempt, step).
// All on a file database in a fresh temporary directory (WAL, synchronous
// NORMAL). records_per_s is the counter to compare.
//
//   build/bin/bench_store --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <sqlite3.h>
#include <stdlib.h>

#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "store/codec/step_codec.h"
#include "test_records.h"
#include "store/store.h"
#include "trainwatch/v1/clipping.h"

namespace {

using namespace trainwatch;  // NOLINT: a benchmark file

class TempDir {
 public:
  TempDir() {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "tw-bench-store-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) abort();
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::vector<v1::StepRecord> Records(size_t n) {
  std::mt19937_64 rng(3);
  std::lognormal_distribution<double> norm(std::log(0.5), 0.3);
  std::vector<v1::StepRecord> out(n);
  for (size_t i = 0; i < n; ++i) {
    v1::StepRecord& r = out[i];
    const double g = norm(rng);
    r.set_grad_norm(g);
    r.set_clipped(g > 1.0);
    r.set_clip_coef(std::min(1.0, 1.0 / (g + 1e-6)));
    r.set_loss_scale(65536.0);
    r.set_max_attn_logit(30.0 + g);
    r.set_log_z(2.0 + 0.01 * g);
    r.set_loss(2.5);
    r.set_lr(3e-4);
    r.set_time_unix_nanos(1'700'000'000'000'000'000 + static_cast<int64_t>(i));
  }
  return out;
}

// Counts finished ops; Wait() blocks until `n` have finished.
class Done {
 public:
  std::function<void(WriteResult)> Callback() {
    return [this](WriteResult r) {
      std::lock_guard lock(mu_);
      if (!r.status.ok()) ++failed_;
      ++done_;
      cv_.notify_all();
    };
  }
  void Wait(uint64_t n) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_ >= n; });
  }
  uint64_t failed() {
    std::lock_guard lock(mu_);
    return failed_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t done_ = 0;
  uint64_t failed_ = 0;
};

void StoreBench(benchmark::State& state, size_t inflight) {
  const size_t b = static_cast<size_t>(state.range(0));
  TempDir dir;
  absl::StatusOr<std::unique_ptr<Store>> store =
      Store::Open({.path = dir.File("bench.db"),
                   .synchronous = "NORMAL",
                   .page_size = static_cast<int>(state.range(1))});
  if (!store.ok()) {
    state.SkipWithError(std::string(store.status().message()).c_str());
    return;
  }
  const StreamKey key{"bench/store-run", 0, 0};
  v1::RunStart start;
  start.set_run_id(key.run_id);
  start.set_world_size(1);
  start.set_max_norm(1.0);
  Done done;
  uint64_t ops = 0;
  (*store)->Submit({.key = key,
                    .body = WriteOp::Start{start},
                    .received_unix_nanos = 1,
                    .done = done.Callback()});
  done.Wait(++ops);
  const std::vector<v1::StepRecord> templ = Records(b);
  uint64_t step = 1;
  for (auto _ : state) {
    for (size_t k = 0; k < inflight; ++k) {
      google::protobuf::RepeatedPtrField<v1::StepRecord> recs(templ.begin(),
                                                              templ.end());
      for (v1::StepRecord& r : recs) r.set_step(step++);
      (*store)->Submit({.key = key,
                        .body = WriteOp::Batch{std::move(recs)},
                        .received_unix_nanos = 2,
                        .done = done.Callback()});
    }
    ops += inflight;
    done.Wait(ops);
  }
  if (done.failed() > 0) state.SkipWithError("a write failed");
  const double records = static_cast<double>(state.iterations() * inflight * b);
  state.SetItemsProcessed(static_cast<int64_t>(records));
  state.counters["records_per_s"] =
      benchmark::Counter(records, benchmark::Counter::kIsRate);
  (*store)->Close();
}

// Each with the store's page size and with SQLite's default 4 KiB, side by
// side (the page size of a new database: StoreOptions::page_size).
void PageSizes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"batch", "page"});
  for (int64_t batch : {1, 64, 1024}) {
    for (int64_t page : {int64_t{StoreOptions{}.page_size}, int64_t{4096}}) {
      b->Args({batch, page});
    }
  }
  b->UseRealTime();
}

void BM_StoreCommit(benchmark::State& state) { StoreBench(state, 1); }
BENCHMARK(BM_StoreCommit)->Apply(PageSizes);

void BM_StoreCommitPipelined(benchmark::State& state) { StoreBench(state, 64); }
BENCHMARK(BM_StoreCommitPipelined)->Apply(PageSizes);

// A chunk of 1,024 records encoded and decoded, as the columnar format of
// store/codec/step_codec.h (format:1) and as the serialized StepBatch before it
// (format:0), side by side; bytes_per_record is the blob's size.
google::protobuf::RepeatedPtrField<v1::StepRecord> ChunkRecords(bool float32 = false) {
  const std::vector<v1::StepRecord> templ = Records(1024);
  google::protobuf::RepeatedPtrField<v1::StepRecord> recs(templ.begin(), templ.end());
  uint64_t step = 1;
  for (v1::StepRecord& r : recs) {
    r.set_step(step++);
    if (!float32) continue;
    const float g = static_cast<float>(r.grad_norm());
    r.set_grad_norm(g);
    r.set_clip_coef(v1::ClipCoefFloat32(1.0, g));
    r.set_max_attn_logit(static_cast<float>(r.max_attn_logit()));
    r.set_log_z(static_cast<float>(r.log_z()));
  }
  return recs;
}

std::string EncodeAs(int format, const google::protobuf::RepeatedPtrField<v1::StepRecord>& recs) {
  if (format == 1) return EncodeStepChunk(recs);
  v1::StepBatch batch;
  *batch.mutable_records() = recs;
  return batch.SerializeAsString();
}

void BM_ChunkEncode(benchmark::State& state) {
  const auto recs = ChunkRecords(state.range(1) != 0);
  const int format = static_cast<int>(state.range(0));
  v1::StepBatch batch;
  *batch.mutable_records() = recs;
  size_t bytes = 0;
  for (auto _ : state) {
    std::string blob = format == 1 ? EncodeStepChunk(recs) : batch.SerializeAsString();
    bytes = blob.size();
    benchmark::DoNotOptimize(blob);
  }
  state.SetItemsProcessed(state.iterations() * recs.size());
  state.counters["bytes_per_record"] = static_cast<double>(bytes) / recs.size();
}
BENCHMARK(BM_ChunkEncode)
    ->Args({0, 0})
    ->Args({1, 0})
    ->Args({1, 1})
    ->ArgNames({"format", "float32"});

void BM_ChunkDecode(benchmark::State& state) {
  const auto recs = ChunkRecords(state.range(1) != 0);
  const std::string blob = EncodeAs(static_cast<int>(state.range(0)), recs);
  google::protobuf::RepeatedPtrField<v1::StepRecord> out;
  for (auto _ : state) {
    if (!DecodeStepChunk(blob, &out).ok()) state.SkipWithError("does not decode");
    benchmark::DoNotOptimize(out);
  }
  state.SetItemsProcessed(state.iterations() * recs.size());
}
BENCHMARK(BM_ChunkDecode)
    ->Args({0, 0})
    ->Args({1, 0})
    ->Args({1, 1})
    ->ArgNames({"format", "float32"});

// A 48-layer x 128-expert MoE report on every record (testing::RealisticMoe,
// as step_codec_test's: layers named by their number, with an aux loss).
constexpr int kMoeLayers = 48, kMoeExperts = 128;

google::protobuf::RepeatedPtrField<v1::StepRecord> MoeChunkRecords(bool moe, int records) {
  const std::vector<v1::StepRecord> templ = Records(records);
  google::protobuf::RepeatedPtrField<v1::StepRecord> recs(templ.begin(), templ.end());
  testing::RealisticMoe counts(5, kMoeLayers, kMoeExperts);
  uint64_t step = 1;
  for (v1::StepRecord& r : recs) {
    r.set_step(step++);
    if (moe) counts.AddTo(r);
  }
  return recs;
}

// Without the counts: what the rest of a report costs.
google::protobuf::RepeatedPtrField<v1::StepRecord> WithoutCounts(
    google::protobuf::RepeatedPtrField<v1::StepRecord> recs) {
  for (v1::StepRecord& r : recs) {
    for (v1::MoeLayerStats& layer : *r.mutable_moe()->mutable_layers()) {
      layer.clear_tokens_per_expert();
    }
  }
  return recs;
}

void BM_MoeChunkEncode(benchmark::State& state) {
  const bool moe = state.range(0) != 0;
  const auto recs = MoeChunkRecords(moe, static_cast<int>(state.range(1)));
  size_t bytes = 0;
  for (auto _ : state) {
    std::string blob = EncodeStepChunk(recs);
    bytes = blob.size();
    benchmark::DoNotOptimize(blob);
  }
  state.SetItemsProcessed(state.iterations() * recs.size());
  state.counters["bytes_per_record"] = static_cast<double>(bytes) / recs.size();
  if (moe) {
    const double counts = static_cast<double>(recs.size()) * kMoeLayers * kMoeExperts;
    const double without = static_cast<double>(EncodeStepChunk(WithoutCounts(recs)).size());
    v1::StepBatch batch, batch_without;
    *batch.mutable_records() = recs;
    *batch_without.mutable_records() = WithoutCounts(recs);
    state.counters["bytes_per_count"] = (static_cast<double>(bytes) - without) / counts;
    state.counters["protobuf_bytes_per_count"] =
        static_cast<double>(batch.ByteSizeLong() - batch_without.ByteSizeLong()) / counts;
  }
}
// A chunk of 100 records, and of 16: a stored batch as the server's
// perf runs send MoE reports (each chunk's first records of a layer cost
// more: no history yet, and both predictions priced on the third).
BENCHMARK(BM_MoeChunkEncode)->ArgsProduct({{0, 1}, {100, 16}})->ArgNames({"moe", "records"});

void BM_MoeChunkDecode(benchmark::State& state) {
  const auto recs = MoeChunkRecords(state.range(0) != 0, static_cast<int>(state.range(1)));
  const std::string blob = EncodeStepChunk(recs);
  google::protobuf::RepeatedPtrField<v1::StepRecord> out;
  for (auto _ : state) {
    if (!DecodeStepChunk(blob, &out).ok()) state.SkipWithError("does not decode");
    benchmark::DoNotOptimize(out);
  }
  state.SetItemsProcessed(state.iterations() * recs.size());
}
BENCHMARK(BM_MoeChunkDecode)->ArgsProduct({{0, 1}, {100}})->ArgNames({"moe", "records"});

bool Exec(sqlite3* db, const char* sql) {
  return sqlite3_exec(db, sql, nullptr, nullptr, nullptr) == SQLITE_OK;
}

// The reference: a row per step.
void BM_RawSqliteRowPerStep(benchmark::State& state) {
  const size_t rows_per_txn = static_cast<size_t>(state.range(0));
  TempDir dir;
  sqlite3* db = nullptr;
  if (sqlite3_open(dir.File("raw.db").c_str(), &db) != SQLITE_OK) {
    state.SkipWithError("open failed");
    return;
  }
  bool ok = Exec(db, "PRAGMA journal_mode=WAL") &&
            Exec(db, "PRAGMA synchronous=NORMAL") &&
            Exec(db,
                 "CREATE TABLE steps (run TEXT NOT NULL, rank INTEGER, attempt INTEGER,"
                 " step INTEGER, grad_norm REAL, clipped INTEGER, clip_coef REAL,"
                 " loss_scale REAL, skipped INTEGER, max_attn_logit REAL, log_z REAL,"
                 " loss REAL, lr REAL, time_unix_nanos INTEGER)") &&
            Exec(db, "CREATE UNIQUE INDEX steps_key ON steps(run, rank, attempt, step)");
  sqlite3_stmt* ins = nullptr;
  ok = ok && sqlite3_prepare_v2(db,
                                "INSERT INTO steps VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,"
                                "?10,?11,?12,?13,?14)",
                                -1, &ins, nullptr) == SQLITE_OK;
  if (!ok) {
    state.SkipWithError(sqlite3_errmsg(db));
    sqlite3_close(db);
    return;
  }
  const std::vector<v1::StepRecord> recs = Records(rows_per_txn);
  const std::string run = "bench/raw-run";
  int64_t step = 1;
  for (auto _ : state) {
    ok = ok && Exec(db, "BEGIN");
    for (const v1::StepRecord& r : recs) {
      sqlite3_bind_text(ins, 1, run.data(), static_cast<int>(run.size()), SQLITE_STATIC);
      sqlite3_bind_int(ins, 2, 0);
      sqlite3_bind_int(ins, 3, 0);
      sqlite3_bind_int64(ins, 4, step++);
      sqlite3_bind_double(ins, 5, r.grad_norm());
      sqlite3_bind_int(ins, 6, r.clipped() ? 1 : 0);
      sqlite3_bind_double(ins, 7, r.clip_coef());
      sqlite3_bind_double(ins, 8, r.loss_scale());
      sqlite3_bind_int(ins, 9, r.skipped() ? 1 : 0);
      sqlite3_bind_double(ins, 10, r.max_attn_logit());
      sqlite3_bind_double(ins, 11, r.log_z());
      sqlite3_bind_double(ins, 12, r.loss());
      sqlite3_bind_double(ins, 13, r.lr());
      sqlite3_bind_int64(ins, 14, r.time_unix_nanos());
      ok = ok && sqlite3_step(ins) == SQLITE_DONE;
      sqlite3_reset(ins);
    }
    ok = ok && Exec(db, "COMMIT");
  }
  if (!ok) state.SkipWithError(sqlite3_errmsg(db));
  sqlite3_finalize(ins);
  sqlite3_close(db);
  const double records = static_cast<double>(state.iterations() * rows_per_txn);
  state.SetItemsProcessed(static_cast<int64_t>(records));
  state.counters["records_per_s"] =
      benchmark::Counter(records, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_RawSqliteRowPerStep)->Arg(1024)->ArgName("rows_per_txn")->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
