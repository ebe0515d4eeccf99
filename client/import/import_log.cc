#include "import/import_log.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace trainwatch::cli {
namespace {

struct TagEntry {
  absl::string_view tag;  // lowercase
  LogField field;
  double scale;
  LogSource source;
};

// The documented tag table (docs/import-and-report.md): TensorBoard tags,
// CSV headers and stdout keys of the frameworks people train with. Only
// per-step training series: HF's `train/train_loss` is the run's final
// average and eval/validation series are not training steps.
constexpr TagEntry kTags[] = {
    // Hugging Face Trainer (TensorBoard, and trainer_state.json keys).
    {"train/grad_norm", LogField::kGradNorm, 1, LogSource::kHuggingFace},
    {"train/loss", LogField::kLoss, 1, LogSource::kHuggingFace},
    {"train/learning_rate", LogField::kLr, 1, LogSource::kHuggingFace},
    // Megatron-LM / Megatron-DeepSpeed TensorBoard tags.
    {"grad-norm", LogField::kGradNorm, 1, LogSource::kMegatron},
    {"lm loss", LogField::kLoss, 1, LogSource::kMegatron},
    {"learning-rate", LogField::kLr, 1, LogSource::kMegatron},
    {"loss-scale", LogField::kLossScale, 1, LogSource::kMegatron},
    {"iteration-time", LogField::kStepTime, 1, LogSource::kMegatron},
    {"num-skipped-iterations", LogField::kSkipped, 1, LogSource::kMegatron},
    // Megatron / GPT-NeoX / DeepSpeed stdout keys ("key: value |").
    {"grad norm", LogField::kGradNorm, 1, LogSource::kMegatron},
    {"learning rate", LogField::kLr, 1, LogSource::kMegatron},
    {"loss scale", LogField::kLossScale, 1, LogSource::kMegatron},
    {"elapsed time per iteration (ms)", LogField::kStepTime, 1e-3,
     LogSource::kMegatron},
    {"number of skipped iterations", LogField::kSkipped, 1,
     LogSource::kMegatron},
    // GPT-NeoX TensorBoard tags.
    {"train/lm_loss", LogField::kLoss, 1, LogSource::kMegatron},
    {"train/loss_scale", LogField::kLossScale, 1, LogSource::kMegatron},
    {"runtime/iteration_time", LogField::kStepTime, 1, LogSource::kMegatron},
    {"train/grad-norm", LogField::kGradNorm, 1, LogSource::kMegatron},
    {"lm_loss", LogField::kLoss, 1, LogSource::kMegatron},
    // PyTorch Lightning (self.log names in common use, LearningRateMonitor).
    {"train_loss", LogField::kLoss, 1, LogSource::kLightning},
    {"train_loss_step", LogField::kLoss, 1, LogSource::kLightning},
    {"grad_norm_total", LogField::kGradNorm, 1, LogSource::kLightning},
    {"grad_2.0_norm_total", LogField::kGradNorm, 1, LogSource::kLightning},
    {"lr-adamw", LogField::kLr, 1, LogSource::kLightning},
    {"lr-adam", LogField::kLr, 1, LogSource::kLightning},
    {"lr-sgd", LogField::kLr, 1, LogSource::kLightning},
    // Plain names: CSV exports, llm.c ("train loss", "norm"), custom loops.
    {"grad_norm", LogField::kGradNorm, 1, LogSource::kUnknown},
    {"gradient_norm", LogField::kGradNorm, 1, LogSource::kUnknown},
    {"train/gradient_norm", LogField::kGradNorm, 1, LogSource::kUnknown},
    {"norm", LogField::kGradNorm, 1, LogSource::kUnknown},
    {"loss", LogField::kLoss, 1, LogSource::kUnknown},
    {"train loss", LogField::kLoss, 1, LogSource::kUnknown},
    {"train/lm loss", LogField::kLoss, 1, LogSource::kUnknown},
    {"learning_rate", LogField::kLr, 1, LogSource::kUnknown},
    {"lr", LogField::kLr, 1, LogSource::kUnknown},
    {"train/lr", LogField::kLr, 1, LogSource::kUnknown},
    {"loss_scale", LogField::kLossScale, 1, LogSource::kUnknown},
    {"step_time_s", LogField::kStepTime, 1, LogSource::kUnknown},
    {"max_attn_logit", LogField::kMaxAttnLogit, 1, LogSource::kUnknown},
    {"train/max_attn_logit", LogField::kMaxAttnLogit, 1, LogSource::kUnknown},
    {"log_z", LogField::kLogZ, 1, LogSource::kUnknown},
    {"train/log_z", LogField::kLogZ, 1, LogSource::kUnknown},
    {"skipped", LogField::kSkipped, 1, LogSource::kUnknown},
    // MoE aggregates: Megatron-Core (console and TensorBoard), OLMo-core,
    // fairseq (its gate loss is E x sum f_i P_i: 1.0 at balance).
    {"load_balancing_loss", LogField::kMoeAuxLoss, 1, LogSource::kMegatron},
    {"z_loss", LogField::kMoeZLoss, 1, LogSource::kMegatron},
    {"train/load balancing loss unscaled", LogField::kMoeAuxLoss, 1, LogSource::kUnknown},
    {"load balancing loss unscaled", LogField::kMoeAuxLoss, 1, LogSource::kUnknown},
    {"train/router z loss unscaled", LogField::kMoeZLoss, 1, LogSource::kUnknown},
    {"router z loss unscaled", LogField::kMoeZLoss, 1, LogSource::kUnknown},
    {"moe_gate_loss", LogField::kMoeAuxLoss, 1, LogSource::kUnknown},
    {"moe_aux_loss", LogField::kMoeAuxLoss, 1, LogSource::kUnknown},
    {"moe_z_loss", LogField::kMoeZLoss, 1, LogSource::kUnknown},
};

constexpr struct {
  LogField field;
  absl::string_view name;
} kFieldNames[] = {
    {LogField::kGradNorm, "grad_norm"},
    {LogField::kLoss, "loss"},
    {LogField::kLr, "lr"},
    {LogField::kLossScale, "loss_scale"},
    {LogField::kStepTime, "step_time_s"},
    {LogField::kMaxAttnLogit, "max_attn_logit"},
    {LogField::kLogZ, "log_z"},
    {LogField::kSkipped, "skipped"},
    {LogField::kMoeAuxLoss, "moe_aux_loss"},
    {LogField::kMoeZLoss, "moe_z_loss"},
};

// A run of non-finite norms longer than this (in steps) is not a scaler
// backing off: a GradScaler starting at 2^16 reaches 1 in 16 overflows.
constexpr uint64_t kMaxOverflowStreak = 50;
// The LR counts as warmed up once it reaches this share of its peak.
constexpr double kWarmupPeakShare = 0.99;

std::string Lower(absl::string_view text) {
  return absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
}

std::string Range(uint64_t first, uint64_t last) {
  return first == last ? absl::StrCat("step ", first)
                       : absl::StrCat("steps ", first, "..", last);
}

absl::string_view SourceFramework(LogSource source) {
  switch (source) {
    case LogSource::kHuggingFace:
      return "the Hugging Face Trainer";
    case LogSource::kMegatron:
      return "Megatron-LM";
    case LogSource::kLightning:
      return "PyTorch Lightning";
    default:
      return "";
  }
}

// Precision given or inferred, and the labels that say how.
void DecidePrecision(const LoggedRun& run, const ImportSettings& settings,
                     bool any_scale, bool scale_not_one, ImportPlan* plan) {
  if (settings.precision.has_value()) {
    plan->precision = *settings.precision;
  } else if (scale_not_one) {
    plan->precision = Precision::kFp16;
    plan->notes.push_back(
        "precision: fp16, inferred from the loss scale the log records");
  } else {
    plan->notes.push_back(
        "precision: not known (give --precision); fp16 checks run only on "
        "steps that carry a loss scale");
  }
  if (plan->precision == Precision::kFp16 && !any_scale) {
    // The log cannot show a scaler; HF and Lightning always add one to fp16.
    const absl::string_view who = SourceFramework(run.source);
    plan->notes.push_back(absl::StrCat(
        "loss scale: fp16, but the log does not record the loss scale; a "
        "GradScaler is inferred (",
        who.empty() ? "a log cannot show its absence"
                    : absl::StrCat(who, " always uses one with fp16"),
        "), so the run is sent without a precision: Fp16WithoutScaler, "
        "LossScaleCollapse and SkipRateHigh are not judged; skips are "
        "inferred from non-finite norms"));
    plan->precision = Precision::kUnspecified;
    plan->labels["precision"] = "fp16";
    plan->labels["loss_scaler"] = "inferred";
  }
}

// Warmup from the LR ramp: the LR rises from well below its peak to the peak.
void DecideWarmup(const LoggedRun& run, const ImportSettings& settings,
                  ImportPlan* plan) {
  std::vector<std::pair<uint64_t, double>> lr;
  for (const auto& [step, s] : run.steps) {
    if (s.lr.has_value() && std::isfinite(*s.lr)) lr.emplace_back(step, *s.lr);
  }
  std::optional<uint64_t> inferred;
  std::string how;
  if (lr.size() >= 2) {
    double peak = 0;
    for (const auto& [step, v] : lr) peak = std::max(peak, v);
    size_t at_peak = 0;
    while (lr[at_peak].second < kWarmupPeakShare * peak) ++at_peak;
    bool rising = true;
    for (size_t i = 1; i <= at_peak; ++i) {
      // Tolerates print rounding, not a schedule going down.
      if (lr[i].second < lr[i - 1].second * 0.999) rising = false;
    }
    if (at_peak > 0 && rising && lr[0].second <= 0.5 * peak) {
      inferred = lr[at_peak].first;
      how = absl::StrFormat("lr %.3g at step %d rising to %.3g at step %d",
                            lr[0].second, lr[0].first, lr[at_peak].second,
                            lr[at_peak].first);
    } else {
      inferred = 0;
      how = absl::StrFormat("lr starts at %.3g of its peak %.3g",
                            lr[0].second / peak, peak);
    }
  }
  if (settings.warmup_steps.has_value()) {
    plan->warmup_steps = *settings.warmup_steps;
    if (inferred.has_value() && *inferred != plan->warmup_steps) {
      plan->notes.push_back(absl::StrCat(
          "warmup: ", plan->warmup_steps, " steps as given (the LR ramp says ",
          *inferred, ": ", how, ")"));
    }
    return;
  }
  if (!inferred.has_value()) {
    plan->notes.push_back(
        "warmup: 0 steps (the log has no learning rate to infer it from; "
        "give --warmup-steps)");
    return;
  }
  plan->warmup_steps = *inferred;
  plan->notes.push_back(absl::StrCat("warmup: ", *inferred,
                                     " steps, inferred from the LR ramp (",
                                     how, ")"));
}

void DecideMaxNorm(const LoggedRun& run, const ImportSettings& settings,
                   ImportPlan* plan) {
  if (settings.max_norm.has_value()) {
    plan->max_norm = *settings.max_norm;
    return;
  }
  switch (run.source) {
    case LogSource::kHuggingFace:
      plan->max_norm = 1.0;
      plan->notes.push_back(
          "max_norm: 1.0, the Hugging Face Trainer's default max_grad_norm "
          "(give --max-norm if the run set another)");
      return;
    case LogSource::kMegatron:
      plan->max_norm = 1.0;
      plan->notes.push_back(
          "max_norm: 1.0, Megatron-LM's and GPT-NeoX's default clip-grad "
          "(give --max-norm if the run set another)");
      return;
    default:
      plan->notes.push_back(
          "max_norm: not known, clipping not judged (give --max-norm)");
  }
}


// Which loss scales the log records: a scale of 1.0 on every logged step is
// no loss scaling at all (bf16 or fp32), and is not sent.
struct LossScales {
  bool any = false;
  bool not_one = false;
  bool unit_only() const { return any && !not_one; }
};

LossScales ReadLossScales(const LoggedRun& run, ImportPlan* plan) {
  LossScales scales;
  for (const auto& [step, s] : run.steps) {
    if (!s.loss_scale.has_value()) continue;
    scales.any = true;
    if (*s.loss_scale != 1.0) scales.not_one = true;
  }
  if (scales.unit_only()) {
    plan->notes.push_back(
        "loss scale: 1.0 on every logged step, i.e. no loss scaling (bf16 or "
        "fp32): not sent");
  }
  return scales;
}

// Says how many norms are logging artifacts (IsZeroNormArtifact) and
// whether any usable norm is left; without one the run is "norm blind":
// sent for its loss, LR and loss scale with grad_norm 0 and no clipping.
bool DecideNormBlind(const LoggedRun& run, ImportPlan* plan) {
  uint64_t zero_norms = 0, first_zero = 0, last_zero = 0;
  bool any_norm = false;
  for (const auto& [step, s] : run.steps) {
    if (!s.grad_norm.has_value()) continue;
    if (IsZeroNormArtifact(s)) {
      if (zero_norms++ == 0) first_zero = step;
      last_zero = step;
    } else {
      any_norm = true;
    }
  }
  if (zero_norms > 0) {
    plan->notes.push_back(absl::StrCat(
        "grad norm: ", zero_norms, " logged norms are exactly 0.0 while the "
        "loss is not (", Range(first_zero, last_zero),
        "): logging artifacts, not a collapse; those norms are dropped"));
  }
  if (any_norm) return false;
  plan->notes.push_back(
      "grad norm: none usable in the log, so the clip fraction, spikes, "
      "drift and the recommended max_norm cannot be judged; steps are sent "
      "with grad_norm 0 for their loss, LR and loss scale");
  plan->max_norm = 0;
  plan->labels["grad_norm"] = "not logged";
  return true;
}

// One tensor's FP8 stats as sent: a format the log does not give is the
// HYBRID recipe's, and an overflow/underflow share outside [0, 1] (which the
// server would refuse the batch for) is left out.
v1::Fp8TensorStats Fp8Record(const std::string& tensor,
                             const v1::Fp8TensorStats& logged,
                             RecordCounts* counts) {
  v1::Fp8TensorStats f = logged;
  if (f.format() == v1::FP8_FORMAT_UNSPECIFIED) {
    // Transformer Engine's HYBRID recipe: E4M3 forward, E5M2 gradients.
    f.set_format(absl::StrContains(Lower(tensor), "grad") ? v1::E5M2 : v1::E4M3);
    ++counts->fp8_unformatted;
  }
  for (auto [has, get, clear] :
       {std::tuple{&v1::Fp8TensorStats::has_overflow_fraction,
                   &v1::Fp8TensorStats::overflow_fraction,
                   &v1::Fp8TensorStats::clear_overflow_fraction},
        std::tuple{&v1::Fp8TensorStats::has_underflow_fraction,
                   &v1::Fp8TensorStats::underflow_fraction,
                   &v1::Fp8TensorStats::clear_underflow_fraction}}) {
    const double v = (f.*get)();
    if ((f.*has)() && std::isfinite(v) && (v < 0 || v > 1)) {
      (f.*clear)();
      ++counts->fp8_bad_shares;
    }
  }
  return f;
}

// What MakeRecord() counted, one note each.
void NoteRecordCounts(const RecordCounts& counts, ImportPlan* plan) {
  if (counts.reported_skips > 0) {
    plan->notes.push_back(absl::StrCat("skipped steps: ", counts.reported_skips,
                                       " steps the log reports as skipped"));
  }
  if (counts.fp8_unformatted > 0) {
    plan->notes.push_back(absl::StrCat(
        "fp8: ", counts.fp8_unformatted, " tensor reports without a fp8/<tensor>/format "
        "column read as E4M3 (E5M2 for names with \"grad\": the HYBRID recipe)"));
  }
  if (counts.fp8_bad_shares > 0) {
    plan->notes.push_back(absl::StrCat(
        "fp8: ", counts.fp8_bad_shares, " overflow/underflow values outside [0, 1] left out"));
  }
  if (counts.moe_reports > 0) {
    plan->notes.push_back(absl::StrCat(
        "moe: ", counts.moe_reports,
        " layer reports of the balancing loss and router z-loss only (no "
        "per-expert counts): MoeAuxLossOffBalance and MoeRouterZLossGrowth "
        "judge them; collapse, dead experts, imbalance, drops and the EP "
        "ranks need tokens_per_expert, which the log does not carry"));
  }
  if (counts.no_norm > 0) {
    plan->notes.push_back(absl::StrCat(
        "left out: ", counts.no_norm,
        " logged steps carry other values but no grad norm (a record needs "
        "one)"));
  }
}

// Logging every N steps: the windows hold logged points, not every step.
// N is the median gap between the records' steps, or the interval the log
// declares if larger.
void NoteSparseLog(const LoggedRun& run, ImportPlan* plan) {
  std::vector<uint64_t> gaps;
  for (size_t i = 1; i < plan->records.size(); ++i) {
    gaps.push_back(plan->records[i].step() - plan->records[i - 1].step());
  }
  if (gaps.empty()) return;
  std::nth_element(gaps.begin(), gaps.begin() + gaps.size() / 2, gaps.end());
  const uint64_t every = std::max<uint64_t>(gaps[gaps.size() / 2],
                                            run.logging_steps.value_or(1));
  if (every <= 1) return;
  plan->labels["logged_every"] = absl::StrCat(every);
  plan->notes.push_back(absl::StrCat(
      "sparse log: one point every ", every,
      " steps; the windows hold logged points (the server's W, window_steps, "
      "spans W x ", every, " steps: ", 1000 * every,
      " at its default 1000) and the clip fraction is a sample of the logged "
      "steps, not of every step"));
}

}  // namespace

absl::string_view LogFieldName(LogField field) {
  for (const auto& f : kFieldNames) {
    if (f.field == field) return f.name;
  }
  return "?";
}

std::optional<LogField> LogFieldFromName(absl::string_view name) {
  for (const auto& f : kFieldNames) {
    if (f.name == name) return f.field;
  }
  return std::nullopt;
}

absl::string_view LogSourceName(LogSource source) {
  switch (source) {
    case LogSource::kHuggingFace:
      return "hf";
    case LogSource::kMegatron:
      return "megatron";
    case LogSource::kLightning:
      return "lightning";
    default:
      return "unknown";
  }
}

absl::Status AddTagMapping(absl::string_view spec, TagMap* map) {
  const size_t eq = spec.rfind('=');
  if (eq == absl::string_view::npos || eq == 0) {
    return absl::InvalidArgumentError(absl::StrCat("--map wants TAG=field, got \"", spec, "\""));
  }
  std::optional<LogField> field = LogFieldFromName(spec.substr(eq + 1));
  if (!field.has_value()) {
    std::vector<absl::string_view> names;
    for (const auto& f : kFieldNames) names.push_back(f.name);
    return absl::InvalidArgumentError(absl::StrCat("--map ", spec, ": the field must be one of ",
                                   absl::StrJoin(names, ", ")));
  }
  (*map)[Lower(spec.substr(0, eq))] = *field;
  return absl::OkStatus();
}

// The stats an fp8/<tensor>/<stat> column may hold.
constexpr absl::string_view kFp8Stats[] = {
    "format", "amax", "scale", "amax_history_len", "margin",
    "overflow_fraction", "underflow_fraction"};

std::optional<TagTarget> LookUpTag(absl::string_view tag, const TagMap& user) {
  const std::string key = Lower(tag);
  if (auto it = user.find(key); it != user.end()) {
    return TagTarget{.field = it->second};
  }
  // fp8/<tensor>/<stat>: the tensor name keeps its case and may hold '/'.
  if (absl::StartsWith(key, "fp8/")) {
    const absl::string_view trimmed = absl::StripAsciiWhitespace(tag);
    const size_t cut = trimmed.rfind('/');
    const std::string stat = Lower(trimmed.substr(cut + 1));
    const absl::string_view tensor = trimmed.substr(4, cut > 4 ? cut - 4 : 0);
    if (cut > 4 && !tensor.empty() &&
        std::find(std::begin(kFp8Stats), std::end(kFp8Stats), stat) != std::end(kFp8Stats)) {
      return TagTarget{.field = LogField::kGradNorm,
                       .fp8 = TagTarget::Fp8Column{std::string(tensor), stat}};
    }
    return std::nullopt;
  }
  // Megatron-Core's per-layer MoE series: moe/<name>_layer_<i>.
  if (absl::StartsWith(key, "moe/")) {
    const size_t at = key.rfind("_layer_");
    if (at == std::string::npos || at <= 4) return std::nullopt;
    const std::string name = key.substr(4, at - 4);
    const std::string layer = key.substr(at + 7);
    if (layer.empty() || !std::all_of(layer.begin(), layer.end(), [](char c) { return absl::ascii_isdigit(c); })) return std::nullopt;
    if (name == "load_balancing_loss") {
      return TagTarget{.field = LogField::kMoeAuxLoss, .moe_layer = layer};
    }
    if (name == "z_loss") return TagTarget{.field = LogField::kMoeZLoss, .moe_layer = layer};
    return std::nullopt;
  }
  // Megatron writes each series again against consumed samples (and
  // tokens): the step of those copies is not an iteration.
  if (absl::EndsWith(key, " vs samples") || absl::EndsWith(key, " vs tokens")) {
    return std::nullopt;
  }
  for (const TagEntry& e : kTags) {
    if (e.tag == key) return TagTarget{.field = e.field, .scale = e.scale};
  }
  return std::nullopt;
}

LogSource SourceOfTag(absl::string_view tag) {
  const std::string key = Lower(tag);
  for (const TagEntry& e : kTags) {
    if (e.tag == key) return e.source;
  }
  return LogSource::kUnknown;
}

void LoggedRun::Set(uint64_t step, const TagTarget& target, double value) {
  if (!target.moe_layer.empty()) {
    v1::MoeLayerStats& layer = steps[step].moe[target.moe_layer];
    layer.set_layer(target.moe_layer);
    if (target.field == LogField::kMoeAuxLoss) layer.set_aux_loss(value);
    if (target.field == LogField::kMoeZLoss) layer.set_z_loss(value);
    return;
  }
  if (!target.fp8.has_value()) return Set(step, target.field, value * target.scale);
  v1::Fp8TensorStats& f = steps[step].fp8[target.fp8->tensor];
  const std::string& stat = target.fp8->stat;
  if (stat == "format") {
    const int code = std::isfinite(value) ? static_cast<int>(value) : 0;
    f.set_format(code == value && v1::Fp8Format_IsValid(code)
                     ? static_cast<v1::Fp8Format>(code)
                     : v1::FP8_FORMAT_UNSPECIFIED);
  } else if (stat == "amax") {
    f.set_amax(value);
  } else if (stat == "scale") {
    f.set_scale(value);
  } else if (stat == "amax_history_len") {
    f.set_amax_history_len(std::isfinite(value) && value > 0
                               ? static_cast<uint32_t>(std::min(value, 4294967295.0))
                               : 0);
  } else if (stat == "margin") {
    f.set_margin(value);
  } else if (stat == "overflow_fraction") {
    f.set_overflow_fraction(value);
  } else if (stat == "underflow_fraction") {
    f.set_underflow_fraction(value);
  }
}

void LoggedRun::Set(uint64_t step, LogField field, double value) {
  LoggedStep& s = steps[step];
  auto put = [&](std::optional<double>& slot) {
    if (slot.has_value()) ++overwritten;
    slot = value;
  };
  switch (field) {
    case LogField::kGradNorm:
      return put(s.grad_norm);
    case LogField::kLoss:
      return put(s.loss);
    case LogField::kLr:
      return put(s.lr);
    case LogField::kLossScale:
      return put(s.loss_scale);
    case LogField::kStepTime:
      return put(s.step_time_s);
    case LogField::kMaxAttnLogit:
      return put(s.max_attn_logit);
    case LogField::kLogZ:
      return put(s.log_z);
    case LogField::kSkipped:
      s.skipped = std::isfinite(value) && value > 0
                      ? static_cast<uint32_t>(std::min(value, 1e9))
                      : 0;
      return;
    case LogField::kMoeAuxLoss:
    case LogField::kMoeZLoss: {
      v1::MoeLayerStats& layer = s.moe[""];
      layer.set_layer("all");
      if (field == LogField::kMoeAuxLoss) {
        if (layer.has_aux_loss()) ++overwritten;
        layer.set_aux_loss(value);
      } else {
        if (layer.has_z_loss()) ++overwritten;
        layer.set_z_loss(value);
      }
      return;
    }
  }
}

bool IsZeroNormArtifact(const LoggedStep& step) {
  return step.grad_norm.has_value() && *step.grad_norm == 0.0 &&
         step.loss.has_value() && std::isfinite(*step.loss) &&
         *step.loss != 0.0;
}

std::map<uint64_t, bool> InferSkips(const LoggedRun& run,
                                    std::vector<std::string>* notes) {
  std::map<uint64_t, bool> skipped;
  std::vector<uint64_t> streak;
  uint64_t inferred = 0, kept = 0;
  std::string kept_where;
  auto close_streak = [&](bool recovered) {
    if (streak.empty()) return;
    const bool skip =
        recovered && streak.back() - streak.front() < kMaxOverflowStreak;
    for (uint64_t st : streak) skipped[st] = skip;
    if (skip) {
      inferred += streak.size();
    } else {
      kept += streak.size();
      if (kept_where.empty()) {
        kept_where = Range(streak.front(), streak.back());
      }
    }
    streak.clear();
  };
  for (const auto& [step, s] : run.steps) {
    if (!s.grad_norm.has_value() || s.skipped > 0) continue;
    if (!std::isfinite(*s.grad_norm)) {
      streak.push_back(step);
    } else {
      close_streak(true);
    }
  }
  close_streak(false);
  if (inferred > 0) {
    notes->push_back(absl::StrCat(
        "skipped steps: ", inferred,
        " logged steps with a non-finite grad norm are read as skipped "
        "(the run logged finite norms within ",
        kMaxOverflowStreak, " steps after each, so the update was not "
        "applied)"));
  }
  if (kept > 0) {
    notes->push_back(absl::StrCat(
        "non-finite: ", kept, " logged steps with a non-finite grad norm (",
        kept_where, ") did not recover: sent as applied updates"));
  }
  return skipped;
}

std::optional<v1::StepRecord> MakeRecord(uint64_t step, const LoggedStep& logged,
                                         const RecordRules& rules,
                                         RecordCounts* counts) {
  v1::StepRecord r;
  r.set_step(step);
  bool skipped = logged.skipped > 0;
  if (skipped) ++counts->reported_skips;
  std::optional<double> norm = logged.grad_norm;
  // Dropped unless it is all the run has (DecideNormBlind says which).
  if (!rules.norm_blind && IsZeroNormArtifact(logged)) norm.reset();
  if (auto it = rules.inferred_skips.find(step);
      it != rules.inferred_skips.end()) {
    skipped = skipped || it->second;
  }
  if (!norm.has_value()) {
    if (skipped) {
      // A skipped iteration's norm is not printed: it overflowed.
      norm = std::numeric_limits<double>::infinity();
    } else if (rules.norm_blind) {
      norm = 0.0;
      r.set_clipped(false);
    } else {
      ++counts->no_norm;
      return std::nullopt;
    }
  }
  r.set_grad_norm(*norm);
  r.set_skipped(skipped);
  if (logged.loss.has_value()) {
    r.set_loss(*logged.loss);
  } else if (logged.nan_iteration && !skipped) {
    r.set_loss(std::numeric_limits<double>::quiet_NaN());
  }
  if (logged.lr.has_value()) r.set_lr(*logged.lr);
  if (logged.loss_scale.has_value() && !rules.drop_unit_scale) {
    r.set_loss_scale(*logged.loss_scale);
  }
  if (logged.step_time_s.has_value()) r.set_step_time_s(*logged.step_time_s);
  if (logged.max_attn_logit.has_value()) r.set_max_attn_logit(*logged.max_attn_logit);
  if (logged.log_z.has_value()) r.set_log_z(*logged.log_z);
  for (const auto& [tensor, stats] : logged.fp8) {
    (*r.mutable_fp8())[tensor] = Fp8Record(tensor, stats, counts);
  }
  // Per-layer series when the log has them, else the aggregate.
  const bool per_layer = logged.moe.size() > (logged.moe.count("") ? 1u : 0u);
  for (const auto& [name, layer] : logged.moe) {
    if (per_layer && name.empty()) continue;
    *r.mutable_moe()->add_layers() = layer;
    ++counts->moe_reports;
  }
  return r;
}

absl::StatusOr<ImportPlan> PlanImport(const LoggedRun& run,
                                      const ImportSettings& settings) {
  if (run.steps.empty()) {
    return absl::InvalidArgumentError(
        "no training step in it: no grad norm, loss, learning rate or loss "
        "scale under a known name (see docs/import-and-report.md, or map a "
        "name with --map TAG=field)");
  }
  ImportPlan plan;
  plan.notes = run.notes;
  plan.labels["imported_from"] = std::string(LogSourceName(run.source));

  const LossScales scales = ReadLossScales(run, &plan);
  DecidePrecision(run, settings, scales.any && !scales.unit_only(),
                  scales.not_one, &plan);
  DecideMaxNorm(run, settings, &plan);
  DecideWarmup(run, settings, &plan);
  RecordRules rules;
  rules.norm_blind = DecideNormBlind(run, &plan);
  rules.drop_unit_scale = scales.unit_only();
  rules.inferred_skips = InferSkips(run, &plan.notes);

  RecordCounts counts;
  for (const auto& [step, s] : run.steps) {
    std::optional<v1::StepRecord> record = MakeRecord(step, s, rules, &counts);
    if (record.has_value()) plan.records.push_back(*std::move(record));
  }
  NoteRecordCounts(counts, &plan);
  if (plan.records.empty()) {
    return absl::InvalidArgumentError(
        "no step with a usable grad norm, loss or learning rate");
  }
  NoteSparseLog(run, &plan);
  return plan;
}

std::optional<double> ParseLogNumber(absl::string_view text) {
  std::string s = Lower(text);
  if (s.empty()) return std::nullopt;
  bool negative = false;
  std::string body = s;
  if (body[0] == '-' || body[0] == '+') {
    negative = body[0] == '-';
    body = body.substr(1);
  }
  if (body == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (body == "inf" || body == "infinity") {
    const double inf = std::numeric_limits<double>::infinity();
    return negative ? -inf : inf;
  }
  // strtod would accept hex and "nan(...)"; logs print decimals.
  for (char c : s) {
    if (!absl::ascii_isdigit(c) && c != '.' && c != 'e' && c != '-' &&
        c != '+') {
      return std::nullopt;
    }
  }
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return v;
}

}  // namespace trainwatch::cli
