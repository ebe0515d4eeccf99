#include "metrics/metrics.h"

#include <prometheus/text_serializer.h>

#include <exception>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace trainwatch {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

prometheus::Family<prometheus::Counter>& Counter(prometheus::Registry& r,
                                                 const char* name,
                                                 const char* help) {
  return BuildCounter().Name(name).Help(help).Register(r);
}
prometheus::Family<prometheus::Gauge>& Gauge(prometheus::Registry& r,
                                             const char* name,
                                             const char* help) {
  return BuildGauge().Name(name).Help(help).Register(r);
}

}  // namespace

namespace {
prometheus::Labels RunLabel(const std::string& run_id) {
  return {{"run", run_id}};
}
}  // namespace


RunMetrics::RunMetrics(
    Metrics& m, const std::string& run_id,
    const std::vector<std::pair<std::string, std::string>>& alerts)
    : run_id_(run_id),
      alerts_(alerts),
      counters_{m.steps_total.Add(RunLabel(run_id_)),
                m.clipped_steps_total.Add(RunLabel(run_id_)),
                m.skipped_steps_total.Add(RunLabel(run_id_)),
                m.nonfinite_steps_total.Add(RunLabel(run_id_)),
                m.client_dropped_steps_total.Add(RunLabel(run_id_))},
      gauges_{m.last_step.Add(RunLabel(run_id_)),
              m.last_step_timestamp_seconds.Add(RunLabel(run_id_)),
              m.run_finished.Add(RunLabel(run_id_))},
      steps(counters_[0]->metric),
      clipped_steps(counters_[1]->metric),
      skipped_steps(counters_[2]->metric),
      nonfinite_steps(counters_[3]->metric),
      client_dropped_steps(counters_[4]->metric),
      last_step(gauges_[0]->metric),
      last_step_timestamp(gauges_[1]->metric),
      finished(gauges_[2]->metric),
      grad_norm(&m.grad_norm, run_id_),
      clip_coefficient(&m.clip_coefficient, run_id_),
      clip_threshold(&m.clip_threshold, run_id_),
      loss_scale(&m.loss_scale, run_id_),
      max_attention_logit(&m.max_attention_logit, run_id_),
      log_z(&m.log_z, run_id_),
      loss(&m.loss, run_id_),
      learning_rate(&m.learning_rate, run_id_),
      grad_norm_p50(&m.grad_norm_window, run_id_, "percentile", "50"),
      grad_norm_p90(&m.grad_norm_window, run_id_, "percentile", "90"),
      grad_norm_p99(&m.grad_norm_window, run_id_, "percentile", "99"),
      clip_fraction(&m.clip_fraction, run_id_),
      skip_fraction(&m.skip_fraction, run_id_),
      recommended_clip_threshold(&m.recommended_clip_threshold, run_id_),
      step_seconds_median(&m.step_seconds, run_id_, "stat", "median"),
      step_seconds_max(&m.step_seconds, run_id_, "stat", "max"),
      straggler_lost_fraction(&m.straggler_lost_fraction, run_id_),
      data_wait_fraction(&m.data_wait_fraction, run_id_),
      goodput_ratio(&m.goodput_ratio, run_id_),
      baseline_loss_ratio(&m.baseline_loss_ratio, run_id_, "bound", "value"),
      baseline_band_lower(&m.baseline_loss_ratio, run_id_, "bound", "lower"),
      baseline_band_upper(&m.baseline_loss_ratio, run_id_, "bound", "upper"),
      lost_steps_skipped(&m.lost_steps_total, run_id_, "cause", "skipped"),
      lost_steps_rewound(&m.lost_steps_total, run_id_, "cause", "rewound"),
      fp8_overflow_fraction(&m.fp8_overflow_fraction, run_id_),
      fp8_underflow_fraction(&m.fp8_underflow_fraction, run_id_),
      fp8_scaled_amax_ratio(&m.fp8_scaled_amax_ratio, run_id_),
      moe_load_max_over_mean(&m.moe_load_max_over_mean, run_id_),
      moe_dead_experts(&m.moe_dead_experts, run_id_),
      moe_dropped_fraction(&m.moe_dropped_fraction, run_id_),
      moe_aux_loss(&m.moe_aux_loss, run_id_),
      moe_router_z_loss(&m.moe_router_z_loss, run_id_),
      metrics_(m) {
  alerts_fired.reserve(alerts_.size());
  alert_active.reserve(alerts_.size());
  for (const auto& [name, severity] : alerts_) {
    alerts_fired.emplace_back(&m.alerts_fired_total, run_id_, "alertname",
                              name);
    alert_active.emplace_back(&m.alert_active, run_id_, "alertname", name,
                              "severity", severity);
  }
}

RunMetrics::~RunMetrics() {
  RunFamily<RunCounter>* counter_families[] = {
      &metrics_.steps_total, &metrics_.clipped_steps_total,
      &metrics_.skipped_steps_total, &metrics_.nonfinite_steps_total,
      &metrics_.client_dropped_steps_total};
  for (size_t i = 0; i < counters_.size(); ++i) {
    counter_families[i]->Remove(counters_[i]);
  }
  RunFamily<RunGauge>* gauge_families[] = {
      &metrics_.last_step, &metrics_.last_step_timestamp_seconds,
      &metrics_.run_finished};
  for (size_t i = 0; i < gauges_.size(); ++i) {
    gauge_families[i]->Remove(gauges_[i]);
  }
  for (LazyGauge* g :
       {&grad_norm, &clip_coefficient, &clip_threshold, &loss_scale,
        &max_attention_logit, &log_z, &loss, &learning_rate, &grad_norm_p50,
        &grad_norm_p90, &grad_norm_p99, &clip_fraction, &skip_fraction,
        &recommended_clip_threshold, &step_seconds_median, &step_seconds_max,
        &straggler_lost_fraction, &data_wait_fraction, &goodput_ratio,
        &baseline_loss_ratio, &baseline_band_lower, &baseline_band_upper,
        &fp8_overflow_fraction, &fp8_underflow_fraction, &fp8_scaled_amax_ratio,
        &moe_load_max_over_mean, &moe_dead_experts, &moe_dropped_fraction,
        &moe_aux_loss, &moe_router_z_loss}) {
    g->Remove();
  }
  lost_steps_skipped.Remove();
  lost_steps_rewound.Remove();
  for (LazyGauge& g : alert_active) g.Remove();
  for (LazyCounter& c : alerts_fired) c.Remove();
}

Metrics::Metrics(std::shared_ptr<prometheus::Registry> registry)
    : registry_(std::move(registry)),
      ingest_records(
          Counter(*registry_, "trainwatch_ingest_records_total",
                  "Step records received and accepted (all runs, all ranks).")
              .Add({})),
      ingest_rejected(Counter(*registry_, "trainwatch_ingest_rejected_total",
                              "Messages refused, by reason.")),
      streams_active(
          Gauge(*registry_, "trainwatch_streams_active", "Open Report streams.")
              .Add({})),
      runs_active(Gauge(*registry_, "trainwatch_runs_active",
                        "Runs known to the engine that have not finished.")
                      .Add({})),
      store_queue_depth(Gauge(*registry_, "trainwatch_store_queue_depth",
                              "Write ops waiting for the store writer.")
                            .Add({})),
      store_commit_seconds(BuildHistogram()
                               .Name("trainwatch_store_commit_seconds")
                               .Help("Duration of one store transaction.")
                               .Register(*registry_)
                               .Add({},
                                    prometheus::Histogram::BucketBoundaries{
                                        0.0005, 0.001, 0.0025, 0.005, 0.01,
                                        0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5})),
      store_errors(Counter(*registry_, "trainwatch_store_errors_total",
                           "Store transaction attempts that failed (nothing "
                           "of them was acknowledged; each retry during a "
                           "storage fault counts).")
                       .Add({})),
      store_failing(Gauge(*registry_, "trainwatch_store_failing",
                          "1 while the store cannot write (disk full, "
                          "database locked, I/O error) and retries: nothing "
                          "is acknowledged and clients buffer.")
                        .Add({})),
      notifications_sent_total(
          Counter(*registry_, "trainwatch_notifications_sent_total",
                  "Alert notifications delivered (each alert of an "
                  "Alertmanager post counts, re-sends included).")),
      notification_failures_total(
          Counter(*registry_, "trainwatch_notification_failures_total",
                  "Notification posts that failed (each retry counts).")),
      host_incidents_total(
          Counter(*registry_, "trainwatch_host_incidents_total",
                  "Alerts (NonFiniteUpdate, LossSpike, RankStraggler) that "
                  "named a host, by host and alertname.")),
      notifications_dropped_total(
          Counter(*registry_, "trainwatch_notifications_dropped_total",
                  "Alert notifications lost: the receiver's queue was full, "
                  "every retry failed, or the receiver refused them.")),
      directives_total(
          Counter(*registry_, "trainwatch_directives_total",
                  "Closed-loop directives that entered a state, by action "
                  "and state (docs/closed-loop.md).")),
      steps_total("trainwatch_steps_total",
                  "Optimizer steps recorded (lead rank)."),
      clipped_steps_total("trainwatch_clipped_steps_total",
                          "Steps on which gradient clipping fired."),
      skipped_steps_total("trainwatch_skipped_steps_total",
                          "Optimizer steps skipped (inf/NaN found)."),
      nonfinite_steps_total("trainwatch_nonfinite_steps_total",
                            "Steps with a NaN or Inf gradient norm or loss."),
      client_dropped_steps_total(
          "trainwatch_client_dropped_steps_total",
          "Steps the client dropped (buffer full) and reported."),
      last_step("trainwatch_last_step", "Last optimizer step seen."),
      last_step_timestamp_seconds(
          "trainwatch_last_step_timestamp_seconds",
          "When the last step finished on the trainer (Unix seconds)."),
      run_finished("trainwatch_run_finished",
                   "1 once the run reported RUN_FINISHED or RUN_FAILED (its "
                   "series go after finished_runs.retention_seconds)."),
      grad_norm("trainwatch_grad_norm",
                "Pre-clip global gradient norm of the last step."),
      clip_coefficient("trainwatch_clip_coefficient",
                       "Clip coefficient applied on the last step."),
      clip_threshold("trainwatch_clip_threshold",
                     "Configured clip threshold (max_norm)."),
      loss_scale("trainwatch_loss_scale",
                 "FP16 loss scale after the last step."),
      max_attention_logit("trainwatch_max_attention_logit",
                          "Largest attention logit of the last step."),
      log_z("trainwatch_log_z", "Mean log Z of the output softmax, last step."),
      loss("trainwatch_loss", "Loss of the last step."),
      learning_rate("trainwatch_learning_rate",
                    "Learning rate of the last step."),
      grad_norm_window("trainwatch_grad_norm_window",
                       "Percentile of post-warmup pre-clip norms over the "
                       "window (W steps)."),
      clip_fraction("trainwatch_clip_fraction",
                    "Share of the window's steps that were clipped."),
      skip_fraction("trainwatch_skip_fraction",
                    "Share of the window's steps that were skipped."),
      recommended_clip_threshold("trainwatch_recommended_clip_threshold",
                                 "98th percentile of the window's pre-clip "
                                 "norms: the measured way to set max_norm."),
      step_seconds("trainwatch_step_seconds",
                   "Step time over the run's ranks (each rank's recent "
                   "level): the median rank's and the slowest's."),
      straggler_lost_fraction(
          "trainwatch_straggler_lost_fraction",
          "1 - median/max step time over ranks: the share of each step "
          "spent waiting for the slowest rank."),
      data_wait_fraction("trainwatch_data_wait_fraction",
                         "Median share of the lead rank's recent steps spent "
                         "waiting for the input pipeline."),
      goodput_ratio("trainwatch_goodput_ratio",
                    "Share of the run's wall time not lost to skipped steps, "
                    "rewound steps or silent gaps."),
      baseline_loss_ratio("trainwatch_baseline_loss_ratio",
                          "The run's loss against its reference runs at the "
                          "same tokens or step (its last 20-step bin over "
                          "their median: bound=value) and the band's edges "
                          "(bound=lower, upper); 1 is the recipe's curve."),
      lost_steps_total("trainwatch_lost_steps_total",
                       "Steps lost, by cause: skipped (no update) or rewound "
                       "(redone after a restart)."),
      fp8_overflow_fraction("trainwatch_fp8_overflow_fraction",
                            "FP8: the largest overflow_fraction (share "
                            "saturated in the cast) over the tensors of the "
                            "last fp8 report."),
      fp8_underflow_fraction("trainwatch_fp8_underflow_fraction",
                             "FP8: the largest underflow_fraction (share "
                             "flushed to zero) over the tensors of the last "
                             "fp8 report."),
      fp8_scaled_amax_ratio("trainwatch_fp8_scaled_amax_ratio",
                            "FP8: the largest amax x scale / format max over "
                            "the tensors of the last fp8 report (above 1: "
                            "values saturate)."),
      moe_load_max_over_mean("trainwatch_moe_load_max_over_mean",
                             "MoE: the largest load max/mean (hottest expert "
                             "over the mean) over the layers of the last moe "
                             "report (1 = even)."),
      moe_dead_experts("trainwatch_moe_dead_experts",
                       "MoE: experts with no assignment in the last moe "
                       "report, summed over layers."),
      moe_dropped_fraction("trainwatch_moe_dropped_fraction",
                           "MoE: dropped / routed assignments over the "
                           "layers of the last moe report."),
      moe_aux_loss("trainwatch_moe_aux_loss",
                   "MoE: the largest normalised load-balancing loss (1.0 = "
                   "balanced) over the layers of the last moe report."),
      moe_router_z_loss("trainwatch_moe_router_z_loss",
                        "MoE: the largest router z-loss (without its "
                        "coefficient) over the layers of the last moe report."),
      alert_active("trainwatch_alert_active",
                   "1 while the alert is firing for the run."),
      alerts_fired_total("trainwatch_alerts_fired_total",
                         "Times the alert fired for the run.") {}

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(
    const std::string& listen, const WebConfig& web) {
  std::unique_ptr<Metrics> m(
      new Metrics(std::make_shared<prometheus::Registry>()));
  if (listen.empty()) return m;
  if (!web.basic_auth_users.empty()) {
    m->auth_ = std::make_unique<BasicAuthChecker>(web.basic_auth_users);
  }
  Metrics* metrics = m.get();
  absl::StatusOr<std::unique_ptr<HttpExposer>> exposer =
      HttpExposer::Start(HttpExposerOptions{
          .listen = listen,
          .web = web,
          .body = [metrics] { return metrics->Serialize(); },
          .auth = m->auth_.get()});
  if (!exposer.ok()) return exposer.status();
  m->exposer_ = *std::move(exposer);
  return m;
}

std::unique_ptr<RunMetrics> Metrics::AddRun(
    const std::string& run_id,
    const std::vector<std::pair<std::string, std::string>>& alerts) {
  return std::unique_ptr<RunMetrics>(new RunMetrics(*this, run_id, alerts));
}

int Metrics::ListeningPort() const {
  return exposer_ == nullptr ? 0 : exposer_->port();
}

std::string Metrics::Serialize() const {
  return prometheus::TextSerializer().Serialize(Collect());
}

std::vector<prometheus::MetricFamily> Metrics::Collect() const {
  std::vector<prometheus::MetricFamily> server = registry_->Collect();
  std::vector<prometheus::MetricFamily> all;
  all.reserve(server.size() + 24);
  auto next = server.begin();
  auto take_server = [&](prometheus::MetricType type) {
    while (next != server.end() && next->type == type) {
      all.push_back(std::move(*next++));
    }
  };
  take_server(prometheus::MetricType::Counter);
  for (const RunFamily<RunCounter>* f :
       {&steps_total, &clipped_steps_total, &skipped_steps_total,
        &nonfinite_steps_total, &client_dropped_steps_total,
        &lost_steps_total, &alerts_fired_total}) {
    f->Collect(&all);
  }
  take_server(prometheus::MetricType::Gauge);
  for (const RunFamily<RunGauge>* f :
       {&last_step, &last_step_timestamp_seconds, &run_finished, &grad_norm,
        &clip_coefficient, &clip_threshold, &loss_scale, &max_attention_logit,
        &log_z, &loss, &learning_rate, &grad_norm_window, &clip_fraction,
        &skip_fraction, &recommended_clip_threshold, &step_seconds,
        &straggler_lost_fraction, &data_wait_fraction, &goodput_ratio,
        &baseline_loss_ratio,
        &fp8_overflow_fraction, &fp8_underflow_fraction, &fp8_scaled_amax_ratio,
        &moe_load_max_over_mean, &moe_dead_experts, &moe_dropped_fraction,
        &moe_aux_loss, &moe_router_z_loss, &alert_active}) {
    f->Collect(&all);
  }
  all.insert(all.end(), std::make_move_iterator(next),
             std::make_move_iterator(server.end()));
  return all;
}

}  // namespace trainwatch
