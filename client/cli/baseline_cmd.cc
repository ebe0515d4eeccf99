// Reference runs' commands (docs/baselines.md): `baseline set|show|clear`
// and `compare`.
#include <chrono>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/commands.h"
#include "cli/fleet.h"
#include "output/json_out.h"
#include "output/text_out.h"

namespace trainwatch::cli {
namespace {

constexpr std::chrono::milliseconds kDeadline{30'000};

// RUN or RUN@ATTEMPT (attempt 0 when not given).
absl::StatusOr<v1::BaselineRef> ParseRef(const std::string& text) {
  v1::BaselineRef ref;
  const size_t at = text.rfind('@');
  ref.set_run(at == std::string::npos ? text : text.substr(0, at));
  uint32_t attempt = 0;
  if (at != std::string::npos && !absl::SimpleAtoi(text.substr(at + 1), &attempt)) {
    return UsageError(absl::StrCat("--ref ", text, ": RUN or RUN@ATTEMPT"));
  }
  if (ref.run().empty()) return UsageError(absl::StrCat("--ref ", text, ": no run"));
  ref.set_attempt(attempt);
  return ref;
}

absl::Status AddRefs(const ParsedArgs& args,
                     google::protobuf::RepeatedPtrField<v1::BaselineRef>* out) {
  for (const std::string& text : args.GetAll("ref")) {
    absl::StatusOr<v1::BaselineRef> ref = ParseRef(text);
    if (!ref.ok()) return ref.status();
    *out->Add() = *std::move(ref);
  }
  return absl::OkStatus();
}

std::string Refs(const google::protobuf::RepeatedPtrField<v1::BaselineRef>& refs) {
  const std::string out = BaselineRefs(refs);
  return out.empty() ? "-" : out;
}

void PrintBaselines(const v1::BaselinesResponse& r, bool json) {
  std::string out;
  if (json) {
    JsonWriter w(&out);
    w.BeginObject();
    w.Key("run");
    w.String(r.run_id());
    w.Key("source");
    w.String(r.source());
    w.Key("baselines");
    w.BeginArray();
    for (const v1::BaselineRef& ref : r.baselines()) {
      w.BeginObject();
      w.Key("run");
      w.String(ref.run());
      w.Key("attempt");
      w.Uint(ref.attempt());
      w.EndObject();
    }
    w.EndArray();
    w.EndObject();
    WriteStdout(out + "\n");
    return;
  }
  WriteStdout(absl::StrCat("run ", r.run_id(), ": baselines ", Refs(r.baselines()), " (",
                           r.source(), ")\n"));
}

void PrintCompare(const v1::CompareRunsResponse& r, bool json) {
  std::string out;
  if (json) {
    JsonWriter w(&out);
    WriteCompare(w, r);
    WriteStdout(out + "\n");
    return;
  }
  out = absl::StrFormat("run %s@%d against %s, %s by %s\n", r.run_id(), r.attempt(),
                        Refs(r.refs()), r.metric(), r.axis());
  out += absl::StrFormat("%14s %10s %10s %10s %10s %10s %7s %8s\n", "X", "LAST STEP", "VALUE",
                         "REF", "LO", "HI", "Z", "LR");
  for (const v1::CompareBin& b : r.bins()) {
    const bool outside = b.value() < b.lo() || b.value() > b.hi();
    const std::string lr = b.has_lr_ratio() ? absl::StrFormat("%.3gx", b.lr_ratio()) : "-";
    out += absl::StrFormat("%14.0f %10d %10.4g %10.4g %10.4g %10.4g %+7.2f %8s%s\n", b.x(),
                           b.last_step(), b.value(), b.ref_median(), b.lo(), b.hi(), b.z(), lr,
                           outside ? " *" : "");
  }
  if (r.left_band()) {
    out += absl::StrCat("left the band at step ", r.first_step_outside(), "\n");
  } else {
    out += r.bins().empty() ? "no bin the baselines cover\n" : "within the band\n";
  }
  WriteStdout(out);
}

}  // namespace

absl::Status RunBaseline(const GlobalOptions& global, const ParsedArgs& args) {
  if (args.positional().size() != 1) {
    return UsageError("baseline: set, show or clear: baseline set --run R --ref RUN[@ATTEMPT]");
  }
  const std::string& verb = args.positional()[0];
  absl::StatusOr<std::string> run = RequiredFlag(args, "run");
  if (!run.ok()) return run.status();
  absl::StatusOr<GlobalOptions> aimed = ForRun(global, "baseline", *run);
  if (!aimed.ok()) return aimed.status();
  auto context = NewContext(*aimed, kDeadline);
  auto stub = NewStub(*aimed);
  v1::BaselinesResponse response;
  if (verb == "show") {
    v1::GetBaselinesRequest request;
    request.set_run_id(*run);
    grpc::Status status = stub->GetBaselines(context.get(), request, &response);
    if (!status.ok()) return RpcError("baseline show", "GetBaselines", status);
  } else if (verb == "set" || verb == "clear") {
    v1::SetBaselinesRequest request;
    request.set_run_id(*run);
    if (verb == "set") {
      if (absl::Status s = AddRefs(args, request.mutable_baselines()); !s.ok()) return s;
      if (request.baselines().empty()) return UsageError("baseline set: give --ref RUN[@ATTEMPT]");
    } else if (!args.GetAll("ref").empty()) {
      return UsageError("baseline clear takes no --ref");
    }
    grpc::Status status = stub->SetBaselines(context.get(), request, &response);
    if (!status.ok()) return RpcError(absl::StrCat("baseline ", verb), "SetBaselines", status);
  } else {
    return UsageError(absl::StrCat("baseline ", verb, ": set, show or clear"));
  }
  PrintBaselines(response, args.Has("json"));
  return absl::OkStatus();
}

absl::Status RunCompare(const GlobalOptions& global, const ParsedArgs& args) {
  if (absl::Status s = NoArguments(args); !s.ok()) return s;
  absl::StatusOr<std::string> run = RequiredFlag(args, "run");
  if (!run.ok()) return run.status();
  absl::StatusOr<GlobalOptions> aimed = ForRun(global, "compare", *run);
  if (!aimed.ok()) return aimed.status();
  v1::CompareRunsRequest request;
  request.set_run_id(*run);
  if (absl::Status s = AddRefs(args, request.mutable_refs()); !s.ok()) return s;
  request.set_metric(args.Get("metric").value_or("loss"));
  request.set_axis(args.Get("axis").value_or(""));
  v1::CompareRunsResponse response;
  auto context = NewContext(*aimed, kDeadline);
  grpc::Status status = NewStub(*aimed)->CompareRuns(context.get(), request, &response);
  if (!status.ok()) return RpcError("compare", "CompareRuns", status);
  PrintCompare(response, args.Has("json"));
  return absl::OkStatus();
}

}  // namespace trainwatch::cli
