// `trainwatchctl replay FILE.jsonl`: streams a step log to the server through
// the C++ client, the same path a training loop uses, and succeeds only once
// the server has acknowledged (committed) every record.

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <thread>
#include <variant>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/commands.h"
#include "cli/fleet.h"
#include "cli/send.h"
#include "steplog/steplog.h"
#include "trainwatch/client.h"
#include "trainwatch/run_start.h"

namespace trainwatch::cli {
namespace {

// Overrides the run_start line with the flags given.
absl::Status ApplyFlags(const ParsedArgs& args, ClientOptions* options) {
  if (std::optional<std::string> run = args.Get("run")) options->run_id = *run;
  for (auto [flag, field] : {std::pair{"rank", &options->rank},
                             std::pair{"world-size", &options->world_size},
                             std::pair{"attempt", &options->attempt}}) {
    absl::StatusOr<std::optional<uint32_t>> v = args.GetUint32(flag);
    if (!v.ok()) return v.status();
    if (v->has_value()) *field = **v;
  }
  if (std::optional<std::string> p = args.Get("precision")) {
    std::optional<Precision> precision = ParsePrecision(*p);
    if (!precision.has_value()) {
      return UsageError(absl::StrCat(
          "--precision wants fp32, bf16 or fp16, got \"", *p, "\""));
    }
    options->precision = *precision;
  }
  absl::StatusOr<std::optional<double>> max_norm = args.GetDouble("max-norm");
  if (!max_norm.ok()) return max_norm.status();
  if (max_norm->has_value()) options->max_norm = **max_norm;
  absl::StatusOr<std::optional<uint64_t>> warmup =
      args.GetUint64("warmup-steps");
  if (!warmup.ok()) return warmup.status();
  if (warmup->has_value()) options->warmup_steps = **warmup;
  return absl::OkStatus();
}

}  // namespace

absl::Status RunReplay(const GlobalOptions& global, const ParsedArgs& args) {
  if (args.positional().size() != 1) {
    return UsageError(absl::StrCat("wants exactly one FILE.jsonl, got ",
                                   args.positional().size()));
  }
  const std::string& path = args.positional()[0];

  std::ifstream file;
  std::istream* in = &std::cin;
  std::string name = "<stdin>";
  if (path != "-") {
    file.open(path);
    if (!file) {
      return absl::NotFoundError(absl::StrCat("replay: cannot open ", path,
                                              ": ", std::strerror(errno)));
    }
    in = &file;
    name = path;
  }
  StepLogReader reader(in, name);

  // The run_start line, if any, must be read before the client is created.
  absl::StatusOr<std::optional<StepLogEntry>> first = reader.Next();
  if (!first.ok()) return first.status();
  ClientOptions options;
  std::optional<StepLogEntry> pending = *std::move(first);
  if (pending.has_value() && std::holds_alternative<v1::RunStart>(*pending)) {
    ApplyRunStart(std::get<v1::RunStart>(*pending), &options);
    pending.reset();
  }
  if (absl::Status s = ApplyFlags(args, &options); !s.ok()) return s;
  if (options.run_id.empty()) {
    return UsageError(absl::StrCat(name, " has no run_start line: give --run"));
  }
  const std::string run_id = options.run_id;
  absl::StatusOr<SendResult> sent = SendEntries(
      global, std::move(options), "replay",
      [&](std::string* where) -> absl::StatusOr<std::optional<StepLogEntry>> {
        std::optional<StepLogEntry> entry;
        if (pending.has_value()) {
          entry = std::move(pending);
          pending.reset();
        } else {
          absl::StatusOr<std::optional<StepLogEntry>> next = reader.Next();
          if (!next.ok()) return next.status();
          entry = *std::move(next);
        }
        *where = absl::StrCat(name, ":", reader.line_number());
        return entry;
      });
  if (!sent.ok()) return sent.status();
  const uint64_t records = sent->steps + sent->events;
  WriteStdout(absl::StrFormat(
      "replayed %s to run %s: %d records (%d steps, %d %s), %d acked, "
      "%.2f s, %.0f records/s\n",
      name, run_id, records, sent->steps, sent->events,
      sent->events == 1 ? "event" : "events", sent->acked, sent->seconds,
      sent->seconds > 0 ? records / sent->seconds : 0.0));
  return absl::OkStatus();
}

}  // namespace trainwatch::cli
