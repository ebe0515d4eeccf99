// The Prometheus side of trainwatch (docs/metrics.md): the exposer on
// --metrics-listen, the server's own series, and one RunMetrics per run.
//
// Families are registered once at start-up; a run's series are added once
// when the run appears and removed when it is forgotten. Updates go through
// the kept handles (atomic stores, no lock, no lookup).
#ifndef TRAINWATCH_SERVER_METRICS_METRICS_H_
#define TRAINWATCH_SERVER_METRICS_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "metrics/http_exposer.h"
#include "metrics/run_family.h"
#include "metrics/web_config.h"

namespace trainwatch {

class Metrics;

// A series added on its first update, so a run that never reports e.g. a
// loss scale exports no loss_scale series rather than a 0. Its labels are
// built only then, from views of strings its owner keeps (a run holds dozens
// of these, most never added: alerts that never fire).
template <typename T>
class LazySeries {
 public:
  // Labels run="<run>", plus key2="<value2>" and key3="<value3>" when given.
  LazySeries(RunFamily<T>* family, std::string_view run,
             std::string_view key2 = {}, std::string_view value2 = {},
             std::string_view key3 = {}, std::string_view value3 = {})
      : family_(family), label_views_{run, key2, value2, key3, value3} {}
  T& Get() {
    if (series_ == nullptr) {
      prometheus::Labels labels{{"run", std::string(label_views_[0])}};
      for (size_t i = 1; i + 1 < label_views_.size(); i += 2) {
        if (!label_views_[i].empty()) {
          labels.emplace(label_views_[i], label_views_[i + 1]);
        }
      }
      series_ = family_->Add(std::move(labels));
    }
    return series_->metric;
  }
  void Set(double v) { Get().Set(v); }
  void Remove() {
    if (series_ != nullptr) family_->Remove(series_);
    series_ = nullptr;
  }

 private:
  RunFamily<T>* family_;
  std::array<std::string_view, 5> label_views_;
  RunSeries<T>* series_ = nullptr;
};
using LazyGauge = LazySeries<RunGauge>;
using LazyCounter = LazySeries<RunCounter>;

// The per-run series. Not thread-safe: updated by the engine shard that owns
// the run. Removes its series when destroyed (a hash lookup per series).
class RunMetrics {
 private:
  // Declared first: the series below keep views of them.
  const std::string run_id_;
  const std::vector<std::pair<std::string, std::string>> alerts_;
  // The series behind the references below, kept to remove them.
  const std::array<RunSeries<RunCounter>*, 5> counters_;
  const std::array<RunSeries<RunGauge>*, 3> gauges_;

 public:
  ~RunMetrics();
  RunMetrics(const RunMetrics&) = delete;
  RunMetrics& operator=(const RunMetrics&) = delete;

  RunCounter& steps;
  RunCounter& clipped_steps;
  RunCounter& skipped_steps;
  RunCounter& nonfinite_steps;
  RunCounter& client_dropped_steps;
  RunGauge& last_step;
  RunGauge& last_step_timestamp;
  RunGauge& finished;  // 1 after RUN_FINISHED or RUN_FAILED
  LazyGauge grad_norm, clip_coefficient, clip_threshold, loss_scale,
      max_attention_logit, log_z, loss, learning_rate;
  // Windowed series (health engine).
  LazyGauge grad_norm_p50, grad_norm_p90, grad_norm_p99, clip_fraction,
      skip_fraction, recommended_clip_threshold;
  // Where the run's time goes (no per-rank series).
  LazyGauge step_seconds_median, step_seconds_max, straggler_lost_fraction,
      data_wait_fraction, goodput_ratio;
  // Against the run's reference runs (BaselineDeviation's last loss bin):
  // its loss and its band's edges over the references' median.
  LazyGauge baseline_loss_ratio, baseline_band_lower, baseline_band_upper;
  LazyCounter lost_steps_skipped, lost_steps_rewound;
  // FP8: the worst tensor of the lead's last fp8 report (no per-tensor
  // series: a model has thousands of FP8 tensors).
  LazyGauge fp8_overflow_fraction, fp8_underflow_fraction,
      fp8_scaled_amax_ratio;
  // MoE: the lead's last moe report, its worst layer (no per-expert series).
  LazyGauge moe_load_max_over_mean, moe_dead_experts, moe_dropped_fraction,
      moe_aux_loss, moe_router_z_loss;
  // Per alertname, indexed like AllAlertSpecs(): 1 while firing.
  std::vector<LazyGauge> alert_active;
  std::vector<LazyCounter> alerts_fired;

 private:
  friend class Metrics;
  RunMetrics(Metrics& m, const std::string& run_id,
             const std::vector<std::pair<std::string, std::string>>& alerts);
  Metrics& metrics_;
};

// Thread-safe: every method may be called from any thread.
class Metrics {
 private:
  // Declared first: every family below is registered on it.
  std::shared_ptr<prometheus::Registry> registry_;

 public:
  // Starts serving /metrics on `listen` (host:port); "" serves nothing
  // (tests). `web` (--web-config-file, web_config.h): HTTPS and basic auth;
  // plain HTTP without one.
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(
      const std::string& listen, const WebConfig& web = WebConfig());
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // `alerts` lists (alertname, severity) pairs, in the order RunMetrics'
  // alert_active and alerts_fired use.
  std::unique_ptr<RunMetrics> AddRun(
      const std::string& run_id,
      const std::vector<std::pair<std::string, std::string>>& alerts);

  // The port /metrics is served on (resolves a requested port 0); 0 if none.
  int ListeningPort() const;

  // The text exposition, as a scrape would see it (tests, debugging).
  std::string Serialize() const;

  // Server series.
  prometheus::Counter& ingest_records;
  prometheus::Family<prometheus::Counter>& ingest_rejected;  // {reason}
  prometheus::Gauge& streams_active;
  prometheus::Gauge& runs_active;
  prometheus::Gauge& store_queue_depth;
  prometheus::Histogram& store_commit_seconds;
  prometheus::Counter& store_errors;
  prometheus::Gauge& store_failing;
  // Alert delivery, by receiver (alertmanager | webhook); the notifier adds
  // the series of the receivers it has.
  prometheus::Family<prometheus::Counter>& notifications_sent_total;
  prometheus::Family<prometheus::Counter>& notification_failures_total;
  // Incidents naming a host ({host, alertname}; only hosts an incident named).
  prometheus::Family<prometheus::Counter>& host_incidents_total;
  prometheus::Family<prometheus::Counter>& notifications_dropped_total;
  // Closed-loop directives entering each state ({action, state}; the closed
  // loop adds its 35 series once).
  prometheus::Family<prometheus::Counter>& directives_total;

  // Per-run families (label `run`), used by RunMetrics. Kept out of the
  // registry (see run_family.h); the exposition merges them in.
  RunFamily<RunCounter> steps_total;
  RunFamily<RunCounter> clipped_steps_total;
  RunFamily<RunCounter> skipped_steps_total;
  RunFamily<RunCounter> nonfinite_steps_total;
  RunFamily<RunCounter> client_dropped_steps_total;
  RunFamily<RunGauge> last_step;
  RunFamily<RunGauge> last_step_timestamp_seconds;
  RunFamily<RunGauge> run_finished;
  RunFamily<RunGauge> grad_norm;
  RunFamily<RunGauge> clip_coefficient;
  RunFamily<RunGauge> clip_threshold;
  RunFamily<RunGauge> loss_scale;
  RunFamily<RunGauge> max_attention_logit;
  RunFamily<RunGauge> log_z;
  RunFamily<RunGauge> loss;
  RunFamily<RunGauge> learning_rate;
  RunFamily<RunGauge> grad_norm_window;  // {percentile}
  RunFamily<RunGauge> clip_fraction;
  RunFamily<RunGauge> skip_fraction;
  RunFamily<RunGauge> recommended_clip_threshold;
  RunFamily<RunGauge> step_seconds;  // {stat}
  RunFamily<RunGauge> straggler_lost_fraction;
  RunFamily<RunGauge> data_wait_fraction;
  RunFamily<RunGauge> goodput_ratio;
  RunFamily<RunGauge> baseline_loss_ratio;
  RunFamily<RunCounter> lost_steps_total;  // {cause}
  RunFamily<RunGauge> fp8_overflow_fraction;
  RunFamily<RunGauge> fp8_underflow_fraction;
  RunFamily<RunGauge> fp8_scaled_amax_ratio;
  RunFamily<RunGauge> moe_load_max_over_mean;
  RunFamily<RunGauge> moe_dead_experts;
  RunFamily<RunGauge> moe_dropped_fraction;
  RunFamily<RunGauge> moe_aux_loss;
  RunFamily<RunGauge> moe_router_z_loss;
  RunFamily<RunGauge> alert_active;          // {alertname,severity}
  RunFamily<RunCounter> alerts_fired_total;  // {alertname}

 private:
  explicit Metrics(std::shared_ptr<prometheus::Registry> registry);
  // The registry's families with the per-run ones merged in, in the order
  // prometheus::Registry gives them (counters, gauges, then the rest).
  std::vector<prometheus::MetricFamily> Collect() const;

  // Declared before the exposers, whose threads call it until they are gone.
  std::unique_ptr<BasicAuthChecker> auth_;
  // Plain HTTP or HTTPS (web_config.h), event-driven (http_exposer.h).
  std::unique_ptr<HttpExposer> exposer_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_METRICS_METRICS_H_
