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
  // MoE aggregates (no per-expert counts): the load-balancing loss without
  // its coefficient (1.0 = balanced) and the router z-loss, over the layers.
  kMoeAuxLoss,
  kMoeZLoss,
};

// "grad_norm", "loss", "lr", "loss_scale", "step_time_s", "max_attn_logit",
// "log_z", "skipped", "moe_aux_loss", "moe_z_loss": the names --map takes.
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
  // A per-layer MoE series (Megatron-Core's moe/<name>_layer_<i>): the
  // layer it belongs to ("" = over the layers).
  std::string moe_layer;
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
  // MoE aggregates by layer ("" = over the layers): aux_loss and z_loss.
  std::map<std::string, v1::MoeLayerStats> moe;
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

// The steps of PlanImport that decide per logged step.

// An exact 0.0 norm next to a finite non-zero loss: what a logger writes when
// it has no norm (DeepSpeed under the HF Trainer, a norm read before it was
// computed), since a real gradient's norm is never exactly 0 while it
// learns. Such a norm is dropped, unless the log has no other.
bool IsZeroNormArtifact(const LoggedStep& step);

// Non-finite norms followed by finite ones: the weights survived, so those
// updates were skipped (a GradScaler's overflow, a NaN-skipping optimizer).
// A streak that never ends, or lasts longer than a scaler backs off, is an
// applied non-finite update. Returns step -> skipped for every logged
// non-finite norm of a step the log does not report as skipped itself, and
// adds a note for each kind to `notes`.
std::map<uint64_t, bool> InferSkips(const LoggedRun& run,
                                    std::vector<std::string>* notes);

// What PlanImport decided for the whole run that shapes each record.
struct RecordRules {
  bool norm_blind = false;       // no usable norm: grad_norm 0, not clipped
  bool drop_unit_scale = false;  // every loss scale is 1.0: none sent
  std::map<uint64_t, bool> inferred_skips;  // from InferSkips()
};

// What MakeRecord() changed or left out, for PlanImport's notes.
struct RecordCounts {
  uint64_t reported_skips = 0;   // steps the log says were skipped
  uint64_t no_norm = 0;          // steps left out: no norm
  uint64_t fp8_unformatted = 0;  // FP8 tensors given the HYBRID format
  uint64_t fp8_bad_shares = 0;   // overflow/underflow shares left out
  uint64_t moe_reports = 0;      // MoE layer entries sent (aggregates only)
};

// The record of one logged step, or nullopt when it has no usable norm (and
// the run has some) and was not skipped.
std::optional<v1::StepRecord> MakeRecord(uint64_t step, const LoggedStep& logged,
                                         const RecordRules& rules,
                                         RecordCounts* counts);

// Parses a number as logs print it: decimal or exponent form, and the
// spellings of non-finite values ("nan", "NaN", "inf", "-Infinity"...).
std::optional<double> ParseLogNumber(absl::string_view text);

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLIENT_IMPORT_IMPORT_LOG_H_
