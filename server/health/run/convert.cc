#include "health/run/convert.h"

#include "health/alert_catalog.h"
#include "trainwatch/v1/alert_names.h"

namespace trainwatch {

RunInfo InfoFrom(const v1::RunStart& s) {
  RunInfo info;
  info.run_id = s.run_id();
  info.precision = s.precision();
  info.max_norm = s.max_norm();
  info.warmup_steps = s.warmup_steps();
  info.world_size = s.world_size() == 0 ? 1 : s.world_size();
  info.scaler_growth_interval =
      s.scaler_growth_interval() == 0 ? 2000 : s.scaler_growth_interval();
  if (s.has_adam_eps()) info.adam_eps = s.adam_eps();
  if (s.has_adam_beta2()) info.adam_beta2 = s.adam_beta2();
  info.host = s.host();
  if (s.has_moe()) info.moe = s.moe();
  return info;
}

v1::Alert ToProto(const std::string& run, const AlertEpisode& e) {
  const AlertSpec& spec = Spec(e.kind);
  v1::Alert a;
  a.set_alertname(std::string(spec.name));
  a.set_run(run);
  a.set_severity(e.severity != v1::SEVERITY_UNSPECIFIED ? e.severity
                                                         : spec.severity);
  a.set_state(e.firing ? v1::ALERT_STATE_FIRING : v1::ALERT_STATE_RESOLVED);
  a.set_started_step(e.started_step);
  a.set_started_unix_nanos(e.started_unix_nanos);
  if (!e.firing) {
    a.set_resolved_step(e.resolved_step);
    a.set_resolved_unix_nanos(e.resolved_unix_nanos);
  }
  a.set_peak_value(e.peak_value);
  a.set_summary(e.text.summary);
  a.set_description(e.text.description);
  a.set_likely_cause(std::string(spec.likely_cause));
  a.set_fix(std::string(spec.fix));
  a.mutable_batch_ids()->Add(e.batch_ids.begin(), e.batch_ids.end());
  a.set_rank(e.rank);
  a.set_onset_step(e.text.onset_step);
  if (e.caused_by.has_value()) {
    a.set_caused_by(std::string(Spec(*e.caused_by).name));
  }
  a.set_host(e.text.host);
  return a;
}

AlertEpisode FromProto(const v1::Alert& a) {
  AlertEpisode e;
  e.kind = *AlertKindByName(a.alertname());
  e.firing = a.state() == v1::ALERT_STATE_FIRING;
  e.started_step = a.started_step();
  e.resolved_step = a.resolved_step();
  e.started_unix_nanos = a.started_unix_nanos();
  e.resolved_unix_nanos = a.resolved_unix_nanos();
  e.peak_value = a.peak_value();
  e.text = AlertText{.summary = a.summary(),
                     .description = a.description(),
                     .onset_step = a.onset_step(),
                     .host = a.host()};
  if (!a.caused_by().empty()) e.caused_by = AlertKindByName(a.caused_by());
  e.batch_ids.assign(a.batch_ids().begin(), a.batch_ids().end());
  e.rank = a.rank();
  if (a.severity() != Spec(e.kind).severity) e.severity = a.severity();
  return e;
}

std::vector<std::pair<std::string, std::string>> AlertLabels() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const AlertSpec& s : AllAlertSpecs()) {
    out.emplace_back(std::string(s.name), std::string(v1::SeverityName(s.severity)));
  }
  return out;
}

}  // namespace trainwatch
