// The closed loop's commands (docs/closed-loop.md): `directives`, `approve`,
// `reject`, `hold` and `release`.
#include <chrono>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "cli/commands.h"
#include "cli/fleet.h"
#include "output/json_out.h"

namespace trainwatch::cli {
namespace {

constexpr std::chrono::milliseconds kDeadline{30'000};

// Who decides, as the record keeps it: $USER, or "trainwatchctl".
std::string Decider() {
  const char* user = std::getenv("USER");
  return user != nullptr && *user != '\0' ? std::string(user) : "trainwatchctl";
}

// The run of a directive id (RUN#SEQ), so that a fleet finds its server.
std::string RunOfId(const std::string& id) {
  const size_t hash = id.rfind('#');
  return hash == std::string::npos ? id : id.substr(0, hash);
}

std::string Action(const v1::Directive& d) {
  switch (d.action_case()) {
    case v1::Directive::kCheckpointNow: return "checkpoint_now";
    case v1::Directive::kSkip:
      return absl::StrCat("skip ", d.skip().batch_ids_size(), " batches");
    case v1::Directive::kRollback:
      return absl::StrCat("rollback to ", d.rollback().to_step(), ", skip ",
                          d.rollback().skip_batch_ids_size(), " batches",
                          d.rollback().lr_scale() != 1.0
                              ? absl::StrCat(", LR x ", d.rollback().lr_scale())
                              : "");
    case v1::Directive::kScaleLr: return absl::StrCat("scale_lr x ", d.scale_lr().factor());
    case v1::Directive::kStop: return "stop";
    case v1::Directive::ACTION_NOT_SET: break;
  }
  return "-";
}

absl::Status Decide(const GlobalOptions& global, const ParsedArgs& args, bool approve) {
  const char* command = approve ? "approve" : "reject";
  if (args.positional().size() != 1) {
    return UsageError(absl::StrCat(command, ": give one directive id: ", command, " RUN#SEQ"));
  }
  const std::string& id = args.positional()[0];
  absl::StatusOr<GlobalOptions> aimed = ForRun(global, command, RunOfId(id));
  if (!aimed.ok()) return aimed.status();
  v1::DecideDirectiveRequest request;
  request.set_id(id);
  request.set_note(args.Get("note").value_or(""));
  request.set_by(Decider());
  v1::DirectiveRecord response;
  auto context = NewContext(*aimed, kDeadline);
  auto stub = NewStub(*aimed);
  grpc::Status status = approve ? stub->ApproveDirective(context.get(), request, &response)
                                : stub->RejectDirective(context.get(), request, &response);
  if (!status.ok()) {
    return RpcError(command, approve ? "ApproveDirective" : "RejectDirective", status);
  }
  WriteStdout(absl::StrFormat("%s %s (%s) is %s\n", approve ? "approved:" : "rejected:", id,
                              Action(response.directive()), response.state()));
  return absl::OkStatus();
}

absl::Status Hold(const GlobalOptions& global, const std::string& run, uint64_t seconds,
                  const char* command) {
  absl::StatusOr<GlobalOptions> aimed = ForRun(global, command, run);
  if (!aimed.ok()) return aimed.status();
  v1::HoldRunRequest request;
  request.set_run_id(run);
  request.set_seconds(seconds);
  request.set_by(Decider());
  v1::HoldRunResponse response;
  auto context = NewContext(*aimed, kDeadline);
  grpc::Status status = NewStub(*aimed)->HoldRun(context.get(), request, &response);
  if (!status.ok()) return RpcError(command, "HoldRun", status);
  if (response.until_unix_nanos() == 0) {
    WriteStdout(absl::StrCat("run ", run, ": no hold; the policy approves again\n"));
  } else {
    WriteStdout(absl::StrCat("run ", run, ": nothing is approved by policy until ",
                             absl::FormatTime(absl::FromUnixNanos(response.until_unix_nanos()),
                                              absl::UTCTimeZone()),
                             "\n"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunDirectives(const GlobalOptions& global, const ParsedArgs& args) {
  if (absl::Status s = NoArguments(args); !s.ok()) return s;
  absl::StatusOr<std::string> run = RequiredFlag(args, "run");
  if (!run.ok()) return run.status();
  absl::StatusOr<GlobalOptions> aimed = ForRun(global, "directives", *run);
  if (!aimed.ok()) return aimed.status();
  v1::ListDirectivesRequest request;
  request.set_run_id(*run);
  v1::ListDirectivesResponse response;
  auto context = NewContext(*aimed, kDeadline);
  grpc::Status status = NewStub(*aimed)->ListDirectives(context.get(), request, &response);
  if (!status.ok()) return RpcError("directives", "ListDirectives", status);
  std::string out;
  if (args.Has("json")) {
    JsonWriter w(&out);
    w.BeginArray();
    for (const v1::DirectiveRecord& d : response.directives()) WriteDirective(w, d);
    w.EndArray();
    WriteStdout(out + "\n");
    return absl::OkStatus();
  }
  if (response.directives().empty()) {
    WriteStdout(absl::StrCat("run ", *run, " has no directive\n"));
    return absl::OkStatus();
  }
  out = absl::StrFormat("%-28s %-10s %-22s %-8s %-12s %s\n", "ID", "STATE", "ALERT", "AT STEP",
                        "APPROVED BY", "ACTION");
  for (const v1::DirectiveRecord& r : response.directives()) {
    const v1::Directive& d = r.directive();
    out += absl::StrFormat(
        "%-28s %-10s %-22s %-8s %-12s %s\n", d.id(), r.state(), d.alert(),
        d.apply_at_step() == 0 ? std::string("-") : absl::StrCat(d.apply_at_step()),
        d.approved_by().empty() ? "-" : d.approved_by(), Action(d));
  }
  WriteStdout(out);
  return absl::OkStatus();
}

absl::Status RunApprove(const GlobalOptions& global, const ParsedArgs& args) {
  return Decide(global, args, /*approve=*/true);
}

absl::Status RunReject(const GlobalOptions& global, const ParsedArgs& args) {
  return Decide(global, args, /*approve=*/false);
}

absl::Status RunHold(const GlobalOptions& global, const ParsedArgs& args) {
  if (absl::Status s = NoArguments(args); !s.ok()) return s;
  absl::StatusOr<std::string> run = RequiredFlag(args, "run");
  if (!run.ok()) return run.status();
  absl::StatusOr<std::string> text = RequiredFlag(args, "for");
  if (!text.ok()) return text.status();
  uint64_t seconds = 0;
  absl::Duration d;
  if (!absl::SimpleAtoi(*text, &seconds)) {
    if (!absl::ParseDuration(*text, &d) || d <= absl::ZeroDuration()) {
      return UsageError(absl::StrCat("hold: --for takes a duration (90s, 30m, 2h) or seconds, got \"",
                                     *text, "\""));
    }
    seconds = static_cast<uint64_t>(absl::ToInt64Seconds(absl::Ceil(d, absl::Seconds(1))));
  }
  if (seconds == 0) return UsageError("hold: --for must be more than 0 (release ends a hold)");
  return Hold(global, *run, seconds, "hold");
}

absl::Status RunRelease(const GlobalOptions& global, const ParsedArgs& args) {
  if (absl::Status s = NoArguments(args); !s.ok()) return s;
  absl::StatusOr<std::string> run = RequiredFlag(args, "run");
  if (!run.ok()) return run.status();
  return Hold(global, *run, 0, "release");
}

}  // namespace trainwatch::cli
