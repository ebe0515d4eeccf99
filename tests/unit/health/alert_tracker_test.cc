// The alert tracker's caused_by: found among every alert that fires at a
// step, whatever order the detectors ran in (BeginStep .. EndStep), and a
// consequence that fired a step or two before its cause marked with one
// update.
#include <optional>
#include <vector>

#include "gtest/gtest.h"
#include "health/run/alert_tracker.h"

namespace trainwatch {
namespace {

struct Seen {
  AlertKind kind;
  bool firing;
  bool update;
  std::optional<AlertKind> caused_by;
};

class AlertTrackerTest : public ::testing::Test {
 protected:
  AlertTrackerTest()
      : tracker_(config_,
                 [this](const AlertEpisode& e) {
                   seen_.push_back({e.kind, e.firing, e.update, e.caused_by});
                 },
                 [](const SpikeInfo&) {}) {}

  void Holds(AlertKind kind, uint64_t step) {
    tracker_.Condition(kind, step, true, 1.0, [] { return AlertText{"s", "d"}; });
  }

  HealthConfig config_;
  std::vector<Seen> seen_;
  AlertTracker tracker_;
};

TEST_F(AlertTrackerTest, AConsequenceJudgedBeforeItsCauseAtTheSameStepCarriesIt) {
  for (bool cause_first : {true, false}) {
    SCOPED_TRACE(cause_first);
    seen_.clear();
    AlertTracker& t = tracker_;
    t.Resolve(AlertKind::kMoeRouterCollapse, 0);
    t.Resolve(AlertKind::kMoeDeadExpert, 0);
    seen_.clear();
    const uint64_t step = cause_first ? 10 : 1000;
    t.BeginStep();
    if (cause_first) Holds(AlertKind::kMoeRouterCollapse, step);
    Holds(AlertKind::kMoeDeadExpert, step);
    if (!cause_first) Holds(AlertKind::kMoeRouterCollapse, step);
    EXPECT_TRUE(seen_.empty());  // held until every detector ran
    t.EndStep(step);
    ASSERT_EQ(seen_.size(), 2u);
    for (const Seen& s : seen_) {
      EXPECT_TRUE(s.firing);
      EXPECT_FALSE(s.update);  // one report each, caused_by already in it
      if (s.kind == AlertKind::kMoeDeadExpert) {
        EXPECT_EQ(s.caused_by, AlertKind::kMoeRouterCollapse);
      } else {
        EXPECT_EQ(s.caused_by, std::nullopt);
      }
    }
  }
}

TEST_F(AlertTrackerTest, AFireHeldThisStepIsReportedBeforeItsResolve) {
  tracker_.BeginStep();
  Holds(AlertKind::kMoeTokensDropped, 5);
  tracker_.Resolve(AlertKind::kMoeTokensDropped, 5);
  tracker_.EndStep(5);
  ASSERT_EQ(seen_.size(), 2u);
  EXPECT_TRUE(seen_[0].firing);
  EXPECT_FALSE(seen_[1].firing);
}

TEST_F(AlertTrackerTest, AConsequenceThatFiredAStepEarlierIsMarkedByOneUpdate) {
  tracker_.BeginStep();
  Holds(AlertKind::kMoeDeadExpert, 20);
  tracker_.EndStep(20);
  tracker_.BeginStep();
  Holds(AlertKind::kMoeRouterCollapse, 21);
  tracker_.EndStep(21);
  ASSERT_EQ(seen_.size(), 3u);
  EXPECT_EQ(seen_[0].caused_by, std::nullopt);
  EXPECT_EQ(seen_[2].kind, AlertKind::kMoeDeadExpert);
  EXPECT_TRUE(seen_[2].update);
  EXPECT_EQ(seen_[2].caused_by, AlertKind::kMoeRouterCollapse);
}

}  // namespace
}  // namespace trainwatch
