#include "engine/host_watch.h"

#include "health/run/convert.h"

namespace trainwatch {
namespace {

// Where the detector's one alert lands: the HostSuspect of the run whose
// alert tipped its host over.
class FiredSink final : public AlertSink {
 public:
  FiredSink(const std::string& run, int64_t now_unix_nanos)
      : run_(run), now_unix_nanos_(now_unix_nanos) {}

  void Fire(AlertKind kind, uint64_t step, double value, AlertText text) override {
    AlertEpisode e{.kind = kind,
                   .firing = true,
                   .started_step = step,
                   .started_unix_nanos = now_unix_nanos_,
                   .peak_value = value,
                   .text = std::move(text)};
    if (e.text.rank.has_value()) e.rank = *e.text.rank;
    fired = ToProto(run_, e);
  }
  // A server-wide rule only fires.
  void Condition(AlertKind, uint64_t, bool, double,
                 const std::function<AlertText()>&) override {}
  void Event(AlertKind, uint64_t, double, const std::vector<int64_t>&,
             const std::function<AlertText()>&) override {}
  void Spike(const SpikeInfo&) override {}
  void Resolve(AlertKind, uint64_t) override {}

  std::optional<v1::Alert> fired;

 private:
  const std::string& run_;
  const int64_t now_unix_nanos_;
};

}  // namespace

absl::Status HostWatch::Load(int64_t now_unix_nanos) {
  absl::StatusOr<std::vector<HostIncidentRow>> rows =
      store_->ListHostIncidents(now_unix_nanos - window_nanos_);
  if (!rows.ok()) return rows.status();
  absl::MutexLock lock(&mu_);
  HostIncidents& incidents = detector_.incidents();
  for (const HostIncidentRow& r : *rows) {
    incidents.Add({r.host, r.alertname, r.run_id, r.unix_nanos});
  }
  incidents.Expire(now_unix_nanos);
  return absl::OkStatus();
}

std::optional<v1::Alert> HostWatch::OnAlertFired(AlertKind kind,
                                                 const v1::Alert& fired) {
  if (fired.host().empty() || !HostIncidents::Implicates(kind)) {
    return std::nullopt;
  }
  store_->Submit(WriteOp{.body = WriteOp::HostIncident{{.host = fired.host(),
                                      .alertname = fired.alertname(),
                                      .run_id = fired.run(),
                                      .unix_nanos = fired.started_unix_nanos()}}});
  FiredSink sink(fired.run(), fired.started_unix_nanos());
  {
    absl::MutexLock lock(&mu_);  // with ForgetRun's series edits
    metrics_->host_incidents_total
        .Add({{"host", fired.host()}, {"alertname", fired.alertname()}})
        .Increment();
    detector_.OnAlertFired(FiredContext{.kind = kind,
                                        .run = fired.run(),
                                        .host = fired.host(),
                                        .started_step = fired.started_step(),
                                        .started_unix_nanos = fired.started_unix_nanos(),
                                        .rank = fired.rank(),
                                        .description = fired.description()},
                           sink);
  }
  return std::move(sink.fired);
}

void HostWatch::ForgetRun(const std::string& run_id) {
  absl::MutexLock lock(&mu_);
  for (const auto& [key, count] : detector_.incidents().ForgetRun(run_id)) {
    const auto& [host, alertname] = key;
    const prometheus::Labels labels{{"host", host}, {"alertname", alertname}};
    prometheus::Counter& series = metrics_->host_incidents_total.Add(labels);
    const double left = series.Value() - static_cast<double>(count);
    metrics_->host_incidents_total.Remove(&series);
    // Other runs' incidents on the host stay counted (a counter reset, which
    // rate() and increase() read as one).
    if (left > 0) metrics_->host_incidents_total.Add(labels).Increment(left);
  }
}

}  // namespace trainwatch
