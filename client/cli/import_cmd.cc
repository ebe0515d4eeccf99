// `trainwatchctl import FILE... --run R`: reads a past run's own logs, says
// what it inferred, and replays the run through the server like `replay`.
// Every file is read and checked before anything is sent, so a bad file
// imports nothing.

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/commands.h"
#include "import/import_files.h"
#include "import/import_log.h"
#include "cli/send.h"

namespace trainwatch::cli {
namespace {

absl::StatusOr<ImportSettings> SettingsFromFlags(const ParsedArgs& args) {
  ImportSettings settings;
  absl::StatusOr<std::optional<double>> max_norm = args.GetDouble("max-norm");
  if (!max_norm.ok()) return max_norm.status();
  if (max_norm->has_value()) {
    if (!(**max_norm >= 0) || !std::isfinite(**max_norm)) {
      return UsageError("--max-norm wants a finite number >= 0");
    }
    settings.max_norm = **max_norm;
  }
  absl::StatusOr<std::optional<uint64_t>> warmup =
      args.GetUint64("warmup-steps");
  if (!warmup.ok()) return warmup.status();
  settings.warmup_steps = *warmup;
  if (std::optional<std::string> p = args.Get("precision")) {
    std::optional<Precision> precision = ParsePrecision(*p);
    if (!precision.has_value()) {
      return UsageError(absl::StrCat(
          "--precision wants fp32, bf16 or fp16, got \"", *p, "\""));
    }
    settings.precision = *precision;
  }
  return settings;
}

absl::string_view PrecisionText(Precision p) {
  switch (p) {
    case Precision::kFp16:
      return "fp16";
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp32:
      return "fp32";
    default:
      return "unspecified";
  }
}

}  // namespace

absl::Status RunImport(const GlobalOptions& global, const ParsedArgs& args) {
  if (args.positional().empty()) {
    return UsageError("wants at least one FILE (event file, "
                      "trainer_state.json, stdout log or CSV)");
  }
  absl::StatusOr<std::string> run_id = RequiredFlag(args, "run");
  if (!run_id.ok()) return run_id.status();
  ImportFormat format = ImportFormat::kAuto;
  if (std::optional<std::string> f = args.Get("format")) {
    std::optional<ImportFormat> parsed = ParseImportFormat(*f);
    if (!parsed.has_value()) {
      return UsageError(absl::StrCat(
          "--format wants auto, tensorboard, hf, megatron or csv, got \"", *f,
          "\""));
    }
    format = *parsed;
  }
  TagMap map;
  for (const std::string& spec : args.GetAll("map")) {
    if (absl::Status s = AddTagMapping(spec, &map); !s.ok()) {
      return UsageError(s.message());
    }
  }
  absl::StatusOr<ImportSettings> settings = SettingsFromFlags(args);
  if (!settings.ok()) return settings.status();

  LoggedRun logged;
  for (const std::string& path : args.positional()) {
    const size_t before = logged.steps.size();
    if (absl::Status s = ImportFile(path, format, map, &logged); !s.ok()) {
      return absl::Status(
          s.code(), absl::StrCat("import: ", s.message(),
                                 " (nothing was sent)"));
    }
    WriteStdout(absl::StrFormat("import: read %s: %d logged steps\n", path,
                                logged.steps.size() - before));
  }
  if (logged.overwritten > 0) {
    logged.notes.push_back(absl::StrCat(
        logged.overwritten,
        " values were given again for a step (later files and lines win)"));
  }
  absl::StatusOr<ImportPlan> plan = PlanImport(logged, *settings);
  if (!plan.ok()) {
    return absl::Status(plan.status().code(),
                        absl::StrCat("import: ", plan.status().message(),
                                     " (nothing was sent)"));
  }
  for (const std::string& note : plan->notes) {
    WriteStdout(absl::StrCat("import: ", note, "\n"));
  }

  ClientOptions options;
  options.run_id = *run_id;
  options.precision = plan->precision;
  options.max_norm = plan->max_norm;
  options.warmup_steps = plan->warmup_steps;
  options.labels = plan->labels;
  size_t next = 0;
  bool finished = false;
  const uint64_t last_step = plan->records.back().step();
  // A finished run: it does not go silent (RunSilent) and it leaves the
  // server's active set after the retention.
  absl::StatusOr<SendResult> sent = SendEntries(
      global, std::move(options), "import",
      [&](std::string* where) -> absl::StatusOr<std::optional<StepLogEntry>> {
        if (next < plan->records.size()) {
          *where = absl::StrCat("step ", plan->records[next].step());
          return StepLogEntry(plan->records[next++]);
        }
        if (finished) return std::nullopt;
        finished = true;
        v1::RunEvent event;
        event.set_step(last_step);
        event.set_kind(v1::RUN_FINISHED);
        event.set_detail("imported");
        *where = "the end of the run";
        return StepLogEntry(event);
      });
  if (!sent.ok()) return sent.status();
  WriteStdout(absl::StrFormat(
      "imported %d steps (%d..%d) to run %s (%s, max_norm %g, warmup %d), "
      "%d acked, %.2f s\n"
      "next: trainwatchctl health --run %s; trainwatchctl report --run %s "
      "--out %s.html\n",
      sent->steps, plan->records.front().step(), last_step, *run_id,
      PrecisionText(plan->precision), plan->max_norm, plan->warmup_steps,
      sent->acked, sent->seconds, *run_id, *run_id, "report"));
  return absl::OkStatus();
}

}  // namespace trainwatch::cli
