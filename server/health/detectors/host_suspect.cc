#include "health/detectors/host_suspect.h"

#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainwatch {

void HostSuspectDetector::OnAlertFired(const FiredContext& ctx, AlertSink& sink) {
  if (ctx.host.empty() || !HostIncidents::Implicates(ctx.kind)) return;
  const std::string name(Spec(ctx.kind).name);
  std::optional<HostSuspicion> s = incidents_.Add(
      {ctx.host, name, ctx.run, ctx.started_unix_nanos,
       absl::StrCat(name, "|", ctx.started_step, "|", ctx.rank, "|",
                    ctx.description)});
  if (!s.has_value()) return;
  sink.Fire(AlertKind::kHostSuspect, ctx.started_step,
            static_cast<double>(s->runs.size()),
            AlertText{.summary = absl::StrCat("host ", s->host, " is suspect"),
                      .description = absl::StrCat(
                          "host ", s->host, " was named by ",
                          absl::StrJoin(s->alertnames, ", "), " alerts of ",
                          s->runs.size(), " different runs within a day: ",
                          absl::StrJoin(s->runs, ", ")),
                      .host = s->host,
                      .rank = ctx.rank});
}

}  // namespace trainwatch
