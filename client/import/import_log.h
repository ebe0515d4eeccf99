// What `trainwatchctl import` reads out of a past run's own logs, before it
// becomes step records (docs/import-and-report.md).
//
// Each format's parser (import_tensorboard, import_hf, import_text) fills one
// LoggedRun: per step, the fields the log had. The tag table maps the names
// that TensorBoard tags, CSV headers and stdout keys use to those fields.
// PlanImport then turns a LoggedRun into the RunStart and StepRecords to
// replay, inferring what the log does not say, and says what it inferred.
#ifndef TRAINWATCH_CLIENT_IMPORT_IMPORT_LOG_H_
#define TRAINWATCH_CLIENT_IMPORT_IMPORT_LOG_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainwatch/client.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch::cli {

// The StepRecord fields a log can carry.
enum class LogField {
  kGradNorm,
  kLoss,
  kLr,
  kLossScale,
  kStepTime,  // seconds
  kMaxAttnLogit,
  kLogZ,
  kSkipped,  // a count of skipped iterations (> 0: the step was skipped)
};

// "grad_norm", "loss", "lr", "loss_scale", "step_time_s", "max_attn_logit",
// "log_z", "skipped": the names --map takes.
absl::string_view LogFieldName(LogField field);
std::optional<LogField> LogFieldFromName(absl::string_view name);

// Which framework wrote a log, as far as its names tell.
enum class LogSource { kUnknown, kHuggingFace, kMegatron, kLightning };
absl::string_view LogSourceName(LogSource source);

// A field and the factor that turns the logged value into its unit
// (milliseconds to seconds for "elapsed time per iteration (ms)").
struct TagTarget {
  LogField field;
  double scale = 1.0;
  // A column of one FP8 tensor's stats ("fp8/<tensor>/<stat>", stat one of
  // format (1..4, the Fp8Format values), amax, scale, amax_history_len,
  // margin, overflow_fraction, underflow_fraction); `field` is then unused.
  struct Fp8Column {
    std::string tensor;
    std::string stat;
  };
  std::optional<Fp8Column> fp8;
};

// Names a user maps with --map TAG=field, checked before the table.
using TagMap = std::map<std::string, LogField, std::less<>>;

// Parses "TAG=field" (the last '=' splits, so a tag may hold one) into `map`.
absl::Status AddTagMapping(absl::string_view spec, TagMap* map);

// The field a TensorBoard tag, CSV column or stdout key names, from `user`
// first, then the documented table; nullopt for names trainwatch does not
// use (eval/validation series, "... vs samples" copies, throughput...).
// Matching is exact after trimming and lowercasing.
std::optional<TagTarget> LookUpTag(absl::string_view tag, const TagMap& user);

// The framework a known tag points to (kUnknown when it says nothing).
LogSource SourceOfTag(absl::string_view tag);

// One logged step: what the log had for it.
struct LoggedStep {
  std::optional<double> grad_norm;
  std::optional<double> loss;
  std::optional<double> lr;
  std::optional<double> loss_scale;
  std::optional<double> step_time_s;
  std::optional<double> max_attn_logit;
  std::optional<double> log_z;
  // Skipped iterations the log reported for this step (Megatron's count,
  // DeepSpeed's overflow lines).
  uint32_t skipped = 0;
  bool nan_iteration = false;  // Megatron "number of nan iterations" > 0
  // FP8 tensor stats from fp8/<tensor>/<stat> columns (format 0 until a
  // format column says).
  std::map<std::string, v1::Fp8TensorStats> fp8;
};

// Everything read from one run's files. Thread-compatible.
struct LoggedRun {
  std::map<uint64_t, LoggedStep> steps;
  LogSource source = LogSource::kUnknown;
  // What the parsers noticed and the user should read (a truncated tail,
  // ignored entries), one line each.
  std::vector<std::string> notes;
  // The logging interval the file declares (HF logging_steps), if any.
  std::optional<uint64_t> logging_steps;
  // Values a later file gave again for a step an earlier one had.
  uint64_t overwritten = 0;

  // Sets a field of `step`; a later value for the same step wins.
  void Set(uint64_t step, LogField field, double value);
  // Sets what `target` names (a field, scaled, or an FP8 tensor's stat).
  void Set(uint64_t step, const TagTarget& target, double value);
};

// What the user said on the command line; unset: inferred.
struct ImportSettings {
  std::optional<double> max_norm;
  std::optional<Precision> precision;
  std::optional<uint64_t> warmup_steps;
};

// The run to replay and what was inferred for it.
struct ImportPlan {
  Precision precision = Precision::kUnspecified;
  double max_norm = 0.0;
  uint64_t warmup_steps = 0;
  std::map<std::string, std::string> labels;
  std::vector<v1::StepRecord> records;  // ascending steps
  // Lines for the user: every inference and every dropped value, said.
  std::vector<std::string> notes;
};

// Turns a LoggedRun into records. Fails (nothing to send) when the log has no
// step with a value trainwatch reads.
absl::StatusOr<ImportPlan> PlanImport(const LoggedRun& run,
                                      const ImportSettings& settings);

// Parses a number as logs print it: decimal or exponent form, and the
// spellings of non-finite values ("nan", "NaN", "inf", "-Infinity"...).
std::optional<double> ParseLogNumber(absl::string_view text);

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLIENT_IMPORT_IMPORT_LOG_H_
