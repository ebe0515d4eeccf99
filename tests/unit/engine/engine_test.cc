// Engine tests: a real store (in memory or a temp file), metrics without an
// exposer, and a fake clock.
#include "engine/engine.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/shard.h"
#include "eventually.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_records.h"

namespace trainwatch {
namespace {

using ::testing::HasSubstr;
using testing::Batch;
using testing::Start;

// Scrapes one series' value; NaN when absent.
double Value(const Metrics& m, const std::string& series) {
  std::string text = m.Serialize();
  size_t pos = text.find("\n" + series + " ");
  if (pos == std::string::npos) return std::nan("");
  return std::strtod(text.c_str() + pos + series.size() + 2, nullptr);
}

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(":memory:"); }
  void TearDown() override { Shut(); }

  // The server's order: close the store (its last callbacks post to the
  // engine's shards), then stop the engine.
  void Shut() {
    if (store_ != nullptr) store_->Close();
    engine_.reset();
    store_.reset();
  }

  // `tune` changes the engine's options beyond this fixture's.
  void Open(const std::string& path, size_t threads = 2,
            const std::function<void(EngineOptions&)>& tune = {}) {
    Shut();
    auto store = Store::Open({.path = path});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    auto metrics = Metrics::Create("");
    ASSERT_TRUE(metrics.ok());
    metrics_ = std::move(*metrics);
    EngineOptions options;
    options.silence_check_interval = std::chrono::milliseconds(0);
    options.max_active_runs = 3;
    options.threads = threads;
    if (tune) tune(options);
    auto engine = Engine::Create(options, store_.get(), metrics_.get(), &clock_);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
  }

  StreamHandle OpenStream(const v1::RunStart& s) {
    std::promise<absl::Status> done;
    auto h = engine_->OpenStream(s, [&](absl::Status st) { done.set_value(st); });
    EXPECT_TRUE(h.ok()) << h.status();
    EXPECT_TRUE(done.get_future().get().ok());
    return *h;
  }
  void Submit(const StreamHandle& h, v1::StepBatch b) {
    std::promise<absl::Status> done;
    engine_->SubmitBatch(h, std::move(b), [&](absl::Status st) { done.set_value(st); });
    ASSERT_TRUE(done.get_future().get().ok());
  }
  void Event(const StreamHandle& h, v1::EventKind kind, uint64_t step) {
    v1::RunEvent e;
    e.set_kind(kind);
    e.set_step(step);
    std::promise<absl::Status> done;
    engine_->SubmitEvent(h, e, [&](absl::Status st) { done.set_value(st); });
    ASSERT_TRUE(done.get_future().get().ok());
  }
  // Waits until the run's shard has run everything posted so far.
  HealthSnapshot Health(const std::string& run) {
    auto h = engine_->GetHealth(run);
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? *h : HealthSnapshot{};
  }

  FakeClock clock_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineTest, CountersAndWindowsReflectACommittedBatchBeforeItsAck) {
  StreamHandle h = OpenStream(Start("r"));
  v1::StepBatch b = Batch(0, 200);
  b.mutable_records(150)->set_grad_norm(2.0);
  b.mutable_records(150)->set_clipped(true);
  Submit(h, b);
  // The ack callback ran: the metrics already show the batch.
  EXPECT_EQ(Value(*metrics_, "trainwatch_steps_total{run=\"r\"}"), 200);
  EXPECT_EQ(Value(*metrics_, "trainwatch_clipped_steps_total{run=\"r\"}"), 1);
  EXPECT_EQ(Value(*metrics_, "trainwatch_clip_fraction{run=\"r\"}"), 1.0 / 200);
  EXPECT_EQ(Value(*metrics_, "trainwatch_grad_norm_window{percentile=\"50\",run=\"r\"}"), 0.5);
  EXPECT_EQ(Value(*metrics_, "trainwatch_grad_norm_window{percentile=\"99\",run=\"r\"}"), 0.5);
  EXPECT_EQ(Value(*metrics_, "trainwatch_recommended_clip_threshold{run=\"r\"}"), 0.5);
}

TEST_F(EngineTest, AnFp8TensorsScaledAmaxIsExportedOnlyWhenFinite) {
  // One definition (v1::ScaledAmax): an overflowed amax (+Inf) is
  // Fp8Overflow's to name, not a ratio on /metrics; the finite tensor is.
  StreamHandle h = OpenStream(Start("r"));
  v1::StepBatch b = Batch(0, 2);
  auto& bad = (*b.mutable_records(0)->mutable_fp8())["l0.fc1:input"];
  bad.set_format(v1::E4M3);
  bad.set_amax(std::numeric_limits<double>::infinity());
  bad.set_scale(1.0);
  Submit(h, b);
  EXPECT_TRUE(std::isnan(Value(*metrics_, "trainwatch_fp8_scaled_amax_ratio{run=\"r\"}")))
      << "an infinite amax reached /metrics";
  v1::StepBatch next = Batch(2, 3);
  auto& good = (*next.mutable_records(0)->mutable_fp8())["l0.fc1:input"];
  good.set_format(v1::E4M3);
  good.set_amax(224.0);
  good.set_scale(1.0);
  Submit(h, next);
  EXPECT_EQ(Value(*metrics_, "trainwatch_fp8_scaled_amax_ratio{run=\"r\"}"), 0.5);
}

TEST_F(EngineTest, AResentBatchIsCountedOnce) {
  StreamHandle h = OpenStream(Start("r"));
  Submit(h, Batch(0, 100));
  Submit(h, Batch(0, 100));
  Submit(h, Batch(50, 150));
  EXPECT_EQ(Value(*metrics_, "trainwatch_steps_total{run=\"r\"}"), 150);
  EXPECT_EQ(Value(*metrics_, "trainwatch_ingest_records_total"), 150);
  EXPECT_EQ(Health("r").window.steps(), 150u);
  EXPECT_EQ(Health("r").window.window_size(), EngineOptions{}.health.window_steps);
}

// The grad-norm window's quantile gauges are selections: after every bulk
// batch, and for a trainer sending a step at a time once ~3% of the full
// window is new (31 norms at W = 1,000); GetHealth computes them exactly.
TEST_F(EngineTest, QuantileGaugesFollowSmallBatchesOnceAFewPercentOfTheWindowIsNew) {
  ASSERT_EQ(EngineOptions{}.health.window_steps, 1000u);
  StreamHandle h = OpenStream(Start("r"));
  Submit(h, Batch(0, 1000));  // a full window of norms 0.5
  const std::string p99 = "trainwatch_grad_norm_window{percentile=\"99\",run=\"r\"}";
  EXPECT_EQ(Value(*metrics_, p99), 0.5);
  // Norms of 9 a step at a time: the 11th puts 9 at the p99 rank (990 of
  // 1,000 in order), the 31st is 3% of the window.
  for (uint64_t step = 1000; step < 1030; ++step) {
    Submit(h, Batch(step, step + 1, 9.0));
  }
  EXPECT_EQ(Health("r").window.grad_norm_p99(), 9.0);
  EXPECT_EQ(Value(*metrics_, p99), 0.5) << "recomputed before 31 new norms";
  Submit(h, Batch(1030, 1031, 9.0));
  EXPECT_EQ(Value(*metrics_, p99), 9.0);
}

// A live trainer's small batch is processed before bulk batches queued
// ahead of it on the shard, but never before its own stream's earlier ones.
TEST_F(EngineTest, ASmallBatchSkipsOtherStreamsBacklogButNotItsOwn) {
  Open(":memory:", /*threads=*/1);
  StreamHandle busy = OpenStream(Start("busy"));
  StreamHandle bulk = OpenStream(Start("bulk"));
  StreamHandle live = OpenStream(Start("live"));
  std::mutex mu;
  std::vector<std::string> order;
  std::vector<std::future<absl::Status>> acks;
  auto submit = [&](const StreamHandle& h, v1::StepBatch b, std::string name) {
    auto done = std::make_shared<std::promise<absl::Status>>();
    acks.push_back(done->get_future());
    engine_->SubmitBatch(
        h, std::move(b), [done](absl::Status s) { done->set_value(s); },
        [&mu, &order, name] {
          std::lock_guard lock(mu);
          order.push_back(name);
        });
  };
  // The shard's one thread works on a long batch while the rest is queued.
  submit(busy, Batch(0, 200000), "busy");
  submit(bulk, Batch(0, 1000), "bulk 0-999");
  submit(bulk, Batch(1000, 1001), "bulk 1000");  // small, behind its own bulk
  submit(live, Batch(0, 1, 50.0), "live spike");  // small, nothing queued
  for (auto& ack : acks) EXPECT_TRUE(ack.get().ok());
  auto at = [&](const std::string& name) {
    return std::find(order.begin(), order.end(), name) - order.begin();
  };
  ASSERT_EQ(order.size(), 4u);
  EXPECT_LT(at("live spike"), at("bulk 0-999")) << ::testing::PrintToString(order);
  EXPECT_LT(at("bulk 0-999"), at("bulk 1000")) << ::testing::PrintToString(order);
  // In order, so none of bulk's steps was taken for a resent one.
  EXPECT_EQ(Value(*metrics_, "trainwatch_steps_total{run=\"bulk\"}"), 1001);
}

TEST(ShardTest, PromptTasksRunBeforeQueuedNormalOnesEachLaneInOrder) {
  Shard shard;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::vector<std::string> order;  // touched by the shard's thread only
  shard.Post([released] { released.wait(); });
  for (const char* name : {"n1", "n2"}) {
    shard.Post([&order, name] { order.push_back(name); });
  }
  for (const char* name : {"p1", "p2"}) {
    shard.Post([&order, name] { order.push_back(name); },
               Shard::Lane::kPrompt);
  }
  // Posted by a normal task while n3 waits: runs before n3.
  shard.Post([&shard, &order] {
    order.push_back("n2b");
    shard.Post([&order] { order.push_back("p3"); }, Shard::Lane::kPrompt);
  });
  shard.Post([&order] { order.push_back("n3"); });
  release.set_value();
  shard.Stop();
  EXPECT_THAT(order, ::testing::ElementsAre("p1", "p2", "n1", "n2", "n2b",
                                            "p3", "n3"));
}

TEST(ShardTest, AChainOfPromptTasksDoesNotStarveNormalOnes) {
  Shard shard;
  std::promise<void> release, chain_done;
  std::shared_future<void> released = release.get_future().share();
  int chain = 0, chain_at_normal = -1;  // touched by the shard's thread only
  std::function<void()> link = [&] {
    if (++chain < 100) {
      shard.Post(link, Shard::Lane::kPrompt);
    } else {
      chain_done.set_value();
    }
  };
  // Both are queued before the shard's thread starts on either (else it
  // can run the whole chain before the normal task is posted).
  shard.Post([released] { released.wait(); });
  shard.Post(link, Shard::Lane::kPrompt);
  shard.Post([&] { chain_at_normal = chain; });
  release.set_value();
  chain_done.get_future().wait();
  shard.Stop();
  EXPECT_EQ(chain, 100);
  EXPECT_GE(chain_at_normal, 1);
  EXPECT_LT(chain_at_normal, 100);  // not only once the chain ended
}

TEST_F(EngineTest, RunLevelHealthFollowsTheLowestRank) {
  StreamHandle r1 = OpenStream(Start("r", 1));
  Submit(r1, Batch(0, 10, 0.9));
  StreamHandle r0 = OpenStream(Start("r", 0));
  Submit(r0, Batch(0, 10, 0.3));
  Submit(r1, Batch(10, 20, 0.9));  // stored, but rank 0 leads now
  EXPECT_EQ(Value(*metrics_, "trainwatch_grad_norm{run=\"r\"}"), 0.3);
  EXPECT_EQ(Value(*metrics_, "trainwatch_last_step{run=\"r\"}"), 9);
  EXPECT_EQ(Value(*metrics_, "trainwatch_ingest_records_total"), 30);
}

TEST_F(EngineTest, ANewAttemptFromACheckpointRewindsTheWindows) {
  StreamHandle a0 = OpenStream(Start("r", 0, 0));
  Submit(a0, Batch(0, 500, 0.5));
  EXPECT_EQ(Health("r").window.steps(), 500u);
  // The job restarts from the checkpoint at step 300: steps 300.. come again.
  StreamHandle a1 = OpenStream(Start("r", 0, 1));
  Submit(a1, Batch(300, 310, 0.7));
  HealthSnapshot s = Health("r");
  EXPECT_EQ(s.window.steps(), 310u);  // 0..299 from attempt 0, 300..309 again
  EXPECT_EQ(Value(*metrics_, "trainwatch_last_step{run=\"r\"}"), 309);
  // Records of the old attempt arriving late no longer lead.
  Submit(a0, Batch(500, 510, 5.0));
  EXPECT_EQ(Health("r").window.steps(), 310u);
}

TEST_F(EngineTest, TooManyActiveRunsIsResourceExhausted) {
  for (const char* run : {"a", "b", "c"}) OpenStream(Start(run));
  auto h = engine_->OpenStream(Start("d"), [](absl::Status) {});
  EXPECT_TRUE(absl::IsResourceExhausted(h.status())) << h.status();
  EXPECT_THAT(std::string(h.status().message()), HasSubstr("3 active runs"));
  // A finished run frees its slot; a known run can always reopen.
  StreamHandle a = OpenStream(Start("a"));
  Event(a, v1::RUN_FINISHED, 0);
  EXPECT_TRUE(engine_->OpenStream(Start("d"), [](absl::Status) {}).ok());
}

TEST_F(EngineTest, ATokensRunsQuotaIsItsOwnAndIdleRunsLeaveTheActiveSet) {
  const RunQuota team_a{.token = 2, .max_active_runs = 2};
  auto open = [&](const char* run, std::optional<RunQuota> quota) {
    std::promise<absl::Status> done;
    auto h = engine_->OpenStream(Start(run), [&](absl::Status s) { done.set_value(s); },
                                 quota);
    if (h.ok()) {
      EXPECT_TRUE(done.get_future().get().ok());
    }
    return h;
  };
  ASSERT_TRUE(open("a1", team_a).ok());
  ASSERT_TRUE(open("a2", team_a).ok());
  absl::StatusOr<StreamHandle> refused = open("a3", team_a);
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status()));
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("this token (line 2 of the token file) already has 2 active "
                        "runs, its runs:2 quota"));
  EXPECT_TRUE(open("a1", team_a).ok());  // an active run reopens
  EXPECT_TRUE(open("b1", std::nullopt).ok());  // another tenant
  // An hour without a batch: a1 and a2 leave the active set; a3 gets in.
  clock_.Advance(std::chrono::seconds(3599));
  engine_->RetireIdleRuns();
  EXPECT_FALSE(open("a3", team_a).ok());
  clock_.Advance(std::chrono::seconds(1));
  engine_->RetireIdleRuns();
  EXPECT_TRUE(open("a3", team_a).ok());
  EXPECT_EQ(Value(*metrics_, "trainwatch_runs_active"), 1);
}

TEST_F(EngineTest, RunSilentFiresAfterTheSilenceAndResolvesOnTheNextStep) {
  StreamHandle h = OpenStream(Start("r"));
  Submit(h, Batch(0, 10));
  clock_.Advance(std::chrono::seconds(299));
  engine_->CheckSilence();
  EXPECT_TRUE(Health("r").active_alerts.empty());
  clock_.Advance(std::chrono::seconds(2));
  engine_->CheckSilence();
  HealthSnapshot s = Health("r");
  ASSERT_EQ(s.active_alerts.size(), 1u);
  EXPECT_EQ(s.active_alerts[0].alertname(), "RunSilent");
  EXPECT_THAT(s.active_alerts[0].description(), HasSubstr("for 301 s"));
  EXPECT_EQ(Value(*metrics_, "trainwatch_alert_active{alertname=\"RunSilent\",run=\"r\",severity=\"warning\"}"), 1);
  Submit(h, Batch(10, 11));
  EXPECT_TRUE(Health("r").active_alerts.empty());
  EXPECT_EQ(Value(*metrics_, "trainwatch_alert_active{alertname=\"RunSilent\",run=\"r\",severity=\"warning\"}"), 0);
  // Both transitions are in the history.
  store_->Close();
  auto alerts = store_->ListAlerts("r", false);
  ASSERT_TRUE(alerts.ok());
  ASSERT_EQ(alerts->size(), 1u);
  EXPECT_EQ((*alerts)[0].state(), v1::ALERT_STATE_RESOLVED);
  EXPECT_EQ((*alerts)[0].resolved_step(), 10u);
}

TEST_F(EngineTest, AFinishedRunIsNeverSilent) {
  StreamHandle h = OpenStream(Start("r"));
  Submit(h, Batch(0, 10));
  Event(h, v1::RUN_FINISHED, 9);
  clock_.Advance(std::chrono::hours(1));
  engine_->CheckSilence();
  EXPECT_TRUE(Health("r").active_alerts.empty());
}

bool Firing(const HealthSnapshot& s, const std::string& alertname) {
  for (const v1::Alert& a : s.active_alerts) {
    if (a.alertname() == alertname) return true;
  }
  return false;
}

TEST_F(EngineTest, AFinishedRunIsForgottenAfterItsRetentionOnceNoStreamHoldsIt) {
  const std::string active = "trainwatch_alert_active{alertname=\"ClipFractionHigh\",run=\"r\",severity=\"warning\"}";
  StreamHandle h = OpenStream(Start("r"));
  Submit(h, Batch(0, 100, 0.5));
  Submit(h, Batch(100, 200, 2.0));  // every step clipped from step 100: a rise
  ASSERT_TRUE(Firing(Health("r"), "ClipFractionHigh"));
  EXPECT_EQ(Value(*metrics_, "trainwatch_run_finished{run=\"r\"}"), 0);
  Event(h, v1::RUN_FINISHED, 199);
  EXPECT_EQ(Value(*metrics_, "trainwatch_run_finished{run=\"r\"}"), 1);
  EXPECT_EQ(Value(*metrics_, "trainwatch_runs_active"), 0);

  // Kept for the retention (1 h by default), and while a stream holds it.
  clock_.Advance(std::chrono::seconds(3599));
  engine_->ForgetFinishedRuns();
  EXPECT_TRUE(Firing(Health("r"), "ClipFractionHigh"));
  clock_.Advance(std::chrono::seconds(1));
  engine_->ForgetFinishedRuns();
  EXPECT_TRUE(engine_->GetHealth("r").ok());
  EXPECT_EQ(Value(*metrics_, "trainwatch_steps_total{run=\"r\"}"), 200);

  // The stream is gone; the store and the shard drop their copies of it as
  // their callbacks finish, so poll.
  h.reset();
  absl::StatusOr<HealthSnapshot> gone;
  EXPECT_TRUE(testing::Eventually([&] {
    engine_->ForgetFinishedRuns();
    gone = engine_->GetHealth("r");
    return !gone.ok();
  }));
  EXPECT_TRUE(absl::IsNotFound(gone.status())) << gone.status();
  for (const char* series : {"trainwatch_steps_total{run=\"r\"}",
                             "trainwatch_run_finished{run=\"r\"}",
                             "trainwatch_last_step{run=\"r\"}"}) {
    EXPECT_TRUE(std::isnan(Value(*metrics_, series))) << series;
  }
  EXPECT_TRUE(std::isnan(Value(*metrics_, active)));

  // The run starts again: fresh live state, nothing counted twice (the
  // engine resumes after the last step stored).
  StreamHandle again = OpenStream(Start("r"));
  Submit(again, Batch(100, 260, 0.5));
  EXPECT_EQ(Value(*metrics_, "trainwatch_steps_total{run=\"r\"}"), 60);
  EXPECT_EQ(Value(*metrics_, "trainwatch_run_finished{run=\"r\"}"), 0);
  EXPECT_EQ(Value(*metrics_, "trainwatch_runs_active"), 1);
  EXPECT_FALSE(Firing(Health("r"), "ClipFractionHigh"));

  // The alert firing when the run was forgotten was resolved, at its last step.
  store_->Close();
  auto alerts = store_->ListAlerts("r", false);
  ASSERT_TRUE(alerts.ok()) << alerts.status();
  bool found = false;
  for (const v1::Alert& a : *alerts) {
    if (a.alertname() != "ClipFractionHigh") continue;
    found = true;
    EXPECT_EQ(a.state(), v1::ALERT_STATE_RESOLVED);
    EXPECT_EQ(a.resolved_step(), 199u);
  }
  EXPECT_TRUE(found);
}

TEST_F(EngineTest, ARestartResolvesTheFiringAlertsOfRunsThatFinished) {
  const std::string path = ::testing::TempDir() + "/engine_finished_restart.db";
  std::remove(path.c_str());
  Open(path);
  StreamHandle done = OpenStream(Start("done"));
  Submit(done, Batch(0, 100, 0.5));
  Submit(done, Batch(100, 200, 2.0));  // ClipFractionHigh fires: clipping from step 100
  Event(done, v1::RUN_FINISHED, 199);
  StreamHandle live = OpenStream(Start("live"));
  Submit(live, Batch(0, 100, 0.5));
  Submit(live, Batch(100, 150, 2.0));
  ASSERT_TRUE(Firing(Health("done"), "ClipFractionHigh"));
  ASSERT_TRUE(Firing(Health("live"), "ClipFractionHigh"));
  done.reset();
  live.reset();

  Open(path);  // a restart: the finished run is not rebuilt, the live one is
  EXPECT_TRUE(absl::IsNotFound(engine_->GetHealth("done").status()));
  EXPECT_TRUE(Firing(Health("live"), "ClipFractionHigh"));
  Shut();  // commits what the restart wrote

  auto store = Store::Open({.path = path});
  ASSERT_TRUE(store.ok()) << store.status();
  auto alerts = (*store)->ListAlerts("", false);
  ASSERT_TRUE(alerts.ok()) << alerts.status();
  std::map<std::string, v1::Alert> by_run;
  for (const v1::Alert& a : *alerts) {
    if (a.alertname() == "ClipFractionHigh") by_run[a.run()] = a;
  }
  ASSERT_EQ(by_run.size(), 2u);
  EXPECT_EQ(by_run["done"].state(), v1::ALERT_STATE_RESOLVED);
  EXPECT_EQ(by_run["done"].resolved_step(), 199u);
  EXPECT_EQ(by_run["live"].state(), v1::ALERT_STATE_FIRING);
}

TEST(EngineRestartTest, ARestartKeepsBaselineWindowsAndFiringAlertsWithoutRefiring) {
  std::string path = ::testing::TempDir() + "/engine_restart_test.db";
  std::remove(path.c_str());
  FakeClock clock;
  EngineOptions options;
  options.silence_check_interval = std::chrono::milliseconds(0);
  v1::RunStart start = Start("r", 0, 0, /*warmup=*/100);
  for (int round = 0; round < 2; ++round) {
    auto store = Store::Open({.path = path});
    ASSERT_TRUE(store.ok());
    auto metrics = Metrics::Create("");
    auto engine = Engine::Create(options, store->get(), metrics->get(), &clock);
    ASSERT_TRUE(engine.ok()) << engine.status();
    if (round == 0) {
      std::promise<absl::Status> opened;
      auto h = (*engine)->OpenStream(start, [&](absl::Status s) { opened.set_value(s); });
      ASSERT_TRUE(opened.get_future().get().ok());
      // Warmup at 0.9, then 1,000 baseline steps at 0.4, then 500 at 0.6.
      for (auto [from, to, norm] : {std::tuple{0, 100, 0.9}, {100, 1100, 0.4}, {1100, 1600, 0.6}}) {
        std::promise<absl::Status> done;
        (*engine)->SubmitBatch(*h, Batch(from, to, norm), [&](absl::Status s) { done.set_value(s); });
        ASSERT_TRUE(done.get_future().get().ok());
      }
      clock.Advance(std::chrono::seconds(400));
      (*engine)->CheckSilence();
      ASSERT_EQ((*engine)->GetHealth("r")->active_alerts.size(), 1u);
      EXPECT_NE(Value(**metrics, "trainwatch_alerts_fired_total{alertname=\"RunSilent\",run=\"r\"}"), 0);
    } else {
      auto health = (*engine)->GetHealth("r");
      ASSERT_TRUE(health.ok()) << health.status();
      EXPECT_EQ(health->window.baseline_grad_norm_median(), 0.4);
      EXPECT_EQ(health->window.steps(), 1000u);
      EXPECT_EQ(health->window.grad_norm_p50(), 0.4);  // 500 x 0.4, 500 x 0.6
      EXPECT_EQ(health->window.grad_norm_p90(), 0.6);
      ASSERT_EQ(health->active_alerts.size(), 1u);
      EXPECT_EQ(health->active_alerts[0].alertname(), "RunSilent");
      // Still firing, and not fired again by this process.
      EXPECT_EQ(Value(**metrics, "trainwatch_alert_active{alertname=\"RunSilent\",run=\"r\",severity=\"warning\"}"), 1);
      EXPECT_TRUE(std::isnan(Value(**metrics, "trainwatch_alerts_fired_total{alertname=\"RunSilent\",run=\"r\"}")));
      EXPECT_EQ(Value(**metrics, "trainwatch_last_step{run=\"r\"}"), 1599);
    }
    (*engine)->Stop();
    (*store)->Close();
  }
  auto store = Store::Open({.path = path});
  auto alerts = (*store)->ListAlerts("r", false);
  ASSERT_TRUE(alerts.ok());
  EXPECT_EQ(alerts->size(), 1u) << "one episode, stored once";
}

// DeleteRun: refused while a stream is open; then the run, its records and
// its series are gone, and another run is untouched.
TEST_F(EngineTest, DeleteRunRemovesTheRunItsRecordsAndSeriesOnlyOnceNoStreamIsOpen) {
  {
    StreamHandle gone = OpenStream(Start("gone"));
    Submit(gone, Batch(0, 50));
    absl::StatusOr<v1::DeleteRunResponse> busy = engine_->DeleteRun("gone");
    EXPECT_TRUE(absl::IsFailedPrecondition(busy.status())) << busy.status();
    EXPECT_THAT(std::string(busy.status().message()), HasSubstr("open stream"));
    Health("gone");
  }
  {
    StreamHandle kept = OpenStream(Start("kept"));
    Submit(kept, Batch(0, 20));
    Health("kept");
  }
  EXPECT_EQ(Value(*metrics_, "trainwatch_steps_total{run=\"gone\"}"), 50);
  absl::StatusOr<v1::DeleteRunResponse> deleted = engine_->DeleteRun("gone");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(deleted->records(), 50u);
  EXPECT_TRUE(std::isnan(Value(*metrics_, "trainwatch_steps_total{run=\"gone\"}")));
  EXPECT_TRUE(absl::IsNotFound(store_->GetRun("gone").status()));
  EXPECT_TRUE(absl::IsNotFound(engine_->DeleteRun("gone").status()));
  ASSERT_TRUE(store_->GetRun("kept").ok());
  EXPECT_EQ(store_->GetRun("kept")->steps(), 20u);
  // The id is free again: a new run of that name starts afresh.
  StreamHandle again = OpenStream(Start("gone"));
  Submit(again, Batch(0, 5));
  EXPECT_EQ(store_->GetRun("gone")->steps(), 5u);
}

TEST_F(EngineTest, RetentionDeletesRunsWhoseLastRecordIsOlderThanItsDays) {
  Open(":memory:", 2, [](EngineOptions& o) {
    o.retention_days = 2;
    o.retention_check_interval = std::chrono::milliseconds(0);
  });
  {
    StreamHandle old_run = OpenStream(Start("old"));
    Submit(old_run, Batch(0, 10));
    Event(old_run, v1::RUN_FINISHED, 9);
  }
  clock_.Advance(std::chrono::hours(36));
  {
    StreamHandle recent = OpenStream(Start("recent"));
    Submit(recent, Batch(0, 10));
    Event(recent, v1::RUN_FINISHED, 9);
  }
  engine_->ApplyRetention();
  EXPECT_TRUE(store_->GetRun("old").ok()) << "36 h is within 2 days";
  clock_.Advance(std::chrono::hours(13));
  engine_->ApplyRetention();
  EXPECT_TRUE(absl::IsNotFound(store_->GetRun("old").status()));
  EXPECT_TRUE(store_->GetRun("recent").ok());
}

}  // namespace
}  // namespace trainwatch
