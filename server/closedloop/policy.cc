#include "closedloop/policy.h"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "health/alert_catalog.h"

namespace trainwatch {
namespace {

// The ladder's rungs after the first: steps' batches skipped from the onset,
// and the LR scale.
struct Rung {
  uint64_t skip_steps;
  double lr_scale;
};
constexpr Rung kLaterRungs[] = {{200, 0.9}, {500, 0.67}};

bool Counts(const v1::DirectiveRecord& d) {
  return Pending(d) || d.state() == kApplied;
}

}  // namespace

bool Pending(const v1::DirectiveRecord& d) {
  return d.state() == kProposed || d.state() == kApproved || d.state() == kDelivered;
}

const v1::RunEvent* PlanCheckpoint(const std::vector<v1::RunEvent>& events, uint64_t step) {
  const v1::RunEvent* found = nullptr;
  for (const v1::RunEvent& e : events) {
    if (e.kind() == v1::CHECKPOINT_SAVED && e.step() + kRestartLeadSteps <= step &&
        (found == nullptr || e.step() >= found->step())) {
      found = &e;
    }
  }
  return found;
}

bool HasRestartPlan(std::string_view alertname) {
  const std::optional<AlertKind> kind = AlertKindByName(alertname);
  return kind.has_value() && Spec(*kind).has_restart_plan;
}

bool Answers(const v1::Alert& alert, const ClosedLoopConfig& config) {
  return config.mode != ClosedLoopConfig::Mode::kOff && HasRestartPlan(alert.alertname()) &&
         alert.severity() == v1::SEVERITY_CRITICAL;
}

const char* ActionName(const v1::Directive& d) {
  switch (d.action_case()) {
    case v1::Directive::kCheckpointNow: return "checkpoint_now";
    case v1::Directive::kSkip: return "skip";
    case v1::Directive::kRollback: return "rollback";
    case v1::Directive::kScaleLr: return "scale_lr";
    case v1::Directive::kStop: return "stop";
    case v1::Directive::ACTION_NOT_SET: break;
  }
  return "";
}

void RecentBatches::Add(uint64_t step, const google::protobuf::RepeatedField<int64_t>& ids) {
  while (!held_.empty() && held_.back().step >= step) {
    ids_.erase(ids_.end() - static_cast<std::ptrdiff_t>(held_.back().ids), ids_.end());
    held_.pop_back();
  }
  ++records_;
  if (!ids.empty()) {
    held_.push_back({.step = step, .record = records_, .ids = static_cast<size_t>(ids.size())});
    ids_.insert(ids_.end(), ids.begin(), ids.end());
  }
  while (!held_.empty() && held_.front().record + kMaxSteps <= records_) {
    ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(held_.front().ids));
    held_.pop_front();
  }
}

std::vector<int64_t> RecentBatches::Between(uint64_t from, uint64_t to) const {
  std::vector<int64_t> out;
  auto id = ids_.begin();
  for (const Held& h : held_) {
    const auto end = id + static_cast<std::ptrdiff_t>(h.ids);
    if (h.step >= from && h.step < to) out.insert(out.end(), id, end);
    id = end;
  }
  return out;
}

std::optional<Proposal> Propose(const v1::Alert& alert, uint32_t attempt,
                                const std::vector<v1::DirectiveRecord>& history,
                                const std::vector<v1::RunEvent>& events,
                                const RecentBatches& recent, const ClosedLoopConfig& config) {
  if (!Answers(alert, config)) return std::nullopt;
  const uint64_t alert_step = alert.started_step();
  const uint64_t onset =
      alert.onset_step() != 0 && alert.onset_step() <= alert_step ? alert.onset_step() : alert_step;
  Proposal p;
  // The incident a pending directive answers, still firing in the same
  // attempt, is not a new one; a later one replaces it.
  const v1::DirectiveRecord* last = nullptr;
  for (const v1::DirectiveRecord& d : history) {
    if (Pending(d) && (d.directive().has_rollback() || d.directive().has_stop())) last = &d;
  }
  if (last != nullptr) {
    if (last->directive().has_stop()) return std::nullopt;  // stopping already
    const size_t at = last->directive().alert().rfind('@');
    const uint64_t last_step =
        at == std::string::npos ? 0 : std::strtoull(last->directive().alert().c_str() + at + 1,
                                                    nullptr, 10);
    if (last->directive().for_attempt() == attempt &&
        alert_step < last_step + config.min_steps_between) {
      return std::nullopt;
    }
    p.supersedes = last->directive().seq();
  }
  std::vector<const v1::DirectiveRecord*> rollbacks;
  for (const v1::DirectiveRecord& d : history) {
    if (d.directive().has_stop() && Counts(d)) return std::nullopt;
    if (d.directive().has_rollback() && Counts(d) && d.directive().seq() != p.supersedes) {
      rollbacks.push_back(&d);
    }
  }
  v1::Directive& out = p.directive;
  out.set_for_attempt(attempt);
  out.set_alert(absl::StrCat(alert.alertname(), "@", alert_step));
  const size_t rung = rollbacks.size();
  if (rung >= config.max_rollbacks) {
    out.mutable_stop()->set_checkpoint_first(true);
    out.set_reason(absl::StrCat(alert.alertname(), " at step ", alert_step, " came back after ",
                                rung, " rollbacks (closed_loop.max_rollbacks ",
                                config.max_rollbacks, "): stop the run and look at it. ",
                                alert.likely_cause()));
    p.exhausted = true;
    return p;
  }
  const v1::RunEvent* checkpoint = PlanCheckpoint(events, onset);
  uint64_t skip_to = alert_step + 1;
  double lr_scale = 1.0;
  if (rung > 0) {
    const Rung& r = kLaterRungs[std::min(rung - 1, std::size(kLaterRungs) - 1)];
    skip_to = onset + r.skip_steps;
    lr_scale = r.lr_scale;
    // An earlier checkpoint than the last rollback's, when there is one.
    const uint64_t before = rollbacks.back()->directive().rollback().to_step();
    if (const v1::RunEvent* earlier =
            PlanCheckpoint(events, std::min(before + kRestartLeadSteps - 1, onset));
        earlier != nullptr) {
      checkpoint = earlier;
    }
  }
  if (checkpoint == nullptr) return std::nullopt;
  v1::Rollback* rollback = out.mutable_rollback();
  rollback->set_to_step(checkpoint->step());
  rollback->set_checkpoint(checkpoint->detail());
  std::vector<int64_t> skip = recent.Between(onset, skip_to);
  // The alert's own step may be judged before the lead's record of it is
  // kept: its batch ids come with the alert.
  for (int64_t id : alert.batch_ids()) {
    if (std::find(skip.begin(), skip.end(), id) == skip.end()) skip.push_back(id);
  }
  rollback->mutable_skip_batch_ids()->Add(skip.begin(), skip.end());
  rollback->set_lr_scale(lr_scale);
  out.set_reason(absl::StrCat(
      alert.alertname(), " from step ", onset, " (alert at step ", alert_step, "): rollback ",
      rung + 1, " of at most ", config.max_rollbacks, " to the checkpoint of step ",
      checkpoint->step(), ", skipping ", skip.size(), " batch ids of steps ", onset, "..",
      skip_to - 1, lr_scale != 1.0 ? absl::StrCat(", LR x ", lr_scale) : "", ". ",
      alert.likely_cause()));
  return p;
}

}  // namespace trainwatch
