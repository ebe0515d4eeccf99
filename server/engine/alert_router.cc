#include "engine/alert_router.h"

#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "health/alert_catalog.h"
#include "health/run/convert.h"
#include "health/signals/moe_load.h"
#include "trainwatch/v1/alert_names.h"
#include "trainwatch/v1/fp8_format.h"

namespace trainwatch {

AlertRouter::AlertRouter(std::string run_id, Store* store, Metrics* metrics,
                         RunMetrics* run_metrics, Notifier* notifier,
                         HostWatch* hosts, ClosedLoop* closed_loop)
    : run_id_(std::move(run_id)),
      store_(store),
      metrics_(metrics),
      run_metrics_(run_metrics),
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
    SetActive(*kind, /*firing=*/true, /*fired=*/false);
    // Resolved by the next attempt after the one the restart found.
    if (*kind == AlertKind::kClosedLoopExhausted) exhausted_ = ExhaustedEpisode{firing, lead_attempt_};
  }
  if (notifier_ != nullptr) notifier_->Restore(Labelled(firing));
}

void AlertRouter::OnAlert(AlertKind kind, const v1::Alert& alert, bool update) {
  const size_t i = static_cast<size_t>(kind);
  const bool firing = v1::Firing(alert);
  SetActive(kind, firing, /*fired=*/firing && !update);
  std::optional<v1::Alert> suspect;
  if (firing && !update && hosts_ != nullptr &&
      incident_counted_[i] != alert.started_step()) {
    incident_counted_[i] = alert.started_step();
    suspect = hosts_->OnAlertFired(kind, alert);
  }
  std::optional<std::pair<uint64_t, std::string>>& note = directive_notes_[i];
  std::optional<v1::Alert> exhausted;
  if (firing && !update && closed_loop_ != nullptr) {
    std::optional<ClosedLoop::Answer> proposed =
        closed_loop_->OnAlertFired(alert, lead_attempt_, recent_batches_);
    if (proposed.has_value()) {
      note.emplace(alert.started_step(), proposed->note);
      if (proposed->exhausted) exhausted = Exhausted(alert, proposed->reason);
    }
  }
  if (note.has_value() && note->first == alert.started_step()) {
    v1::Alert named = alert;
    named.set_description(absl::StrCat(alert.description(), " ", note->second));
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
  SetActive(AlertKind::kClosedLoopExhausted, true, /*fired=*/true);
  return a;
}

void AlertRouter::SetActive(AlertKind kind, bool firing, bool fired) {
  if (run_metrics_ == nullptr) return;
  const size_t i = static_cast<size_t>(kind);
  run_metrics_->alert_active[i].Set(firing ? 1 : 0);
  if (fired) run_metrics_->alerts_fired[i].Get().Increment();
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
    SetActive(AlertKind::kClosedLoopExhausted, false, false);
    Route(std::move(resolved));
  }
  if (start.max_norm() > 0) run_metrics_->clip_threshold.Set(start.max_norm());
}

void AlertRouter::OnLeadRecord(const v1::StepRecord& r) {
  if (closed_loop_ != nullptr) recent_batches_.Add(r.step(), r.batch_ids());
  RunMetrics& m = *run_metrics_;
  m.steps.Increment();
  // A skipped step applied no update, so nothing was clipped.
  if (r.clipped() && !r.skipped()) m.clipped_steps.Increment();
  if (r.skipped()) m.skipped_steps.Increment();
  if (!std::isfinite(r.grad_norm()) || (r.has_loss() && !std::isfinite(r.loss()))) {
    m.nonfinite_steps.Increment();
  }
  // Optional fields keep the last value reported, not the last record's.
  if (r.has_clip_coef()) m.clip_coefficient.Set(r.clip_coef());
  if (r.has_loss_scale()) m.loss_scale.Set(r.loss_scale());
  if (r.has_max_attn_logit()) m.max_attention_logit.Set(r.max_attn_logit());
  if (r.has_log_z()) m.log_z.Set(r.log_z());
  if (r.has_loss()) m.loss.Set(r.loss());
  if (r.has_lr()) m.learning_rate.Set(r.lr());
  if (!r.fp8().empty()) SetFp8Worst(r, m);
  if (r.has_moe() && !r.moe().layers().empty()) {
    const MoeReportSummary moe = Summarize(r.moe());
    if (moe.load_max_over_mean) m.moe_load_max_over_mean.Set(*moe.load_max_over_mean);
    if (moe.dead_experts) m.moe_dead_experts.Set(*moe.dead_experts);
    if (moe.dropped_fraction) m.moe_dropped_fraction.Set(*moe.dropped_fraction);
    if (moe.aux_loss) m.moe_aux_loss.Set(*moe.aux_loss);
    if (moe.router_z_loss) m.moe_router_z_loss.Set(*moe.router_z_loss);
  }
}

void AlertRouter::SetFp8Worst(const v1::StepRecord& r, RunMetrics& m) {
  // The worst tensor of the report; a share no tensor reported stays unset.
  std::optional<double> over, under, scaled;
  const auto take = [](std::optional<double>& worst, double v) {
    if (std::isnan(v)) return;
    if (!worst.has_value() || v > *worst) worst = v;
  };
  for (const auto& [name, f] : r.fp8()) {
    if (f.has_overflow_fraction()) take(over, f.overflow_fraction());
    if (f.has_underflow_fraction()) take(under, f.underflow_fraction());
    if (const std::optional<double> s = v1::ScaledAmax(f)) take(scaled, *s);
  }
  if (over) m.fp8_overflow_fraction.Set(*over);
  if (under) m.fp8_underflow_fraction.Set(*under);
  if (scaled) m.fp8_scaled_amax_ratio.Set(*scaled);
}

void AlertRouter::OnRecordsAccepted(size_t fresh, uint64_t client_dropped) {
  if (client_dropped > 0) {
    run_metrics_->client_dropped_steps.Increment(static_cast<double>(client_dropped));
  }
  metrics_->ingest_records.Increment(static_cast<double>(fresh));
}

void AlertRouter::OnLeadBatchDone(const v1::StepRecord& last,
                                  int64_t now_unix_nanos) {
  RunMetrics& m = *run_metrics_;
  m.last_step.Set(static_cast<double>(last.step()));
  const int64_t t =
      last.time_unix_nanos() != 0 ? last.time_unix_nanos() : now_unix_nanos;
  m.last_step_timestamp.Set(static_cast<double>(t) * 1e-9);
  m.grad_norm.Set(last.grad_norm());
}

void AlertRouter::OnWindows(const RunHealth& h) {
  RunMetrics& m = *run_metrics_;
  const RunWindow& w = h.window();
  // The norm's quantiles are selections over the window (~3 us each at
  // W = 1,000): after every batch of a bulk sender; for one that sends a few
  // records at a time, once ~3% of the window's norms are new (31 at
  // W = 1,000, at every batch while the window holds under 32).
  const uint64_t pushes = w.grad_norm.pushes();
  const uint64_t every = w.grad_norm.ranked() / 32;
  if (!quantiles_at_.has_value() || pushes < *quantiles_at_ ||
      pushes - *quantiles_at_ >= every) {
    quantiles_at_ = pushes;
    if (w.grad_norm.ranked() > 0) {
      m.grad_norm_p50.Set(*w.grad_norm.Quantile(0.50));
      m.grad_norm_p90.Set(*w.grad_norm.Quantile(0.90));
      m.grad_norm_p99.Set(*w.grad_norm.Quantile(0.99));
    }
    if (std::optional<double> rec = h.RecommendedMaxNorm()) {
      m.recommended_clip_threshold.Set(*rec);
    }
  }
  if (w.clipped.size() > 0) m.clip_fraction.Set(w.clipped.fraction());
  if (w.skipped.size() > 0) m.skip_fraction.Set(w.skipped.fraction());
  const RunTiming& t = h.timing();
  if (t.step_times().ready()) {
    m.step_seconds_median.Set(t.step_times().median_seconds());
    m.step_seconds_max.Set(t.step_times().max_seconds());
    m.straggler_lost_fraction.Set(t.step_times().lost_fraction());
  }
  if (t.has_input_waits()) m.data_wait_fraction.Set(t.StallFraction());
  const GoodputTotals g = t.goodput();
  if (g.wall_seconds > 0) m.goodput_ratio.Set(g.ratio);
  if (g.skipped_steps > exported_skipped_) {
    m.lost_steps_skipped.Get().Increment(
        static_cast<double>(g.skipped_steps - exported_skipped_));
    exported_skipped_ = g.skipped_steps;
  }
  if (g.rewound_steps > exported_rewound_) {
    m.lost_steps_rewound.Get().Increment(
        static_cast<double>(g.rewound_steps - exported_rewound_));
    exported_rewound_ = g.rewound_steps;
  }
}

}  // namespace trainwatch
