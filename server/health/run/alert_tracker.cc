#include "health/run/alert_tracker.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace trainwatch {

AlertTracker::AlertTracker(const HealthConfig& config, Listener on_transition,
                           SpikeListener on_spike)
    : config_(config),
      on_transition_(std::move(on_transition)),
      on_spike_(std::move(on_spike)) {
  for (size_t i = 0; i < kAlertKindCount; ++i) {
    states_[i].episode.kind = static_cast<AlertKind>(i);
  }
}

bool AlertTracker::Enabled(AlertKind kind) const {
  return !config_.disabled.contains(std::string(Spec(kind).name));
}

bool AlertTracker::AcrossRanks(AlertKind kind) {
  return Spec(kind).scope == AlertScope::kAcrossRanks;
}

void AlertTracker::FireNow(State& s, AlertKind kind, uint64_t step,
                           double value, AlertText text,
                           const std::vector<int64_t>& batch_ids) {
  s.event = false;  // Event() marks its own
  AlertEpisode& e = s.episode;
  e = AlertEpisode{.kind = kind,
                   .firing = true,
                   .started_step = step,
                   .started_unix_nanos = now_unix_nanos_,
                   .peak_value = value,
                   .text = std::move(text)};
  e.batch_ids.assign(batch_ids.begin(),
                     batch_ids.begin() + std::min(batch_ids.size(), kMaxBatchIds));
  if (e.text.rank.has_value()) e.rank = *e.text.rank;
  e.severity = e.text.severity;
  s.last_true_step = step;
  held_.push_back(kind);
  if (!deferring_) ReportFires(kind);  // outside a step: at once
}

void AlertTracker::ReportFires(std::optional<AlertKind> only) {
  std::vector<AlertKind> now;
  std::vector<AlertKind> held;
  held.swap(held_);
  for (AlertKind kind : held) {
    if (only.has_value() && kind != *only) {
      held_.push_back(kind);
    } else if (states_[static_cast<size_t>(kind)].episode.firing) {
      now.push_back(kind);
    }
  }
  // Every cause first (all of the step's fires are firing by now), then the
  // reports, then the marks of earlier consequences: no update goes out
  // before its episode's fire.
  for (AlertKind kind : now) {
    AlertEpisode& e = states_[static_cast<size_t>(kind)].episode;
    e.caused_by = CauseOf(kind, e.started_step);
  }
  for (AlertKind kind : now) {
    if (on_transition_) on_transition_(states_[static_cast<size_t>(kind)].episode);
  }
  for (AlertKind kind : now) {
    const AlertEpisode& e = states_[static_cast<size_t>(kind)].episode;
    MarkConsequences(kind, e.text.onset_step > 0 ? e.text.onset_step : e.started_step);
  }
}

namespace {

// How many steps before its cause's onset a consequence may have fired (a
// norm spike shows a step or two before the loss jumps).
constexpr uint64_t kCauseLeadSteps = 8;

}  // namespace

std::optional<AlertKind> AlertTracker::CauseOf(AlertKind kind,
                                               uint64_t step) const {
  for (AlertKind cause : Spec(kind).causes) {
    const State& c = states_[static_cast<size_t>(cause)];
    if (!c.episode.firing) continue;
    // A spike is an event: only one at this step (or the step before, when
    // the layer statistics come with the next record) is a cause.
    if (cause == AlertKind::kGradNormSpike && c.last_true_step + 1 < step) {
      continue;
    }
    return cause;
  }
  return std::nullopt;
}

void AlertTracker::MarkConsequences(AlertKind cause, uint64_t onset_step) {
  const uint64_t from =
      onset_step > kCauseLeadSteps ? onset_step - kCauseLeadSteps : 0;
  for (size_t i = 0; i < kAlertKindCount; ++i) {
    State& s = states_[i];
    const AlertKind kind = static_cast<AlertKind>(i);
    if (!s.episode.firing || s.episode.caused_by.has_value() || kind == cause ||
        s.episode.started_step < from ||
        std::find(held_.begin(), held_.end(), kind) != held_.end()) {  // not reported yet
      continue;
    }
    for (AlertKind c : Spec(kind).causes) {
      if (c != cause) continue;
      s.episode.caused_by = cause;
      s.episode.update = true;
      if (on_transition_) on_transition_(s.episode);
      s.episode.update = false;
      break;
    }
  }
}

void AlertTracker::Condition(AlertKind kind, uint64_t step, bool holds,
                             double value,
                             const std::function<AlertText()>& text) {
  if (!holds || !Enabled(kind)) return;
  State& s = states_[static_cast<size_t>(kind)];
  if (!s.episode.firing) {
    if (!muted_) FireNow(s, kind, step, value, text(), {});
    return;
  }
  s.last_true_step = std::max(step, s.last_true_step);
  if (!muted_ && value > s.episode.peak_value) s.episode.peak_value = value;
}

void AlertTracker::Event(AlertKind kind, uint64_t step, double value,
                         const std::vector<int64_t>& batch_ids,
                         const std::function<AlertText()>& text) {
  if (!Enabled(kind)) return;
  State& s = states_[static_cast<size_t>(kind)];
  if (!s.episode.firing) {
    if (!muted_) FireNow(s, kind, step, value, text(), batch_ids);
    s.event = true;
    return;
  }
  s.last_true_step = step;
  // Replaying history: the stored episode already has this step's numbers.
  if (muted_) return;
  AlertEpisode& e = s.episode;
  if (value > e.peak_value || std::isnan(e.peak_value)) e.peak_value = value;
  for (int64_t id : batch_ids) {
    if (e.batch_ids.size() >= kMaxBatchIds) break;
    e.batch_ids.push_back(id);
  }
}

void AlertTracker::Spike(const SpikeInfo& spike) {
  if (!muted_ && on_spike_) on_spike_(spike);
}

void AlertTracker::Fire(AlertKind kind, uint64_t step, double value,
                        AlertText text) {
  if (!Enabled(kind)) return;
  State& s = states_[static_cast<size_t>(kind)];
  if (!s.episode.firing && !muted_) {
    FireNow(s, kind, step, value, std::move(text), {});
  }
}

void AlertTracker::Resolve(AlertKind kind, uint64_t step) {
  State& s = states_[static_cast<size_t>(kind)];
  if (!s.episode.firing || muted_) return;
  ReportFires(kind);  // a fire held this step goes out before its resolve
  s.episode.firing = false;
  s.episode.resolved_step = step;
  s.episode.resolved_unix_nanos = now_unix_nanos_;
  if (on_transition_) on_transition_(s.episode);
}

void AlertTracker::ResolveAbandoned(uint64_t from, uint64_t last_step) {
  for (size_t i = 0; i < kAlertKindCount; ++i) {
    const auto kind = static_cast<AlertKind>(i);
    const State& s = states_[i];
    if (s.episode.firing && (s.event || Spec(kind).has_restart_plan) &&
        s.episode.started_step >= from) {
      Resolve(kind, last_step);
    }
  }
}

void AlertTracker::EndStep(uint64_t step) {
  deferring_ = false;
  ReportFires();
  ResolveQuiet(step, false);
}

void AlertTracker::EndRanksStep(uint64_t step) {
  deferring_ = false;
  ReportFires();
  ResolveQuiet(step, true);
}

void AlertTracker::ResolveQuiet(uint64_t step, bool across_ranks) {
  if (muted_) return;
  for (size_t i = 0; i < kAlertKindCount; ++i) {
    State& s = states_[i];
    const auto kind = static_cast<AlertKind>(i);
    if (!s.episode.firing || kind == AlertKind::kRunSilent ||
        AcrossRanks(kind) != across_ranks) {
      continue;
    }
    if (step >= s.last_true_step + config_.resolve_after_steps) {
      Resolve(kind, step);
    }
  }
}

void AlertTracker::Amend(AlertKind kind, AlertText text, v1::Severity severity) {
  State& s = states_[static_cast<size_t>(kind)];
  if (!s.episode.firing || muted_) return;
  ReportFires(kind);
  s.episode.text = std::move(text);
  if (severity != v1::SEVERITY_UNSPECIFIED) s.episode.severity = severity;
  // The same episode again, not a new fire (found by ingest_fuzzer: it was
  // reported as one, and the router counted the alert as fired twice).
  s.episode.update = true;
  if (on_transition_) on_transition_(s.episode);
  s.episode.update = false;
}

std::optional<v1::Severity> AlertTracker::FiringSeverity(AlertKind kind) const {
  const AlertEpisode& e = states_[static_cast<size_t>(kind)].episode;
  if (!e.firing) return std::nullopt;
  return e.severity != v1::SEVERITY_UNSPECIFIED ? e.severity : Spec(kind).severity;
}

void AlertTracker::Restore(const AlertEpisode& episode) {
  State& s = states_[static_cast<size_t>(episode.kind)];
  s.episode = episode;
  s.episode.firing = true;
  s.last_true_step = episode.started_step;
}

int AlertTracker::active_count() const {
  int n = 0;
  for (const State& s : states_) n += s.episode.firing ? 1 : 0;
  return n;
}

}  // namespace trainwatch
