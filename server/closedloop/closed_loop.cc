#include "closedloop/closed_loop.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace trainwatch {
namespace {

constexpr int64_t kNanosPerSecond = 1'000'000'000;

size_t StateIndex(absl::string_view state) {
  for (size_t i = 0; i < std::size(kDirectiveStates); ++i) {
    if (state == kDirectiveStates[i]) return i;
  }
  return std::size(kDirectiveStates);
}

size_t ActionIndex(absl::string_view action) {
  for (size_t i = 0; i < std::size(kDirectiveActions); ++i) {
    if (action == kDirectiveActions[i]) return i;
  }
  return std::size(kDirectiveActions);
}

}  // namespace

ClosedLoop::ClosedLoop(ClosedLoopConfig config, Store* store, Metrics* metrics,
                       const Clock* clock)
    : config_(std::move(config)), store_(store), clock_(clock) {
  if (metrics == nullptr) return;
  for (const char* action : kDirectiveActions) {
    std::vector<prometheus::Counter*>& row = counters_.emplace_back();
    for (const char* state : kDirectiveStates) {
      row.push_back(&metrics->directives_total.Add({{"action", action}, {"state", state}}));
    }
  }
}

absl::StatusOr<std::pair<std::string, uint64_t>> ClosedLoop::ParseId(const std::string& id) {
  const size_t hash = id.rfind('#');
  uint64_t seq = 0;
  if (hash == std::string::npos || hash == 0 ||
      !absl::SimpleAtoi(absl::string_view(id).substr(hash + 1), &seq) || seq == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", id, "\" is not a directive id (RUN#SEQ, as trainwatchctl directives lists them)"));
  }
  return std::make_pair(id.substr(0, hash), seq);
}

absl::Status ClosedLoop::Load() {
  absl::StatusOr<std::vector<v1::DirectiveRecord>> stored = store_->ListDirectives("");
  if (!stored.ok()) return stored.status();
  absl::MutexLock lock(&mu_);
  for (v1::DirectiveRecord& d : *stored) {
    RunLoop& run = RunLocked(d.run_id());
    run.next_seq = std::max(run.next_seq, d.directive().seq() + 1);
    run.attempt = std::max(run.attempt, d.directive().for_attempt());
    run.directives.push_back(std::move(d));
  }
  absl::StatusOr<std::vector<HoldRow>> holds = store_->ListHolds();
  if (!holds.ok()) return holds.status();
  for (const HoldRow& h : *holds) RunLocked(h.run_id).hold_until_unix_nanos = h.until_unix_nanos;
  for (auto& [run_id, run] : runs_) {
    absl::StatusOr<v1::RunStart> lead = store_->GetLeadStart(run_id);
    if (lead.ok()) run.world_size = std::max<uint32_t>(1, lead->world_size());
  }
  return absl::OkStatus();
}

ClosedLoop::RunLoop& ClosedLoop::RunLocked(const std::string& run_id) {
  return runs_[run_id];
}

v1::DirectiveRecord* ClosedLoop::FindLocked(const std::string& id) {
  absl::StatusOr<std::pair<std::string, uint64_t>> parsed = ParseId(id);
  if (!parsed.ok()) return nullptr;
  auto it = runs_.find(parsed->first);
  if (it == runs_.end()) return nullptr;
  for (v1::DirectiveRecord& d : it->second.directives) {
    if (d.directive().id() == id) return &d;
  }
  return nullptr;
}

bool ClosedLoop::HeldLocked(const RunLoop& run) const {
  return run.hold_until_unix_nanos > clock_->NowUnixNanos();
}

void ClosedLoop::TransitionLocked(v1::DirectiveRecord& d, const std::string& state,
                                  const std::string& who, const std::string& why, Ops& ops) {
  const bool per_rank = state == kRankReceived || state == kRankApplied;
  if (!per_rank) {
    d.set_state(state);
    const size_t a = ActionIndex(ActionName(d.directive()));
    const size_t s = StateIndex(state);
    if (a < counters_.size() && s < counters_[a].size()) counters_[a][s]->Increment();
  }
  v1::DirectiveTransition* t = d.add_transitions();
  t->set_state(state);
  t->set_who(who);
  t->set_unix_nanos(clock_->NowUnixNanos());
  t->set_why(why);
  ops.push_back(WriteOp{.key = StreamKey{.run_id = d.run_id()},
                        .body = WriteOp::Directive{.record = d, .add_transition = true},
                        .received_unix_nanos = t->unix_nanos()});
}

void ClosedLoop::MaybeApproveByPolicyLocked(const RunLoop& run, v1::DirectiveRecord& d,
                                            Ops& ops) {
  if (config_.mode != ClosedLoopConfig::Mode::kAuto || d.state() != kProposed ||
      HeldLocked(run) || !config_.auto_actions.contains(std::string(ActionName(d.directive())))) {
    return;
  }
  d.mutable_directive()->set_approved_by("policy");
  TransitionLocked(d, kApproved, "policy",
                   absl::StrCat("closed_loop.mode auto lists ", ActionName(d.directive())), ops);
}

void ClosedLoop::Submit(Ops ops, std::function<void(absl::Status)> done) {
  if (ops.empty()) {
    if (!done) return;
    // Nothing changed: an empty op still keeps the caller's place in the
    // store's order.
    ops.push_back(WriteOp{.body = WriteOp::Directive{}});
  }
  for (size_t i = 0; i + 1 < ops.size(); ++i) store_->Submit(std::move(ops[i]));
  WriteOp& last = ops.back();
  if (done) last.done = [done = std::move(done)](WriteResult r) { done(r.status); };
  store_->Submit(std::move(last));
}

std::optional<ClosedLoop::Answer> ClosedLoop::OnAlertFired(const v1::Alert& alert,
                                                           uint32_t attempt,
                                                           const RecentBatches& recent) {
  if (!Answers(alert, config_)) return std::nullopt;
  absl::StatusOr<std::vector<v1::RunEvent>> events = store_->ListEvents(alert.run());
  if (!events.ok()) return std::nullopt;  // no plan without the events
  Ops ops;
  Answer answer;
  {
    absl::MutexLock lock(&mu_);
    RunLoop& run = RunLocked(alert.run());
    events->insert(events->end(), run.checkpoints.begin(), run.checkpoints.end());
    std::optional<Proposal> p =
        Propose(alert, attempt, run.directives, *events, recent, config_);
    if (!p.has_value()) return std::nullopt;
    if (p->supersedes != 0) {
      for (v1::DirectiveRecord& d : run.directives) {
        if (d.directive().seq() == p->supersedes) {
          TransitionLocked(d, kSuperseded, "policy",
                           absl::StrCat(p->directive.alert(), " proposes a new directive"), ops);
        }
      }
    }
    v1::DirectiveRecord& d = run.directives.emplace_back();
    d.set_run_id(alert.run());
    *d.mutable_directive() = std::move(p->directive);
    const uint64_t seq = run.next_seq++;
    d.mutable_directive()->set_seq(seq);
    d.mutable_directive()->set_id(absl::StrCat(alert.run(), "#", seq));
    TransitionLocked(d, kProposed, "policy", d.directive().reason(), ops);
    MaybeApproveByPolicyLocked(run, d, ops);
    answer.exhausted = p->exhausted;
    if (p->exhausted) answer.reason = d.directive().reason();
    const std::string& id = d.directive().id();
    answer.note = d.state() == kApproved
               ? absl::StrCat("Directive ", id, " (", ActionName(d.directive()),
                              ") was approved by policy (closed_loop.auto).")
               : absl::StrCat("Proposed directive ", id, " (", ActionName(d.directive()),
                              "): trainwatchctl approve ", id, " (or reject ", id, ").");
  }
  Submit(std::move(ops));
  return answer;
}

void ClosedLoop::OnStreamStart(const v1::RunStart& start) {
  Ops ops;
  {
    absl::MutexLock lock(&mu_);
    RunLoop& run = RunLocked(start.run_id());
    run.world_size = std::max<uint32_t>({run.world_size, start.world_size(), 1});
    if (start.attempt() > run.attempt) {
      run.attempt = start.attempt();
      for (v1::DirectiveRecord& d : run.directives) {
        if ((d.state() == kProposed || d.state() == kApproved) &&
            d.directive().for_attempt() < start.attempt()) {
          TransitionLocked(d, kExpired, "server",
                           absl::StrCat("the run restarted as attempt ", start.attempt(),
                                        " before it was delivered"),
                           ops);
        }
      }
    }
  }
  Submit(std::move(ops));
}

void ClosedLoop::OnEvent(const std::string& run_id, const v1::RunEvent& event) {
  if (event.kind() != v1::CHECKPOINT_SAVED) return;
  absl::MutexLock lock(&mu_);
  std::vector<v1::RunEvent>& kept = RunLocked(run_id).checkpoints;
  kept.push_back(event);
  if (kept.size() > kMaxCheckpoints) kept.erase(kept.begin());
}

void ClosedLoop::OnProgress(const std::string& run_id, uint64_t step) {
  absl::MutexLock lock(&mu_);
  RunLoop& run = RunLocked(run_id);
  run.max_step = std::max(run.max_step, step);
}

std::vector<v1::Directive> ClosedLoop::ToDeliver(const std::string& run_id, uint32_t rank,
                                                 uint64_t last_applied) {
  std::vector<v1::Directive> out;
  Ops ops;
  {
    absl::MutexLock lock(&mu_);
    auto it = runs_.find(run_id);
    if (it == runs_.end()) return out;
    RunLoop& run = it->second;
    for (v1::DirectiveRecord& d : run.directives) {
      // A hold that ran out releases what it held back.
      if (d.state() == kProposed) MaybeApproveByPolicyLocked(run, d, ops);
      if (d.state() != kApproved && d.state() != kDelivered) continue;
      if (d.directive().seq() <= last_applied) continue;
      if (std::find(d.applied_ranks().begin(), d.applied_ranks().end(), rank) !=
          d.applied_ranks().end()) {
        continue;
      }
      if (d.state() == kApproved) {
        d.mutable_directive()->set_apply_at_step(run.max_step + config_.lead_steps);
        TransitionLocked(d, kDelivered, "server",
                         absl::StrCat("sent to rank ", rank, " to apply at step ",
                                      d.directive().apply_at_step()),
                         ops);
      }
      out.push_back(d.directive());
    }
  }
  Submit(std::move(ops));
  return out;
}

void ClosedLoop::OnAck(const std::string& run_id, const v1::DirectiveAck& ack,
                       std::function<void(absl::Status)> done) {
  Ops ops;
  {
    absl::MutexLock lock(&mu_);
    v1::DirectiveRecord* d = FindLocked(ack.id());
    if (d != nullptr && d->run_id() == run_id) {
      const std::string who = absl::StrCat("rank ", ack.rank());
      auto& ranks = *d->mutable_applied_ranks();
      const bool applied_here =
          std::find(ranks.begin(), ranks.end(), ack.rank()) != ranks.end();
      switch (ack.state()) {
        case v1::RECEIVED:
          if (Pending(*d)) {
            TransitionLocked(*d, kRankReceived, who, absl::StrCat("at step ", ack.step()), ops);
          }
          break;
        case v1::APPLIED:
          if (applied_here || d->state() != kDelivered) break;  // once per rank
          ranks.Add(ack.rank());
          TransitionLocked(*d, kRankApplied, who, absl::StrCat("at step ", ack.step()), ops);
          if (static_cast<uint32_t>(ranks.size()) >= RunLocked(run_id).world_size) {
            TransitionLocked(*d, kApplied, "server",
                             absl::StrCat("every rank (", ranks.size(), ") applied it at step ",
                                          d->directive().apply_at_step()),
                             ops);
          }
          break;
        case v1::REJECTED:
          if (d->state() != kDelivered) break;
          if (ack.detail().starts_with("late") && ranks.empty()) {
            // Back to APPROVED: the next delivery sets a new step.
            TransitionLocked(*d, kApproved, "server",
                             absl::StrCat(who, " was past step ", d->directive().apply_at_step(),
                                          " (at ", ack.step(), "): reissued"),
                             ops);
          } else {
            TransitionLocked(*d, kRejected, who,
                             ack.detail().empty() ? "rejected by the trainer" : ack.detail(), ops);
          }
          break;
        default:
          break;
      }
    }
  }
  Submit(std::move(ops), std::move(done));
}

std::vector<v1::DirectiveRecord> ClosedLoop::List(const std::string& run_id) const {
  absl::MutexLock lock(&mu_);
  auto it = runs_.find(run_id);
  if (it == runs_.end()) return {};
  return it->second.directives;
}

absl::StatusOr<v1::DirectiveRecord> ClosedLoop::Decide(const std::string& id, bool approve,
                                                       const std::string& who,
                                                       const std::string& note) {
  absl::StatusOr<std::pair<std::string, uint64_t>> parsed = ParseId(id);
  if (!parsed.ok()) return parsed.status();
  Ops ops;
  v1::DirectiveRecord out;
  {
    absl::MutexLock lock(&mu_);
    v1::DirectiveRecord* d = FindLocked(id);
    if (d == nullptr) {
      return absl::NotFoundError(absl::StrCat("no directive ", id,
                                              " (trainwatchctl directives --run ",
                                              parsed->first, " lists them)"));
    }
    const std::string& state = d->state();
    const std::string why = note.empty() ? (approve ? "approved" : "rejected") : note;
    if (approve) {
      if (state == kProposed) {
        d->mutable_directive()->set_approved_by(who);
        TransitionLocked(*d, kApproved, who, why, ops);
      } else if (state != kApproved && state != kDelivered && state != kApplied) {
        return absl::FailedPreconditionError(
            absl::StrCat("directive ", id, " is ", state, ": it can no longer be approved"));
      }
    } else if (state == kProposed || state == kApproved) {
      TransitionLocked(*d, kRejected, who, why, ops);
    } else if (state != kRejected) {
      return absl::FailedPreconditionError(
          absl::StrCat("directive ", id, " is ", state, ": it can no longer be rejected"));
    }
    out = *d;
  }
  Submit(std::move(ops));
  return out;
}

int64_t ClosedLoop::Hold(const std::string& run_id, uint64_t seconds, const std::string& who) {
  Ops ops;
  int64_t until = 0;
  {
    absl::MutexLock lock(&mu_);
    RunLoop& run = RunLocked(run_id);
    const uint64_t max_seconds = static_cast<uint64_t>(INT64_MAX / kNanosPerSecond) / 2;
    if (seconds > 0) {
      until = clock_->NowUnixNanos() +
              static_cast<int64_t>(std::min(seconds, max_seconds)) * kNanosPerSecond;
    }
    run.hold_until_unix_nanos = until;
    if (until == 0) {
      // Released: what the policy would have approved meanwhile, it approves.
      for (v1::DirectiveRecord& d : run.directives) MaybeApproveByPolicyLocked(run, d, ops);
    }
    // Stored first: a person's veto outlives a restart.
    ops.insert(ops.begin(),
               WriteOp{.key = {run_id, 0, 0},
                       .body = WriteOp::Hold{HoldRow{run_id, until, who,
                                                     clock_->NowUnixNanos()}}});
  }
  Submit(std::move(ops));
  return until;
}

void ClosedLoop::ForgetRun(const std::string& run_id) {
  absl::MutexLock lock(&mu_);
  runs_.erase(run_id);
}

}  // namespace trainwatch
