// The closed loop's policy (the ladder) and its state machine, on a store in
// memory and a fake clock.
#include "closedloop/closed_loop.h"

#include <future>
#include <initializer_list>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_records.h"

namespace trainwatch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::Alert Critical(const std::string& name, uint64_t onset, uint64_t step) {
  v1::Alert a;
  a.set_alertname(name);
  a.set_run("r1");
  a.set_severity(v1::SEVERITY_CRITICAL);
  a.set_state(v1::ALERT_STATE_FIRING);
  a.set_onset_step(onset);
  a.set_started_step(step);
  a.set_likely_cause("the loss left its level");
  return a;
}

v1::RunEvent Checkpoint(uint64_t step) {
  v1::RunEvent e;
  e.set_step(step);
  e.set_kind(v1::CHECKPOINT_SAVED);
  e.set_detail("ckpt-" + std::to_string(step));
  return e;
}

RecentBatches Batches(uint64_t from, uint64_t to) {
  RecentBatches r;
  for (uint64_t s = from; s < to; ++s) {
    google::protobuf::RepeatedField<int64_t> ids;
    ids.Add(static_cast<int64_t>(10 * s));
    r.Add(s, ids);
  }
  return r;
}

v1::DirectiveRecord Record(v1::Directive d, const char* state, uint64_t seq) {
  v1::DirectiveRecord r;
  d.set_seq(seq);
  *r.mutable_directive() = std::move(d);
  r.set_state(state);
  return r;
}

TEST(Policy, FirstRollbackGoesToThePlansCheckpointAndSkipsOnsetToAlert) {
  const ClosedLoopConfig config;
  std::optional<Proposal> p =
      Propose(Critical("LossDivergence", 1100, 1103), 0, {},
              {Checkpoint(500), Checkpoint(1000), Checkpoint(1050)}, Batches(900, 1104), config);
  ASSERT_TRUE(p.has_value());
  ASSERT_TRUE(p->directive.has_rollback());
  // 1050 is not 100 steps before the onset: the plan's checkpoint is 1000.
  EXPECT_EQ(p->directive.rollback().to_step(), 1000u);
  EXPECT_EQ(p->directive.rollback().checkpoint(), "ckpt-1000");
  EXPECT_THAT(p->directive.rollback().skip_batch_ids(), ElementsAre(11000, 11010, 11020, 11030));
  EXPECT_EQ(p->directive.rollback().lr_scale(), 1.0);
  EXPECT_EQ(p->directive.alert(), "LossDivergence@1103");
  EXPECT_FALSE(p->exhausted);
}

TEST(Policy, NothingWithoutACheckpointBeforeTheOnsetNorForInfoOrOtherAlerts) {
  const ClosedLoopConfig config;
  EXPECT_FALSE(Propose(Critical("LossDivergence", 1100, 1103), 0, {}, {Checkpoint(1050)},
                       Batches(900, 1104), config)
                   .has_value());
  v1::Alert info = Critical("LossSpike", 1100, 1103);
  info.set_severity(v1::SEVERITY_INFO);
  EXPECT_FALSE(Propose(info, 0, {}, {Checkpoint(500)}, Batches(900, 1104), config).has_value());
  EXPECT_FALSE(Propose(Critical("RunSilent", 1100, 1103), 0, {}, {Checkpoint(500)},
                       Batches(900, 1104), config)
                   .has_value());
  ClosedLoopConfig off;
  off.mode = ClosedLoopConfig::Mode::kOff;
  EXPECT_FALSE(Propose(Critical("LossDivergence", 1100, 1103), 0, {}, {Checkpoint(500)},
                       Batches(900, 1104), off)
                   .has_value());
}

TEST(Policy, ARecurrenceClimbsTheLadderThenStops) {
  const ClosedLoopConfig config;
  const std::vector<v1::RunEvent> events = {Checkpoint(500), Checkpoint(1000)};
  const RecentBatches recent = Batches(1000, 1104);
  std::vector<v1::DirectiveRecord> history;
  std::optional<Proposal> first =
      Propose(Critical("LossDivergence", 1100, 1103), 0, history, events, recent, config);
  ASSERT_TRUE(first.has_value());
  history.push_back(Record(first->directive, kApplied, 1));
  // Attempt 1 replays the range and the alert comes back.
  std::optional<Proposal> second =
      Propose(Critical("LossDivergence", 1100, 1103), 1, history, events, recent, config);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->directive.rollback().to_step(), 500u);  // an earlier checkpoint
  EXPECT_EQ(second->directive.rollback().lr_scale(), 0.9);
  EXPECT_EQ(second->directive.rollback().skip_batch_ids_size(), 4);  // the steps seen of 200
  history.push_back(Record(second->directive, kApplied, 2));
  std::optional<Proposal> third =
      Propose(Critical("LossDivergence", 1100, 1103), 2, history, events, recent, config);
  ASSERT_TRUE(third.has_value());
  EXPECT_EQ(third->directive.rollback().lr_scale(), 0.67);
  history.push_back(Record(third->directive, kApplied, 3));
  std::optional<Proposal> stop =
      Propose(Critical("LossDivergence", 1100, 1103), 3, history, events, recent, config);
  ASSERT_TRUE(stop.has_value());
  EXPECT_TRUE(stop->directive.has_stop());
  EXPECT_TRUE(stop->exhausted);
  EXPECT_THAT(stop->directive.reason(), HasSubstr("max_rollbacks 3"));
  history.push_back(Record(stop->directive, kProposed, 4));
  EXPECT_FALSE(Propose(Critical("LossDivergence", 1100, 1103), 4, history, events, recent, config)
                   .has_value());
}

TEST(Policy, TheSameIncidentInOneAttemptProposesOnceALaterOneSupersedes) {
  const ClosedLoopConfig config;  // min_steps_between 200
  const std::vector<v1::RunEvent> events = {Checkpoint(500), Checkpoint(1000)};
  std::optional<Proposal> first = Propose(Critical("NonFiniteUpdate", 1100, 1100), 0, {}, events,
                                          Batches(1000, 1500), config);
  ASSERT_TRUE(first.has_value());
  std::vector<v1::DirectiveRecord> history = {Record(first->directive, kProposed, 1)};
  EXPECT_FALSE(Propose(Critical("LossScaleCollapse", 1150, 1150), 0, history, events,
                       Batches(1000, 1500), config)
                   .has_value());
  std::optional<Proposal> later = Propose(Critical("ScalerStuck", 1400, 1400), 0, history,
                                          events, Batches(1000, 1500), config);
  ASSERT_TRUE(later.has_value());
  EXPECT_EQ(later->supersedes, 1u);
  EXPECT_EQ(later->directive.rollback().lr_scale(), 1.0);  // still the first rung
}

// The state machine against a store in memory.
class ClosedLoopTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(ClosedLoopConfig{}); }

  void Open(ClosedLoopConfig config) {
    loop_.reset();
    if (store_ == nullptr) {
      absl::StatusOr<std::unique_ptr<Store>> s = Store::Open({.path = ":memory:"});
      ASSERT_TRUE(s.ok()) << s.status();
      store_ = std::move(*s);
      v1::RunStart start = testing::Start("r1");  // world_size 2
      Wait(WriteOp{.key = {"r1", 0, 0}, .body = WriteOp::Start{start}});
      Wait(WriteOp{.key = {"r1", 0, 0}, .body = WriteOp::Event{Checkpoint(500)}});
    }
    loop_ = std::make_unique<ClosedLoop>(config, store_.get(), nullptr, &clock_);
    ASSERT_TRUE(loop_->Load().ok());
    v1::RunStart start = testing::Start("r1");
    loop_->OnStreamStart(start);
  }

  void Wait(WriteOp op) {
    std::promise<absl::Status> p;
    op.done = [&](WriteResult r) { p.set_value(r.status); };
    store_->Submit(std::move(op));
    ASSERT_TRUE(p.get_future().get().ok());
  }

  void Ack(uint32_t rank, v1::DirectiveState state, const std::string& id, uint64_t step,
           const std::string& detail = "") {
    v1::DirectiveAck ack;
    ack.set_id(id);
    ack.set_rank(rank);
    ack.set_state(state);
    ack.set_step(step);
    ack.set_detail(detail);
    std::promise<absl::Status> p;
    loop_->OnAck("r1", ack, [&](absl::Status s) { p.set_value(s); });
    ASSERT_TRUE(p.get_future().get().ok());
  }

  std::string Fire() {
    std::optional<ClosedLoop::Answer> note =
        loop_->OnAlertFired(Critical("LossDivergence", 700, 710), 0, Batches(600, 711));
    EXPECT_TRUE(note.has_value());
    std::vector<v1::DirectiveRecord> list = loop_->List("r1");
    return list.empty() ? "" : list.back().directive().id();
  }

  std::string State(const std::string& id) {
    for (const v1::DirectiveRecord& d : loop_->List("r1")) {
      if (d.directive().id() == id) return d.state();
    }
    return "";
  }

  FakeClock clock_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<ClosedLoop> loop_;
};

TEST_F(ClosedLoopTest, ProposedWaitsForApprovalThenEveryRankAppliesOnce) {
  const std::string id = Fire();
  EXPECT_EQ(id, "r1#1");
  EXPECT_EQ(State(id), kProposed);
  loop_->OnProgress("r1", 720);
  EXPECT_TRUE(loop_->ToDeliver("r1", 0, 0).empty());  // nothing until approved
  ASSERT_TRUE(loop_->Decide(id, true, "alice", "looks right").ok());
  // A duplicate approval is a no-op.
  absl::StatusOr<v1::DirectiveRecord> again = loop_->Decide(id, true, "bob", "");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->directive().approved_by(), "alice");
  std::vector<v1::Directive> sent = loop_->ToDeliver("r1", 0, 0);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].apply_at_step(), 722u);  // highest step + lead_steps
  EXPECT_EQ(State(id), kDelivered);
  loop_->OnProgress("r1", 721);
  std::vector<v1::Directive> to_rank1 = loop_->ToDeliver("r1", 1, 0);
  ASSERT_EQ(to_rank1.size(), 1u);
  EXPECT_EQ(to_rank1[0].apply_at_step(), 722u);  // the same step for every rank
  EXPECT_TRUE(loop_->ToDeliver("r1", 0, /*last_applied=*/1).empty());
  Ack(0, v1::APPLIED, id, 722);
  Ack(0, v1::APPLIED, id, 722);  // a duplicate ack counts once
  EXPECT_EQ(State(id), kDelivered);
  EXPECT_TRUE(loop_->ToDeliver("r1", 0, 0).empty());  // rank 0 applied it
  Ack(1, v1::APPLIED, id, 722);
  EXPECT_EQ(State(id), kApplied);
  EXPECT_FALSE(loop_->Decide(id, false, "carol", "").ok());  // too late to reject

  // Every transition is stored and read back after a restart.
  Open(ClosedLoopConfig{});
  std::vector<v1::DirectiveRecord> list = loop_->List("r1");
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].state(), kApplied);
  EXPECT_THAT(list[0].applied_ranks(), ElementsAre(0, 1));
  std::vector<std::string> states;
  for (const auto& t : list[0].transitions()) states.push_back(t.state());
  EXPECT_THAT(states, ElementsAre(kProposed, kApproved, kDelivered, kRankApplied, kRankApplied,
                                  kApplied));
  EXPECT_EQ(list[0].transitions(1).who(), "alice");
  EXPECT_EQ(list[0].transitions(1).why(), "looks right");
  EXPECT_EQ(Fire(), "r1#2");  // seqs go on from what is stored
}

TEST_F(ClosedLoopTest, ALateRankGetsItReissuedForALaterStep) {
  const std::string id = Fire();
  ASSERT_TRUE(loop_->Decide(id, true, "alice", "").ok());
  loop_->OnProgress("r1", 720);
  ASSERT_EQ(loop_->ToDeliver("r1", 0, 0).size(), 1u);
  Ack(1, v1::REJECTED, id, 725, "late");
  EXPECT_EQ(State(id), kApproved);
  loop_->OnProgress("r1", 730);
  std::vector<v1::Directive> again = loop_->ToDeliver("r1", 1, 0);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].apply_at_step(), 732u);
  Ack(0, v1::REJECTED, id, 731, "cannot load the checkpoint");
  EXPECT_EQ(State(id), kRejected);
}

// Auto mode with rollback approved by policy.
ClosedLoopConfig AutoRollback() {
  ClosedLoopConfig config;
  config.mode = ClosedLoopConfig::Mode::kAuto;
  config.auto_actions = {"rollback"};
  return config;
}

TEST_F(ClosedLoopTest, AutoApprovesWhatItListsUnlessHeld) {
  Open(AutoRollback());
  loop_->Hold("r1", 3600, "alice");
  const std::string held = Fire();
  EXPECT_EQ(State(held), kProposed);
  loop_->Hold("r1", 0, "alice");  // release: the policy approves what it held
  EXPECT_EQ(State(held), kApproved);
  EXPECT_EQ(loop_->List("r1").back().directive().approved_by(), "policy");
}

TEST_F(ClosedLoopTest, AHoldOutlivesARestart) {
  const ClosedLoopConfig config = AutoRollback();
  Open(config);
  loop_->Hold("r1", 3600, "alice");
  Wait(WriteOp{.key = {"r1", 0, 0}, .body = WriteOp::Directive{}});  // stored
  Open(config);  // the server restarts within the hour
  const std::string held = Fire();
  EXPECT_EQ(State(held), kProposed) << "the policy approved what a person held";
  clock_.Advance(std::chrono::hours(2));
  loop_->Hold("r1", 0, "alice");  // released: the policy approves what it held
  Wait(WriteOp{.key = {"r1", 0, 0}, .body = WriteOp::Directive{}});
  Open(config);
  EXPECT_EQ(State(held), kApproved);
}

TEST_F(ClosedLoopTest, ANewAttemptExpiresWhatWasNotDelivered) {
  const std::string id = Fire();
  v1::RunStart next = testing::Start("r1", 0, /*attempt=*/1);
  loop_->OnStreamStart(next);
  EXPECT_EQ(State(id), kExpired);
  EXPECT_FALSE(loop_->Decide(id, true, "alice", "").ok());
  EXPECT_FALSE(loop_->Decide("not-an-id", true, "alice", "").ok());
  EXPECT_EQ(loop_->Decide("r1#99", true, "alice", "").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace trainwatch

namespace trainwatch {
namespace {

google::protobuf::RepeatedField<int64_t> Ids(std::initializer_list<int64_t> ids) {
  google::protobuf::RepeatedField<int64_t> out;
  for (int64_t id : ids) out.Add(id);
  return out;
}

TEST(RecentBatches, HoldsTheLatestRecordsIdsAndAReplayReplacesWhatFollows) {
  RecentBatches r;
  EXPECT_TRUE(r.empty());
  r.Add(1, Ids({}));  // a record without ids holds nothing
  EXPECT_TRUE(r.empty());
  r.Add(2, Ids({20, 21}));
  r.Add(3, Ids({}));
  r.Add(4, Ids({40}));
  r.Add(5, Ids({50, 51, 52}));
  EXPECT_EQ(r.Between(0, 100), (std::vector<int64_t>{20, 21, 40, 50, 51, 52}));
  EXPECT_EQ(r.Between(3, 5), (std::vector<int64_t>{40}));
  // A restart from step 4: what 4 and 5 held is replaced.
  r.Add(4, Ids({41}));
  EXPECT_EQ(r.Between(0, 100), (std::vector<int64_t>{20, 21, 41}));
  // kMaxSteps records later, the oldest have left, records without ids too.
  for (uint64_t s = 5; s < 5 + RecentBatches::kMaxSteps - 2; ++s) r.Add(s, Ids({}));
  EXPECT_EQ(r.Between(0, 100), (std::vector<int64_t>{41}));
  r.Add(5 + RecentBatches::kMaxSteps, Ids({7}));
  EXPECT_EQ(r.Between(0, 100000), (std::vector<int64_t>{41, 7}));
  r.Add(6 + RecentBatches::kMaxSteps, Ids({}));  // step 4's record is 1,024 records old
  EXPECT_EQ(r.Between(0, 100000), (std::vector<int64_t>{7}));
}

}  // namespace
}  // namespace trainwatch
