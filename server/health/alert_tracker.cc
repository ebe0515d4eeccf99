#include "health/alert_tracker.h"

#include <algorithm>
#include <cmath>

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

void AlertTracker::BeginStep(uint64_t step, int64_t now_unix_nanos) {
  now_unix_nanos_ = now_unix_nanos;
}

void AlertTracker::FireNow(State& s, AlertKind kind, uint64_t step,
                           double value, AlertText text,
                           const std::vector<int64_t>& batch_ids) {
  AlertEpisode& e = s.episode;
  e = AlertEpisode{.kind = kind,
                   .firing = true,
                   .started_step = step,
                   .started_unix_nanos = now_unix_nanos_,
                   .peak_value = value,
                   .text = std::move(text)};
  e.batch_ids.assign(batch_ids.begin(),
                     batch_ids.begin() + std::min(batch_ids.size(), kMaxBatchIds));
  s.last_true_step = step;
  if (on_transition_) on_transition_(e);
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
  s.last_true_step = step;
  if (!muted_ && value > s.episode.peak_value) s.episode.peak_value = value;
}

void AlertTracker::Event(AlertKind kind, uint64_t step, double value,
                         const std::vector<int64_t>& batch_ids,
                         const std::function<AlertText()>& text) {
  if (!Enabled(kind)) return;
  State& s = states_[static_cast<size_t>(kind)];
  if (!s.episode.firing) {
    if (!muted_) FireNow(s, kind, step, value, text(), batch_ids);
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
  s.episode.firing = false;
  s.episode.resolved_step = step;
  s.episode.resolved_unix_nanos = now_unix_nanos_;
  if (on_transition_) on_transition_(s.episode);
}

void AlertTracker::EndStep(uint64_t step) {
  if (muted_) return;
  for (size_t i = 0; i < kAlertKindCount; ++i) {
    State& s = states_[i];
    if (!s.episode.firing || i == static_cast<size_t>(AlertKind::kRunSilent)) {
      continue;
    }
    if (step >= s.last_true_step + config_.resolve_after_steps) {
      Resolve(static_cast<AlertKind>(i), step);
    }
  }
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
