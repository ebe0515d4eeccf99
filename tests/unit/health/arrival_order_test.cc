// A run's verdict is a function of its records (docs/architecture.md,
// "Arrival order"): the same multi-rank records through the real RunPipeline
// in many arrival orders and batch sizes give the same alerts, and the
// right ones. The fuzz target arrival_order_fuzzer tries orders of its own.
#include <cstdio>
#include <string>
#include <vector>

#include "arrival_order.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainwatch::arrival {
namespace {

using ::testing::ContainsRegex;
using ::testing::ElementsAreArray;
using ::testing::IsEmpty;
using ::testing::SizeIs;

std::string Show(const Verdict& v) {
  std::string out;
  for (const std::string& l : v.lines) out += "  " + l + "\n";
  return out;
}

class ArrivalOrderTest : public ::testing::Test {
 protected:
  HealthConfig config_;
};

TEST_F(ArrivalOrderTest, TheReferenceOrderNamesEveryFaultOnce) {
  const RankedRun run = MakeRun(RunShape{});
  const Verdict v = Replay(run, RoundRobin(run, 1), config_);
  std::printf("[ verdict  ]\n%s", Show(v).c_str());
  ASSERT_THAT(v.Fired("LossSpike"), SizeIs(1));
  EXPECT_THAT(v.Fired("LossSpike")[0], ContainsRegex("onset=1500 "));
  ASSERT_THAT(v.Fired("RankNormMismatch"), SizeIs(1));
  EXPECT_THAT(v.Fired("RankNormMismatch")[0], ContainsRegex("started=800 "));
  ASSERT_THAT(v.Fired("ShardNormMismatch"), SizeIs(1));
  EXPECT_THAT(v.Fired("ShardNormMismatch")[0], ContainsRegex("started=2400 "));
  ASSERT_THAT(v.Fired("RankStraggler"), SizeIs(1));
  EXPECT_THAT(v.Fired("RankStraggler")[0],
              ContainsRegex("started=20[0-4][0-9] .*rank=3 host=node-1"));
  EXPECT_THAT(v.Fired("GradNormDrift"), IsEmpty());
  // The lead's windows hold rank 0's post-warmup steps, and only those.
  EXPECT_EQ(v.lead_window_slots, config_.window_steps);
}

TEST_F(ArrivalOrderTest, EveryOrderAndBatchingGivesTheSameVerdict) {
  const RankedRun run = MakeRun(RunShape{});
  const Verdict reference = Replay(run, RoundRobin(run, 1), config_);
  const std::vector<std::pair<std::string, Schedule>> orders = {
      {"all at once, batches of 7", RoundRobin(run, 7)},
      {"all at once, batches of 1024", RoundRobin(run, 1024)},
      {"one after another, rank 0 first", OneAfterAnother(run, {0, 1, 2, 3}, 512)},
      {"one after another, rank 0 last", OneAfterAnother(run, {1, 2, 3, 0}, 512)},
      {"one after another, reversed, one record a batch",
       OneAfterAnother(run, {3, 2, 1, 0}, 1)},
      {"rank 0 1,000 steps behind", Lagging(run, 0, 1000, 64)},
      {"rank 2 2,500 steps behind", Lagging(run, 2, 2500, 100)},
      {"shuffled 1", Shuffled(run, 1)},
      {"shuffled 2", Shuffled(run, 2)},
      {"shuffled 3", Shuffled(run, 3)},
  };
  for (const auto& [name, schedule] : orders) {
    SCOPED_TRACE(name);
    const Verdict v = Replay(run, schedule, config_);
    EXPECT_THAT(v.lines, ElementsAreArray(reference.lines))
        << "reference:\n" << Show(reference) << name << ":\n" << Show(v);
    EXPECT_EQ(v.lead_window_slots, reference.lead_window_slots);
  }
}

TEST_F(ArrivalOrderTest, ARank100000StepsBehindChangesNothing) {
  RunShape shape;
  shape.world = 3;
  shape.steps = 103'000;
  shape.spike_step = 101'500;
  shape.mismatch_from = 100'800;
  shape.mismatch_to = 101'100;
  shape.shard_from = 102'400;
  shape.shard_to = 102'600;
  shape.slow_from = 102'000;
  const RankedRun run = MakeRun(shape);
  const Verdict reference = Replay(run, RoundRobin(run, 1000), config_);
  ASSERT_THAT(reference.Fired("RankNormMismatch"), SizeIs(1));
  ASSERT_THAT(reference.Fired("LossSpike"), SizeIs(1));
  for (uint32_t late : {0u, 1u}) {
    SCOPED_TRACE(late);
    const Verdict v = Replay(run, Lagging(run, late, 100'000, 1000), config_);
    EXPECT_THAT(v.lines, ElementsAreArray(reference.lines))
        << "reference:\n" << Show(reference) << "lagging:\n" << Show(v);
  }
}

}  // namespace
}  // namespace trainwatch::arrival
