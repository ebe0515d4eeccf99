#include "engine/alert_router.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "health/alert_catalog.h"
#include "health/run/convert.h"
#include "trainwatch/v1/alert_names.h"

namespace trainwatch {

AlertRouter::AlertRouter(std::string run_id, Store* store, Metrics* metrics,
                         RunMetrics* run_metrics, Notifier* notifier,
                         HostWatch* hosts, ClosedLoop* closed_loop)
    : run_id_(std::move(run_id)),
      store_(store),
      exporter_(metrics, run_metrics),
      notifier_(notifier),
      hosts_(hosts),
      closed_loop_(closed_loop != nullptr &&
                           closed_loop->config().mode != ClosedLoopConfig::Mode::kOff
                       ? closed_loop
                       : nullptr) {}

void AlertRouter::SetLabels(const v1::RunStart& lead) {
  labels_ = lead.labels();
  lead_attempt_ = lead.attempt();  // also on recovery, before Restore()
}

v1::Alert AlertRouter::Labelled(const v1::Alert& alert) const {
  v1::Alert out = alert;
  *out.mutable_run_labels() = labels_;
  return out;
}

void AlertRouter::Route(v1::Alert alert) {
  // Only enqueues: the notifier's threads do the network.
  if (notifier_ != nullptr) notifier_->Notify(Labelled(alert));
  store_->Submit(WriteOp{.key = {alert.run(), 0, 0},
                         .body = WriteOp::Alert{std::move(alert)}});
}

void AlertRouter::Restore(const v1::Alert& firing) {
  if (std::optional<AlertKind> kind = AlertKindByName(firing.alertname())) {
    exporter_.SetActive(*kind, /*firing=*/true, /*fired=*/false);
    // Resolved by the next attempt after the one the restart found.
    if (*kind == AlertKind::kClosedLoopExhausted) exhausted_ = ExhaustedEpisode{firing, lead_attempt_};
  }
  if (notifier_ != nullptr) notifier_->Restore(Labelled(firing));
}

void AlertRouter::OnAlert(AlertKind kind, const v1::Alert& alert, bool update) {
  const size_t i = static_cast<size_t>(kind);
  const bool firing = v1::Firing(alert);
  exporter_.SetActive(kind, firing, /*fired=*/firing && !update);
  std::optional<v1::Alert> suspect;
  if (firing && !update && hosts_ != nullptr &&
      incident_counted_[i] != alert.started_step()) {
    incident_counted_[i] = alert.started_step();
    suspect = hosts_->OnAlertFired(kind, alert);
  }
  auto note = std::find_if(directive_notes_.begin(), directive_notes_.end(),
                           [kind](const DirectiveNote& n) { return n.kind == kind; });
  std::optional<v1::Alert> exhausted;
  if (firing && !update && closed_loop_ != nullptr) {
    std::optional<ClosedLoop::Answer> proposed =
        closed_loop_->OnAlertFired(alert, lead_attempt_, recent_batches_);
    if (proposed.has_value()) {
      if (note == directive_notes_.end()) {
        note = directive_notes_.insert(note, DirectiveNote{.kind = kind});
      }
      note->started_step = alert.started_step();
      note->text = proposed->note;
      if (proposed->exhausted) exhausted = Exhausted(alert, proposed->reason);
    }
  }
  if (note != directive_notes_.end() && note->started_step == alert.started_step()) {
    v1::Alert named = alert;
    named.set_description(absl::StrCat(alert.description(), " ", note->text));
    Route(std::move(named));
  } else {
    Route(alert);
  }
  if (suspect.has_value()) Route(*std::move(suspect));
  if (exhausted.has_value()) Route(*std::move(exhausted));
}

std::optional<v1::Alert> AlertRouter::Exhausted(const v1::Alert& cause,
                                                const std::string& reason) {
  if (exhausted_.has_value()) return std::nullopt;  // firing already
  const AlertEpisode episode{
      .kind = AlertKind::kClosedLoopExhausted,
      .firing = true,
      .started_step = cause.started_step(),
      .started_unix_nanos = cause.started_unix_nanos(),
      .peak_value = 1,
      .text = {.summary = absl::StrCat("Closed loop exhausted on run ", run_id_),
               .description = absl::StrCat(
                   reason, " Stop proposed: trainwatchctl directives --run ", run_id_, "."),
               .onset_step = cause.onset_step(),
               .host = cause.host()},
      .caused_by = AlertKindByName(cause.alertname())};
  v1::Alert a = ToProto(run_id_, episode);
  exhausted_ = ExhaustedEpisode{a, lead_attempt_};
  exporter_.SetActive(AlertKind::kClosedLoopExhausted, true, /*fired=*/true);
  return a;
}

void AlertRouter::OnSpikeOutcome(const SpikeOutcome& o) {
  v1::Spike spike;
  spike.set_step(o.spike_step);
  spike.set_outcome(o.outcome());
  spike.set_batches_skipped(o.batches_skipped);
  store_->Submit(WriteOp{.key = {run_id_, 0, 0},
                         .body = WriteOp::SpikeOutcome{std::move(spike)}});
}

void AlertRouter::OnSpike(const SpikeInfo& s) {
  if (s.kind == SpikeInfo::Kind::kHardBatch) {
    v1::HardBatch h;
    h.set_step(s.step);
    h.set_high_steps(s.high_steps);
    h.set_peak(s.loss_peak);
    h.set_level(s.loss_level);
    h.set_peak_is_ratio(s.peak_is_ratio);
    h.mutable_batch_ids()->Add(s.batch_ids.begin(), s.batch_ids.end());
    store_->Submit(WriteOp{.key = {run_id_, 0, 0},
                           .body = WriteOp::HardBatch{std::move(h)}});
    return;
  }
  v1::Spike spike;
  spike.set_step(s.step);
  spike.set_grad_norm(s.grad_norm);
  spike.set_ratio_to_ema(s.ratio_to_ema);
  spike.set_sigmas(s.sigmas);
  spike.mutable_batch_ids()->Add(s.batch_ids.begin(), s.batch_ids.end());
  store_->Submit(WriteOp{.key = {run_id_, 0, 0},
                         .body = WriteOp::Spike{std::move(spike)}});
}

void AlertRouter::OnLeadChanged(const v1::RunStart& start) {
  SetLabels(start);
  if (exhausted_.has_value() && start.attempt() > exhausted_->attempt) {
    // A person relaunched the run: the exhausted loop is theirs now.
    v1::Alert resolved = exhausted_->alert;
    resolved.set_state(v1::ALERT_STATE_RESOLVED);
    resolved.set_resolved_unix_nanos(absl::GetCurrentTimeNanos());
    exhausted_.reset();
    exporter_.SetActive(AlertKind::kClosedLoopExhausted, false, false);
    Route(std::move(resolved));
  }
  exporter_.OnLeadChanged(start);
}

void AlertRouter::OnLeadRecord(const v1::StepRecord& r) {
  if (closed_loop_ != nullptr) recent_batches_.Add(r.step(), r.batch_ids());
  exporter_.OnLeadRecord(r);
}

void AlertRouter::OnRecordsAccepted(size_t fresh, uint64_t client_dropped) {
  exporter_.OnRecordsAccepted(fresh, client_dropped);
}

void AlertRouter::OnLeadBatchDone(const v1::StepRecord& last, int64_t now_unix_nanos) {
  exporter_.OnLeadBatchDone(last, now_unix_nanos);
}

void AlertRouter::OnWindows(const RunHealth& h) { exporter_.OnWindows(h); }

}  // namespace trainwatch
