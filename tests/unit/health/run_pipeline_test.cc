// RunPipeline on its own: no threads, no store, no metrics; a recording
// observer sees everything it reports.
#include "health/run/run_pipeline.h"
#include "trainwatch/v1/alert_names.h"

#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "health/alert_catalog.h"
#include "health/run/alert_tracker.h"

namespace trainwatch {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr int64_t kSecond = 1'000'000'000;

v1::RunStart Start(uint32_t rank, uint32_t attempt = 0, double max_norm = 1.0) {
  v1::RunStart s;
  s.set_run_id("r");
  s.set_rank(rank);
  s.set_attempt(attempt);
  s.set_world_size(2);
  s.set_precision(v1::BF16);
  s.set_max_norm(max_norm);
  return s;
}

std::vector<v1::StepRecord> Steps(uint64_t from, uint64_t to, double norm = 0.5) {
  std::vector<v1::StepRecord> out;
  for (uint64_t i = from; i < to; ++i) {
    v1::StepRecord r;
    r.set_step(i);
    r.set_grad_norm(norm);
    r.set_clipped(norm > 1.0);
    out.push_back(r);
  }
  return out;
}

struct Recorder final : RunObserver {
  void OnAlert(AlertKind kind, const v1::Alert& a, bool) override {
    alerts.push_back(std::string(v1::Firing(a) ? "fire " : "resolve ") +
                     std::string(Spec(kind).name));
  }
  void OnSpike(const SpikeInfo& s) override { spikes.push_back(s.step); }
  void OnLeadChanged(const v1::RunStart& s) override {
    leads.push_back(s.rank() * 100 + s.attempt());
  }
  void OnLeadRecord(const v1::StepRecord& r) override { lead_steps.push_back(r.step()); }
  void OnRecordsAccepted(size_t fresh, uint64_t dropped) override {
    accepted.push_back(fresh);
    client_dropped += dropped;
  }
  void OnLeadBatchDone(const v1::StepRecord& last, int64_t) override {
    batch_ends.push_back(last.step());
  }
  void OnWindows(const RunHealth& h) override {
    window_slots.push_back(h.window().grad_norm.slots());
  }

  std::vector<std::string> alerts;
  std::vector<uint64_t> spikes;
  std::vector<uint32_t> leads;  // rank * 100 + attempt
  std::vector<uint64_t> lead_steps;
  std::vector<size_t> accepted;
  uint64_t client_dropped = 0;
  std::vector<uint64_t> batch_ends;
  std::vector<size_t> window_slots;
};

class RunPipelineTest : public ::testing::Test {
 protected:
  RunPipelineTest() { config_.window_steps = 100; }

  void Send(const v1::RunStart& start, const std::vector<v1::StepRecord>& records,
            uint64_t dropped = 0) {
    now_ += kSecond;
    const google::protobuf::RepeatedPtrField<v1::StepRecord> batch(
        records.begin(), records.end());
    pipeline_.OnBatch(start, batch, dropped, now_);
  }

  HealthConfig config_;
  Recorder seen_;
  int64_t now_ = 1'700'000'000 * kSecond;
  RunPipeline pipeline_{"r", config_, &seen_, now_};
};

TEST_F(RunPipelineTest, KnowsAStreamOnceStartedAndResumesAfterTheStoredStep) {
  EXPECT_FALSE(pipeline_.KnowsStream(0, 0));
  pipeline_.OnStreamStarted(0, 0, 9);
  EXPECT_TRUE(pipeline_.KnowsStream(0, 0));
  EXPECT_FALSE(pipeline_.KnowsStream(0, 1));
  Send(Start(0), Steps(5, 15));
  // Steps 5..9 are stored already: only 10..14 count.
  EXPECT_THAT(seen_.lead_steps, ElementsAre(10, 11, 12, 13, 14));
  EXPECT_THAT(seen_.accepted, ElementsAre(5));
  EXPECT_THAT(seen_.batch_ends, ElementsAre(14));
  EXPECT_EQ(pipeline_.last_step(), 14u);
}

TEST_F(RunPipelineTest, AResentBatchCountsOnceAndItsDropsNotAgain) {
  pipeline_.OnStreamStarted(0, 0, std::nullopt);
  Send(Start(0), Steps(0, 10), /*dropped=*/3);
  Send(Start(0), Steps(0, 10), /*dropped=*/3);  // all seen: nothing reported
  Send(Start(0), Steps(5, 12), /*dropped=*/3);  // 10, 11 are new
  EXPECT_THAT(seen_.accepted, ElementsAre(10, 2));
  EXPECT_EQ(seen_.client_dropped, 6u);
  EXPECT_EQ(seen_.lead_steps.size(), 12u);
  // A later resume point already known is only ever raised.
  pipeline_.OnStreamStarted(0, 0, 3);
  Send(Start(0), Steps(11, 13));
  EXPECT_THAT(seen_.accepted, ElementsAre(10, 2, 1));
}

TEST_F(RunPipelineTest, TheLargestStepDoesNotWrapTheDedup) {
  pipeline_.OnStreamStarted(0, 0, std::nullopt);
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  Send(Start(0), Steps(max - 1, max));
  std::vector<v1::StepRecord> last = Steps(0, 1);
  last[0].set_step(max);
  Send(Start(0), last);
  Send(Start(0), last);          // resent: seen
  Send(Start(0), Steps(0, 5));  // went backwards: skipped, as the store does
  EXPECT_THAT(seen_.accepted, ElementsAre(1, 1));
  EXPECT_EQ(pipeline_.last_step(), max);
}

TEST_F(RunPipelineTest, TheLowestRankLeadsAndTheLatestAttemptOfIt) {
  for (uint32_t rank : {0u, 1u}) pipeline_.OnStreamStarted(rank, 0, std::nullopt);
  pipeline_.OnStreamStarted(0, 1, std::nullopt);
  Send(Start(1), Steps(0, 3));  // rank 1 waits: rank 0 may still come
  EXPECT_FALSE(pipeline_.has_lead());
  Send(Start(0), Steps(0, 2));  // rank 0 leads, from its own first step
  Send(Start(1), Steps(3, 5));  // not the lead: cross-rank checks only
  Send(Start(0, 1), Steps(2, 4));  // a later attempt of rank 0 leads
  Send(Start(0, 0), Steps(2, 4));  // the old attempt no longer does
  EXPECT_THAT(seen_.leads, ElementsAre(0, 1));
  EXPECT_THAT(seen_.lead_steps, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(seen_.accepted, ElementsAre(3, 2, 2, 2, 2));
  EXPECT_EQ(pipeline_.lead_rank(), 0u);
  EXPECT_EQ(pipeline_.lead_attempt(), 1u);
  EXPECT_EQ(pipeline_.last_step(), 3u);
  // Rank 1's records never reached the lead's windows.
  EXPECT_EQ(pipeline_.health()->window().grad_norm.slots(), 4u);
}

TEST_F(RunPipelineTest, AHigherRankLeadsOnceTheLowerRanksAreMissing) {
  for (uint32_t rank : {0u, 1u}) pipeline_.OnStreamStarted(rank, 0, std::nullopt);
  Send(Start(1), Steps(0, 30, 2.0));  // every step clipped
  pipeline_.CheckRanks(now_ + (config_.ranks.missing_after_seconds - 1) * kSecond);
  EXPECT_FALSE(pipeline_.has_lead());
  EXPECT_THAT(seen_.lead_steps, IsEmpty());
  // Rank 0 never came: rank 1 leads with every record it sent.
  pipeline_.CheckRanks(now_ + config_.ranks.missing_after_seconds * kSecond);
  ASSERT_TRUE(pipeline_.has_lead());
  EXPECT_EQ(pipeline_.lead_rank(), 1u);
  EXPECT_THAT(seen_.leads, ElementsAre(100));
  EXPECT_EQ(seen_.lead_steps.size(), 30u);
  EXPECT_THAT(seen_.batch_ends, ElementsAre(29));
  EXPECT_EQ(pipeline_.health()->window().grad_norm.slots(), 30u);
  // Rank 0 after all: it takes over on fresh windows, with its own records.
  Send(Start(0), Steps(0, 5));
  EXPECT_EQ(pipeline_.lead_rank(), 0u);
  EXPECT_EQ(pipeline_.health()->window().grad_norm.slots(), 5u);
}

TEST_F(RunPipelineTest, ALeadWaitingTooLongLeadsAtItsRecordLimit) {
  config_.ranks.max_pending_lead_records = 10;
  pipeline_.OnStreamStarted(1, 0, std::nullopt);
  Send(Start(1), Steps(0, 9));
  EXPECT_FALSE(pipeline_.has_lead());
  Send(Start(1), Steps(9, 12));
  EXPECT_TRUE(pipeline_.has_lead());
  EXPECT_EQ(seen_.lead_steps.size(), 12u);
}

TEST_F(RunPipelineTest, ANewAttemptFromAnEarlierStepRewindsTheWindows) {
  pipeline_.OnStreamStarted(0, 0, std::nullopt);
  pipeline_.OnStreamStarted(0, 1, std::nullopt);
  Send(Start(0, 0), Steps(0, 50));
  ASSERT_NE(pipeline_.health(), nullptr);
  EXPECT_EQ(pipeline_.health()->window().grad_norm.slots(), 50u);
  // The restart from a checkpoint at step 20 forgets steps 20..49.
  Send(Start(0, 1), Steps(20, 25));
  EXPECT_EQ(pipeline_.health()->window().grad_norm.slots(), 25u);
  EXPECT_EQ(pipeline_.health()->last_step(), 24u);
  EXPECT_EQ(seen_.window_slots.back(), 25u);
}

TEST_F(RunPipelineTest, AFaultThatComesBackAfterARestartIsAnAlertOfItsOwn) {
  // Attempt 0 meets a non-finite update at step 150; attempt 1 restarts
  // from step 100 and meets it again at 150, well within the first alert's
  // resolve_after_steps: the restart resolved the abandoned alert, so the
  // recurrence fires anew (the closed loop's ladder counts on it).
  pipeline_.OnStreamStarted(0, 0, std::nullopt);
  pipeline_.OnStreamStarted(0, 1, std::nullopt);
  std::vector<v1::StepRecord> first = Steps(0, 170);
  first[150].set_grad_norm(std::numeric_limits<double>::quiet_NaN());
  Send(Start(0, 0), first);
  std::vector<v1::StepRecord> again = Steps(100, 170);
  again[50].set_grad_norm(std::numeric_limits<double>::quiet_NaN());  // step 150
  Send(Start(0, 1), again);
  std::vector<std::string> nonfinite;
  for (const std::string& a : seen_.alerts) {
    if (absl::StrContains(a, "NonFiniteUpdate")) nonfinite.push_back(a);
  }
  EXPECT_THAT(nonfinite, ElementsAre("fire NonFiniteUpdate", "resolve NonFiniteUpdate",
                                     "fire NonFiniteUpdate"));
}

TEST_F(RunPipelineTest, ANewAttemptPastTheLastStepKeepsTheWindows) {
  pipeline_.OnStreamStarted(0, 0, std::nullopt);
  pipeline_.OnStreamStarted(0, 1, std::nullopt);
  Send(Start(0, 0), Steps(0, 50));
  Send(Start(0, 1), Steps(50, 55));
  EXPECT_EQ(pipeline_.health()->window().grad_norm.slots(), 55u);
}

TEST_F(RunPipelineTest, SilenceFiresRunSilentAndTheNextRecordResolvesIt) {
  pipeline_.OnTick(now_ + 1000 * kSecond);
  EXPECT_THAT(seen_.alerts, IsEmpty()) << "no lead yet: nothing to be silent";
  pipeline_.OnStreamStarted(0, 0, std::nullopt);
  Send(Start(0), Steps(0, 10));
  pipeline_.OnTick(now_ + 299 * kSecond);
  EXPECT_THAT(seen_.alerts, IsEmpty());
  pipeline_.OnTick(now_ + 300 * kSecond);
  EXPECT_THAT(seen_.alerts, ElementsAre("fire RunSilent"));
  EXPECT_EQ(pipeline_.Snapshot().active_alerts.size(), 1u);
  Send(Start(0), Steps(10, 11));
  EXPECT_THAT(seen_.alerts, ElementsAre("fire RunSilent", "resolve RunSilent"));
  EXPECT_THAT(pipeline_.Snapshot().active_alerts, IsEmpty());
}

TEST_F(RunPipelineTest, OnlyFinishedOrFailedEndsTheRunAndResolvesRunSilent) {
  pipeline_.OnStreamStarted(0, 0, std::nullopt);
  Send(Start(0), Steps(0, 10));
  pipeline_.OnTick(now_ + 400 * kSecond);
  v1::RunEvent event;
  event.set_kind(v1::CHECKPOINT_SAVED);
  event.set_step(9);
  EXPECT_FALSE(pipeline_.OnEvent(0, 0, event));
  EXPECT_THAT(seen_.alerts, ElementsAre("fire RunSilent"));
  event.set_kind(v1::RUN_FINISHED);
  EXPECT_TRUE(pipeline_.OnEvent(0, 0, event));
  EXPECT_THAT(seen_.alerts, ElementsAre("fire RunSilent", "resolve RunSilent"));
  event.set_kind(v1::RUN_FAILED);
  EXPECT_TRUE(pipeline_.OnEvent(0, 0, event));
}

TEST_F(RunPipelineTest, ClippingFiresAndResolveAllResolvesAtTheLastStep) {
  pipeline_.OnStreamStarted(0, 0, std::nullopt);
  // Clean, then every step clipped: a rise, named at once (the norm's own
  // level rises 1.5x: not GradNormDrift's).
  Send(Start(0), Steps(0, 100, /*norm=*/0.99));
  Send(Start(0), Steps(100, 150, /*norm=*/1.5));
  EXPECT_THAT(seen_.alerts, ElementsAre("fire ClipFractionHigh"));
  HealthSnapshot snap = pipeline_.Snapshot();
  ASSERT_EQ(snap.active_alerts.size(), 1u);
  EXPECT_EQ(snap.active_alerts[0].alertname(), "ClipFractionHigh");
  EXPECT_EQ(snap.window.clip_fraction(), 0.5);
  EXPECT_EQ(snap.window.steps(), 100u);
  ASSERT_TRUE(snap.recommended_max_norm.has_value());
  EXPECT_EQ(*snap.recommended_max_norm, 1.5);
  pipeline_.ResolveAll(now_);
  EXPECT_THAT(seen_.alerts, ElementsAre("fire ClipFractionHigh", "resolve ClipFractionHigh"));
  EXPECT_THAT(pipeline_.Snapshot().active_alerts, IsEmpty());
}

TEST(RunPipelineLogZ, TheForecastMeasuresFromLogZDriftsOwnBaselineAndARewindRetakesIt) {
  // log Z at 6 for its baseline (50 steps), then climbing 0.005 a step: the
  // snapshot forecasts where it will be log_z.nats (5) out from the median
  // LogZDrift measures from, and a restart into the baseline retakes it.
  HealthConfig config;
  config.log_z.baseline_steps = 50;
  Recorder seen;
  const int64_t now = 1'700'000'000 * kSecond;
  RunPipeline pipeline("r", config, &seen, now);
  pipeline.OnStreamStarted(0, 0, std::nullopt);
  const auto feed = [&](uint32_t attempt, uint64_t from, uint64_t to, double base) {
    std::vector<v1::StepRecord> records = Steps(from, to);
    for (v1::StepRecord& r : records) {
      r.set_log_z(base + (r.step() < 50 ? 0.0 : 0.005 * static_cast<double>(r.step() - 50)));
    }
    const google::protobuf::RepeatedPtrField<v1::StepRecord> batch(records.begin(),
                                                                   records.end());
    pipeline.OnBatch(Start(0, attempt), batch, 0, now);
  };
  feed(0, 0, 40, 6.0);
  EXPECT_FALSE(pipeline.health()->LogZBaseline().has_value());  // not taken yet
  EXPECT_EQ(pipeline.Snapshot().window.log_z_forecast_step(), 0u);
  // The forecast needs a trend (512 steps) 2/3 of the way out (step 717).
  feed(0, 40, 800, 6.0);
  ASSERT_TRUE(pipeline.health()->LogZBaseline().has_value());
  EXPECT_DOUBLE_EQ(*pipeline.health()->LogZBaseline(), 6.0);
  const HealthSnapshot snap = pipeline.Snapshot();
  ASSERT_NE(snap.window.log_z_forecast_step(), 0u);
  // 5 nats at 0.005 a step from step 50: step 1050, give or take the fit.
  EXPECT_NEAR(static_cast<double>(snap.window.log_z_forecast_step()), 1050, 30);
  // A restart from step 20 (inside the baseline) at another level: the
  // baseline is taken again from the new records.
  pipeline.OnStreamStarted(0, 1, std::nullopt);
  feed(1, 20, 120, 3.0);
  ASSERT_TRUE(pipeline.health()->LogZBaseline().has_value());
  EXPECT_DOUBLE_EQ(*pipeline.health()->LogZBaseline(), 3.0);
}

TEST_F(RunPipelineTest, RecoveryReplaysMutedAndKeepsStoredAlertsFiring) {
  pipeline_.Recover(Start(0, 1), /*last_step=*/149);
  v1::Alert stored;
  stored.set_alertname("ClipFractionHigh");
  stored.set_state(v1::ALERT_STATE_FIRING);
  stored.set_started_step(110);
  pipeline_.RestoreAlert(stored);
  pipeline_.BeginReplay();
  for (const v1::StepRecord& r : Steps(0, 150, 2.0)) pipeline_.Replay(1, r, now_);
  // A later attempt than the lead's is not the lead's history.
  for (const v1::StepRecord& r : Steps(150, 160, 2.0)) pipeline_.Replay(2, r, now_);
  pipeline_.EndReplay();
  EXPECT_THAT(seen_.alerts, IsEmpty());
  EXPECT_THAT(seen_.spikes, IsEmpty());
  EXPECT_THAT(seen_.window_slots, ElementsAre(100));
  EXPECT_EQ(pipeline_.last_step(), 149u);
  EXPECT_EQ(pipeline_.health()->last_step(), 149u);
  HealthSnapshot snap = pipeline_.Snapshot();
  ASSERT_EQ(snap.active_alerts.size(), 1u);
  EXPECT_EQ(snap.active_alerts[0].started_step(), 110u);
  // Live again after the replay: the clipping goes on, nothing new fires,
  // and healthy steps resolve the stored alert: with hysteresis the clip
  // rate's downward sequential test must first show the rate below the
  // resolve threshold (a few hundred clean steps after 150 clipped ones),
  // then resolve_after_steps more.
  pipeline_.OnStreamStarted(0, 1, 149);
  Send(Start(0, 1), Steps(150, 1500, 0.5));
  EXPECT_THAT(seen_.alerts, ElementsAre("resolve ClipFractionHigh"));
  EXPECT_THAT(seen_.leads, IsEmpty()) << "the recovered lead is still the lead";
}

// Found by ingest_fuzzer: a spike that recurred after a restart which
// skipped its batches amends the firing GradNormSpike (optimizer or LR, now
// critical). That report is the same episode again, an update: it was sent
// as a second fire, and the router counted trainwatch_alerts_fired_total
// twice for one episode.
TEST(AlertTrackerAmend, AnAmendedAlertIsAnUpdateNotASecondFire) {
  HealthConfig config;
  std::vector<AlertEpisode> seen;
  AlertTracker tracker(config, [&](const AlertEpisode& e) { seen.push_back(e); },
                       nullptr);
  tracker.Amend(AlertKind::kGradNormSpike, AlertText{.summary = "x"},
                v1::SEVERITY_UNSPECIFIED);
  EXPECT_THAT(seen, IsEmpty()) << "nothing to amend while it is not firing";
  tracker.SetNow(0);
  tracker.Fire(AlertKind::kGradNormSpike, 100, 9.0,
               AlertText{.summary = "Gradient norm spike at step 100"});
  tracker.Amend(AlertKind::kGradNormSpike,
                AlertText{.summary = "Gradient norm spike at step 100",
                          .description = "it recurred"},
                v1::SEVERITY_CRITICAL);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen[0].firing);
  EXPECT_FALSE(seen[0].update);
  EXPECT_TRUE(seen[1].firing);
  EXPECT_TRUE(seen[1].update);
  EXPECT_EQ(seen[1].started_step, 100u);
  EXPECT_EQ(seen[1].severity, v1::SEVERITY_CRITICAL);
  EXPECT_EQ(seen[1].text.description, "it recurred");
  EXPECT_FALSE(tracker.episode(AlertKind::kGradNormSpike).update)
      << "later reports are not updates unless they are";
}

}  // namespace
}  // namespace trainwatch
