#include "engine/host_watch.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainwatch {

absl::Status HostWatch::Load(int64_t now_unix_nanos) {
  absl::StatusOr<std::vector<HostIncidentRow>> rows =
      store_->ListHostIncidents(now_unix_nanos - window_nanos_);
  if (!rows.ok()) return rows.status();
  absl::MutexLock lock(&mu_);
  for (const HostIncidentRow& r : *rows) {
    incidents_.Add({r.host, r.alertname, r.run_id, r.unix_nanos});
  }
  incidents_.Expire(now_unix_nanos);
  return absl::OkStatus();
}

std::optional<v1::Alert> HostWatch::OnAlertFired(const v1::Alert& fired) {
  if (fired.host().empty() || !HostIncidents::Implicates(fired.alertname())) {
    return std::nullopt;
  }
  metrics_->host_incidents_total
      .Add({{"host", fired.host()}, {"alertname", fired.alertname()}})
      .Increment();
  store_->Submit(WriteOp{.kind = WriteOp::Kind::kHostIncident,
                         .incident = {.host = fired.host(),
                                      .alertname = fired.alertname(),
                                      .run_id = fired.run(),
                                      .unix_nanos = fired.started_unix_nanos()}});
  std::optional<HostSuspicion> s;
  {
    absl::MutexLock lock(&mu_);
    s = incidents_.Add({fired.host(), fired.alertname(), fired.run(),
                        fired.started_unix_nanos(),
                        absl::StrCat(fired.alertname(), "|", fired.started_step(), "|",
                                     fired.rank(), "|", fired.description())});
  }
  if (!s.has_value()) return std::nullopt;
  v1::Alert a;
  a.set_alertname("HostSuspect");
  a.set_run(fired.run());
  a.set_severity("warning");
  a.set_state("firing");
  a.set_started_step(fired.started_step());
  a.set_started_unix_nanos(fired.started_unix_nanos());
  a.set_peak_value(static_cast<double>(s->runs.size()));
  a.set_host(s->host);
  a.set_rank(fired.rank());
  a.set_summary(absl::StrCat("host ", s->host, " is suspect"));
  a.set_description(absl::StrCat(
      "host ", s->host, " was named by ", absl::StrJoin(s->alertnames, ", "),
      " alerts of ", s->runs.size(), " different runs within a day: ",
      absl::StrJoin(s->runs, ", ")));
  a.set_likely_cause(
      "A lemon machine: a GPU with failing memory or silent data corruption, "
      "a throttled or mis-seated card, a bad NIC: different runs fail on it in "
      "the same ways.");
  a.set_fix(
      "Drain the host from the scheduler, run the vendor diagnostics (DCGM "
      "level 3, memory tests), and restart the affected runs elsewhere from "
      "their last checkpoints.");
  return a;
}

}  // namespace trainwatch
