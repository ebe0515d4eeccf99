#include "metrics/run_exporter.h"

#include <cmath>
#include <optional>

#include "health/signals/moe_load.h"
#include "trainwatch/v1/fp8_format.h"

namespace trainwatch {

void RunExporter::OnLeadChanged(const v1::RunStart& start) {
  if (start.max_norm() > 0) run_metrics_->clip_threshold.Set(start.max_norm());
}

void RunExporter::OnLeadRecord(const v1::StepRecord& r) {
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
  // The batch's last MoE report is summarized once the batch is done: a
  // summary reads every count, and only the last one is left in the gauges.
  if (r.has_moe() && !r.moe().layers().empty()) last_moe_ = &r.moe();
}

void RunExporter::SetMoeWorst(const v1::MoeStats& report, RunMetrics& m) {
  const MoeReportSummary moe = Summarize(report);
  if (moe.load_max_over_mean) m.moe_load_max_over_mean.Set(*moe.load_max_over_mean);
  if (moe.dead_experts) m.moe_dead_experts.Set(*moe.dead_experts);
  if (moe.dropped_fraction) m.moe_dropped_fraction.Set(*moe.dropped_fraction);
  if (moe.aux_loss) m.moe_aux_loss.Set(*moe.aux_loss);
  if (moe.router_z_loss) m.moe_router_z_loss.Set(*moe.router_z_loss);
}

void RunExporter::SetFp8Worst(const v1::StepRecord& r, RunMetrics& m) {
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

void RunExporter::OnRecordsAccepted(size_t fresh, uint64_t client_dropped) {
  if (client_dropped > 0) {
    run_metrics_->client_dropped_steps.Increment(static_cast<double>(client_dropped));
  }
  metrics_->ingest_records.Increment(static_cast<double>(fresh));
}

void RunExporter::OnLeadBatchDone(const v1::StepRecord& last,
                                  int64_t now_unix_nanos) {
  RunMetrics& m = *run_metrics_;
  m.last_step.Set(static_cast<double>(last.step()));
  const int64_t t =
      last.time_unix_nanos() != 0 ? last.time_unix_nanos() : now_unix_nanos;
  m.last_step_timestamp.Set(static_cast<double>(t) * 1e-9);
  m.grad_norm.Set(last.grad_norm());
  if (last_moe_ != nullptr) SetMoeWorst(*last_moe_, m);
  last_moe_ = nullptr;
}

void RunExporter::OnWindows(const RunHealth& h) {
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
  if (const BaselineStatus& b = h.baseline_status(); b.judged) {
    m.baseline_loss_ratio.Set(b.ratio);
    m.baseline_band_lower.Set(b.lower);
    m.baseline_band_upper.Set(b.upper);
  } else {  // none judged yet, or no longer (a rewind, or no references now)
    m.baseline_loss_ratio.Remove();
    m.baseline_band_lower.Remove();
    m.baseline_band_upper.Remove();
  }
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

void RunExporter::SetActive(AlertKind kind, bool firing, bool fired) {
  if (run_metrics_ == nullptr) return;
  const size_t i = static_cast<size_t>(kind);
  run_metrics_->alert_active[i].Set(firing ? 1 : 0);
  if (fired) run_metrics_->alerts_fired[i].Get().Increment();
}

}  // namespace trainwatch
