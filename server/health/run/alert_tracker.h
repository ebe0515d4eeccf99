// The alert lifecycle of one run: turns what detectors report into fire and
// resolve transitions (docs/detectors.md). A windowed alert fires on the first step
// its condition holds and resolves once the condition has been false for
// resolve_after_steps; an event alert fires once per episode and resolves
// after resolve_after_steps without another event.
//
// Not thread-safe: owned by the run's shard.
#ifndef TRAINWATCH_SERVER_HEALTH_RUN_ALERT_TRACKER_H_
#define TRAINWATCH_SERVER_HEALTH_RUN_ALERT_TRACKER_H_

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "health/detector.h"

namespace trainwatch {

// One alert episode, as stored and exported.
struct AlertEpisode {
  AlertKind kind = AlertKind::kClipFractionHigh;
  bool firing = false;
  uint64_t started_step = 0;
  uint64_t resolved_step = 0;  // when !firing
  int64_t started_unix_nanos = 0;
  int64_t resolved_unix_nanos = 0;
  double peak_value = 0.0;
  AlertText text;  // text.onset_step: the change-point estimate, 0: none
  std::vector<int64_t> batch_ids;
  uint32_t rank = 0;
  // The alert this one is a consequence of at the same steps (docs/detectors.md).
  std::optional<AlertKind> caused_by;
  // Set on a report of an episode already firing: its caused_by was just
  // found (its cause fired a few steps after it), or Amend rewrote its text
  // and severity. Not a new fire.
  bool update = false;
  v1::Severity severity = v1::SEVERITY_UNSPECIFIED;  // unspecified: the catalog's
};

class AlertTracker final : public AlertSink {
 public:
  // Called on every fire and resolve (and not while replaying history).
  using Listener = std::function<void(const AlertEpisode&)>;
  using SpikeListener = std::function<void(const SpikeInfo&)>;

  AlertTracker(const HealthConfig& config, Listener on_transition,
               SpikeListener on_spike);

  // The time stamped on the transitions that follow (of the lead step, or
  // of the cross-rank steps, being processed).
  void SetNow(int64_t now_unix_nanos) { now_unix_nanos_ = now_unix_nanos; }
  // Opens a step's judging: the alerts that fire until EndStep() or
  // EndRanksStep() are reported there, after every detector ran, each with
  // its caused_by found among all that fire at the step (whatever order the
  // detectors ran in). Fires outside it are reported at once.
  void BeginStep() { deferring_ = true; }
  // Reports the step's fires, then resolves the lead's alerts whose
  // condition has been false long enough.
  void EndStep(uint64_t step);
  // The same for the cross-rank alerts, which count steps of their own: the
  // steps judged across ranks (RankProgress), which may trail the lead's or
  // run ahead of them, depending on the order the ranks arrive in.
  void EndRanksStep(uint64_t step);
  // Alerts judged across ranks, on steps of their own (EndRanksStep).
  static bool AcrossRanks(AlertKind kind);

  void Condition(AlertKind kind, uint64_t step, bool holds, double value,
                 const std::function<AlertText()>& text) override;
  void Event(AlertKind kind, uint64_t step, double value,
             const std::vector<int64_t>& batch_ids,
             const std::function<AlertText()>& text) override;
  void Spike(const SpikeInfo& spike) override;

  // Fires or resolves `kind` directly (RunSilent, which is about time; the
  // pipeline's restart-loop verdicts and lifecycle).
  void Fire(AlertKind kind, uint64_t step, double value, AlertText text) override;
  void Resolve(AlertKind kind, uint64_t step) override;
  // The run restarted from a checkpoint at `from`: the events (spikes,
  // non-finite updates) and the alerts with a restart plan that started at
  // or after it belong to the abandoned steps and resolve (at `last_step`,
  // the last step before the restart), so a fault that comes back in the
  // replayed steps is an alert of its own (the closed loop's next rung).
  // A windowed condition stays: the replay judges it as it goes on.
  void ResolveAbandoned(uint64_t from, uint64_t last_step);

  // Rewrites a firing alert's text (and raises its severity when `severity`
  // is not empty) and tells the listener, as an update: what a spike's
  // recurrence learned.
  void Amend(AlertKind kind, AlertText text, v1::Severity severity) override;
  std::optional<v1::Severity> FiringSeverity(AlertKind kind) const override;

  // Marks an alert as firing without telling the listener: its fire was
  // stored before a server restart and must not be sent again.
  void Restore(const AlertEpisode& episode);

  // While muted (rebuilding windows from history) nothing reaches the
  // listeners and nothing fires.
  void set_muted(bool muted) { muted_ = muted; }

  const AlertEpisode& episode(AlertKind kind) const {
    return states_[static_cast<size_t>(kind)].episode;
  }
  bool firing(AlertKind kind) const { return episode(kind).firing; }
  int active_count() const;

  // Batch ids kept per episode, at most.
  static constexpr size_t kMaxBatchIds = 256;

 private:
  struct State {
    AlertEpisode episode;
    uint64_t last_true_step = 0;
    bool event = false;  // the episode was fired by Event()
  };
  bool Enabled(AlertKind kind) const;
  // The alert firing now that `kind`, firing at `step`, is a consequence of.
  std::optional<AlertKind> CauseOf(AlertKind kind, uint64_t step) const;
  // `cause` fired at `step`: the consequences that fired at its steps just
  // before it (a norm spike a step or two before the loss follows) get
  // caused_by and are reported again.
  void MarkConsequences(AlertKind cause, uint64_t onset_step);
  void FireNow(State& s, AlertKind kind, uint64_t step, double value,
               AlertText text, const std::vector<int64_t>& batch_ids);

  const HealthConfig& config_;
  Listener on_transition_;
  SpikeListener on_spike_;
  std::array<State, kAlertKindCount> states_;
  void ResolveQuiet(uint64_t step, bool across_ranks);
  // Reports the fires held since BeginStep() (all of them, or `only`).
  void ReportFires(std::optional<AlertKind> only = std::nullopt);

  int64_t now_unix_nanos_ = 0;
  bool muted_ = false;
  bool deferring_ = false;
  std::vector<AlertKind> held_;  // fired since BeginStep(), not yet reported
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_RUN_ALERT_TRACKER_H_
