#include "metrics/metrics.h"

#include <prometheus/text_serializer.h>

#include <exception>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "metrics/https_exposer.h"

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

RunMetrics::RunMetrics(
    Metrics& m, const std::string& run_id,
    const std::vector<std::pair<std::string, std::string>>& alerts)
    : run_id_(run_id),
      alerts_(alerts),
      steps(m.steps_total.Add({{"run", run_id_}})),
      clipped_steps(m.clipped_steps_total.Add({{"run", run_id_}})),
      skipped_steps(m.skipped_steps_total.Add({{"run", run_id_}})),
      nonfinite_steps(m.nonfinite_steps_total.Add({{"run", run_id_}})),
      client_dropped_steps(m.client_dropped_steps_total.Add({{"run", run_id_}})),
      last_step(m.last_step.Add({{"run", run_id_}})),
      last_step_timestamp(m.last_step_timestamp_seconds.Add({{"run", run_id_}})),
      finished(m.run_finished.Add({{"run", run_id_}})),
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
      metrics_(m) {
  alerts_fired.reserve(alerts_.size());
  alert_active.reserve(alerts_.size());
  for (const auto& [name, severity] : alerts_) {
    alerts_fired.emplace_back(&m.alerts_fired_total, run_id_, "alertname", name);
    alert_active.emplace_back(&m.alert_active, run_id_, "alertname", name,
                              "severity", severity);
  }
}

RunMetrics::~RunMetrics() {
  metrics_.steps_total.Remove(&steps);
  metrics_.clipped_steps_total.Remove(&clipped_steps);
  metrics_.skipped_steps_total.Remove(&skipped_steps);
  metrics_.nonfinite_steps_total.Remove(&nonfinite_steps);
  metrics_.client_dropped_steps_total.Remove(&client_dropped_steps);
  metrics_.last_step.Remove(&last_step);
  metrics_.last_step_timestamp_seconds.Remove(&last_step_timestamp);
  metrics_.run_finished.Remove(&finished);
  for (LazyGauge* g : {&grad_norm, &clip_coefficient, &clip_threshold,
                       &loss_scale, &max_attention_logit, &log_z, &loss,
                       &learning_rate, &grad_norm_p50, &grad_norm_p90,
                       &grad_norm_p99, &clip_fraction, &skip_fraction,
                       &recommended_clip_threshold}) {
    g->Remove();
  }
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
      streams_active(Gauge(*registry_, "trainwatch_streams_active",
                           "Open Report streams.")
                         .Add({})),
      runs_active(Gauge(*registry_, "trainwatch_runs_active",
                        "Runs known to the engine that have not finished.")
                      .Add({})),
      store_queue_depth(Gauge(*registry_, "trainwatch_store_queue_depth",
                              "Write ops waiting for the store writer.")
                            .Add({})),
      store_commit_seconds(
          BuildHistogram()
              .Name("trainwatch_store_commit_seconds")
              .Help("Duration of one store transaction.")
              .Register(*registry_)
              .Add({}, prometheus::Histogram::BucketBoundaries{
                           0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                           0.1, 0.25, 0.5, 1, 2.5})),
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
      notifications_dropped_total(
          Counter(*registry_, "trainwatch_notifications_dropped_total",
                  "Alert notifications lost: the receiver's queue was full, "
                  "every retry failed, or the receiver refused them.")),
      steps_total(Counter(*registry_, "trainwatch_steps_total",
                          "Optimizer steps recorded (lead rank).")),
      clipped_steps_total(Counter(*registry_, "trainwatch_clipped_steps_total",
                                  "Steps on which gradient clipping fired.")),
      skipped_steps_total(Counter(*registry_, "trainwatch_skipped_steps_total",
                                  "Optimizer steps skipped (inf/NaN found).")),
      nonfinite_steps_total(
          Counter(*registry_, "trainwatch_nonfinite_steps_total",
                  "Steps with a NaN or Inf gradient norm or loss.")),
      client_dropped_steps_total(
          Counter(*registry_, "trainwatch_client_dropped_steps_total",
                  "Steps the client dropped (buffer full) and reported.")),
      last_step(Gauge(*registry_, "trainwatch_last_step",
                      "Last optimizer step seen.")),
      last_step_timestamp_seconds(
          Gauge(*registry_, "trainwatch_last_step_timestamp_seconds",
                "When the last step finished on the trainer (Unix seconds).")),
      run_finished(Gauge(*registry_, "trainwatch_run_finished",
                         "1 once the run reported RUN_FINISHED or RUN_FAILED "
                         "(its series go after finished_runs.retention_seconds).")),
      grad_norm(Gauge(*registry_, "trainwatch_grad_norm",
                      "Pre-clip global gradient norm of the last step.")),
      clip_coefficient(Gauge(*registry_, "trainwatch_clip_coefficient",
                             "Clip coefficient applied on the last step.")),
      clip_threshold(Gauge(*registry_, "trainwatch_clip_threshold",
                           "Configured clip threshold (max_norm).")),
      loss_scale(Gauge(*registry_, "trainwatch_loss_scale",
                       "FP16 loss scale after the last step.")),
      max_attention_logit(Gauge(*registry_, "trainwatch_max_attention_logit",
                                "Largest attention logit of the last step.")),
      log_z(Gauge(*registry_, "trainwatch_log_z",
                  "Mean log Z of the output softmax, last step.")),
      loss(Gauge(*registry_, "trainwatch_loss", "Loss of the last step.")),
      learning_rate(Gauge(*registry_, "trainwatch_learning_rate",
                          "Learning rate of the last step.")),
      grad_norm_window(Gauge(*registry_, "trainwatch_grad_norm_window",
                             "Percentile of post-warmup pre-clip norms over "
                             "the window (W steps).")),
      clip_fraction(Gauge(*registry_, "trainwatch_clip_fraction",
                          "Share of the window's steps that were clipped.")),
      skip_fraction(Gauge(*registry_, "trainwatch_skip_fraction",
                          "Share of the window's steps that were skipped.")),
      recommended_clip_threshold(
          Gauge(*registry_, "trainwatch_recommended_clip_threshold",
                "98th percentile of the window's pre-clip norms: the measured "
                "way to set max_norm.")),
      alert_active(Gauge(*registry_, "trainwatch_alert_active",
                         "1 while the alert is firing for the run.")),
      alerts_fired_total(Counter(*registry_, "trainwatch_alerts_fired_total",
                                 "Times the alert fired for the run.")) {}

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(
    const std::string& listen, const WebConfig& web) {
  std::unique_ptr<Metrics> m(
      new Metrics(std::make_shared<prometheus::Registry>()));
  if (listen.empty()) return m;
  if (!web.basic_auth_users.empty()) {
    m->auth_ = std::make_unique<BasicAuthChecker>(web.basic_auth_users);
  }
  BasicAuthChecker* auth = m->auth_.get();
  if (web.tls()) {
    Metrics* metrics = m.get();
    absl::StatusOr<std::unique_ptr<HttpsExposer>> https = HttpsExposer::Start(
        listen, web, [metrics] { return metrics->Serialize(); }, auth);
    if (!https.ok()) return https.status();
    m->https_ = *std::move(https);
    return m;
  }
  try {
    m->exposer_ = std::make_unique<prometheus::Exposer>(listen, 2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve /metrics on ", listen, ": ", e.what()));
  }
  if (auth != nullptr) {
    m->exposer_->RegisterAuth(
        [auth](const std::string& user, const std::string& password) {
          return auth->Check(user, password);
        },
        "trainwatch", "/metrics");
  }
  m->exposer_->RegisterCollectable(m->registry_);
  return m;
}

std::unique_ptr<RunMetrics> Metrics::AddRun(
    const std::string& run_id,
    const std::vector<std::pair<std::string, std::string>>& alerts) {
  return std::unique_ptr<RunMetrics>(
      new RunMetrics(*this, run_id, alerts));
}

int Metrics::ListeningPort() const {
  if (https_ != nullptr) return https_->port();
  if (exposer_ == nullptr) return 0;
  std::vector<int> ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

std::string Metrics::Serialize() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace trainwatch
