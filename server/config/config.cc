#include "config/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <type_traits>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "health/alert_catalog.h"

namespace trainwatch {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The values a setting may take. `lo`/`hi` are inclusive unless `*_open`.
struct Range {
  double lo;
  bool lo_open;
  double hi;
  bool hi_open;
  const char* text;  // as the error message says it
};

constexpr Range kFraction = {0, true, 1, false, "in (0, 1]"};
constexpr Range kOpenFraction = {0, true, 1, true, "in (0, 1)"};
constexpr Range kPositive = {0, true, kInf, true, "> 0"};
constexpr Range kAboveOne = {1, true, kInf, true, "> 1"};
constexpr Range kCount = {1, false, std::numeric_limits<uint32_t>::max(), false,
                          "an integer >= 1"};
// Each run keeps W values per series: a typo must not cost gigabytes.
constexpr Range kWindow = {10, false, 1'000'000, false,
                           "an integer in [10, 1000000]"};
// Cross-rank digests: 12 bytes a step of lag, per run.
constexpr Range kLag = {1, false, 10'000'000, false,
                        "an integer in [1, 10000000]"};
constexpr Range kFlag = {0, false, 1, false, "true or false"};  // bools
constexpr Range kNonNegative = {0, false, kInf, true, ">= 0"};
constexpr Range kAny = {-kInf, true, kInf, true, "a finite number"};
// A tensor's last reports are kept as bits of one word.
constexpr Range kReports = {1, false, 64, false, "an integer in [1, 64]"};
constexpr Range kSeconds = {1, false, 365.0 * 24 * 3600, false,
                            "an integer in [1, 31536000]"};

bool InRange(double v, const Range& r) {
  const bool lo_ok = r.lo_open ? v > r.lo : v >= r.lo;
  const bool hi_ok = r.hi_open ? v < r.hi : v <= r.hi;
  return lo_ok && hi_ok;
}

using FieldRef = std::variant<double*, uint32_t*, int64_t*, bool*>;

// One settable value: its place in the YAML file and in the struct.
struct Field {
  absl::string_view group;  // "" at the top level
  absl::string_view key;
  Range range;
  FieldRef ref;

  std::string Dotted() const {
    return group.empty() ? std::string(key) : absl::StrCat(group, ".", key);
  }
};

// Every numeric setting of HealthConfig, in the struct's order. A field added
// to HealthConfig without a line here is not settable; config_test checks
// each one.
std::vector<Field> Fields(HealthConfig& c) {
  return {
      {"", "window_steps", kWindow, &c.window_steps},
      {"", "resolve_after_steps", kCount, &c.resolve_after_steps},
      {"change", "arl0", kAboveOne, &c.change.arl0},
      {"change", "resolve_ratio", kOpenFraction, &c.change.resolve_ratio},
      {"change", "min_steps", kCount, &c.change.min_steps},
      {"clip_fraction", "threshold", kFraction, &c.clip_fraction.threshold},
      {"clip_fraction", "min_steps", kCount, &c.clip_fraction.min_steps},
      {"clip_fraction", "recent_steps", kWindow, &c.clip_fraction.recent_steps},
      {"clip_fraction", "baseline_steps", kCount, &c.clip_fraction.baseline_steps},
      {"clip_fraction", "rise_ratio", kAboveOne, &c.clip_fraction.rise_ratio},
      {"clip_fraction", "settle_steps", kCount, &c.clip_fraction.settle_steps},
      {"spike", "sigmas", kPositive, &c.spike.sigmas},
      {"spike", "min_ratio", kAboveOne, &c.spike.min_ratio},
      {"spike", "hard_ratio", kAboveOne, &c.spike.hard_ratio},
      {"spike", "ema_beta", kOpenFraction, &c.spike.ema_beta},
      {"spike", "min_steps", kCount, &c.spike.min_steps},
      {"drift", "ratio", kAboveOne, &c.drift.ratio},
      {"drift", "lr_decay_fraction", kFraction, &c.drift.lr_decay_fraction},
      {"loss_scale", "halvings", kCount, &c.loss_scale.halvings},
      {"loss_scale", "within_steps", kCount, &c.loss_scale.within_steps},
      {"loss_scale", "min_scale", kPositive, &c.loss_scale.min_scale},
      {"loss_scale", "bleed_halvings", kCount, &c.loss_scale.bleed_halvings},
      {"skip_rate", "threshold", kFraction, &c.skip_rate.threshold},
      {"skip_rate", "min_steps", kCount, &c.skip_rate.min_steps},
      {"scaler_stuck", "consecutive", kCount, &c.scaler_stuck.consecutive},
      {"clip_before_unscale", "steps", kCount, &c.clip_before_unscale.steps},
      {"clip_before_unscale", "clip_fraction", kFraction,
       &c.clip_before_unscale.clip_fraction},
      {"clip_before_unscale", "min_norm_to_scale", kPositive,
       &c.clip_before_unscale.min_norm_to_scale},
      {"post_clip", "min_steps", kCount, &c.post_clip.min_steps},
      {"post_clip", "pile_fraction", kFraction, &c.post_clip.pile_fraction},
      {"post_clip", "min_pile", kCount, &c.post_clip.min_pile},
      {"attention", "ratio", kAboveOne, &c.attention.ratio},
      {"attention", "cap", kPositive, &c.attention.cap},
      {"attention", "horizon_steps", kCount, &c.attention.horizon_steps},
      {"log_z", "nats", kPositive, &c.log_z.nats},
      {"log_z", "horizon_steps", kCount, &c.log_z.horizon_steps},
      {"log_z", "baseline_steps", kWindow, &c.log_z.baseline_steps},
      {"loss_spike", "sigmas", kPositive, &c.loss_spike.sigmas},
      {"loss_spike", "log_sigmas", kPositive, &c.loss_spike.log_sigmas},
      {"loss_spike", "min_ratio", kAboveOne, &c.loss_spike.min_ratio},
      {"loss_spike", "stay_steps", kCount, &c.loss_spike.stay_steps},
      {"loss_spike", "stay_window", kCount, &c.loss_spike.stay_window},
      {"loss_spike", "recent_steps", kWindow, &c.loss_spike.recent_steps},
      {"loss_divergence", "level_steps", kWindow, &c.loss_divergence.level_steps},
      {"loss_divergence", "check_after_steps", kCount, &c.loss_divergence.check_after_steps},
      {"loss_divergence", "spike_ratio", kAboveOne, &c.loss_divergence.spike_ratio},
      {"loss_divergence", "ratio", kAboveOne, &c.loss_divergence.ratio},
      {"loss_divergence", "sigmas", kPositive, &c.loss_divergence.sigmas},
      {"loss_divergence", "sustain_steps", kCount, &c.loss_divergence.sustain_steps},
      {"loss_divergence", "early_ratio", kAboveOne, &c.loss_divergence.early_ratio},
      {"loss_divergence", "early_rise", kAboveOne, &c.loss_divergence.early_rise},
      {"loss_divergence", "early_sustain_steps", kCount,
       &c.loss_divergence.early_sustain_steps},
      {"loss_divergence", "resolve_ratio", kAboveOne, &c.loss_divergence.resolve_ratio},
      {"rank_mismatch", "relative_spread", kOpenFraction,
       &c.rank_mismatch.relative_spread},
      {"rank_mismatch", "horizon_steps", kLag, &c.rank_mismatch.horizon_steps},
      {"shard_mismatch", "relative_error", kOpenFraction,
       &c.shard_mismatch.relative_error},
      {"ranks", "missing_after_seconds", kSeconds,
       &c.ranks.missing_after_seconds},
      {"ranks", "max_pending_lead_records", kCount,
       &c.ranks.max_pending_lead_records},
      {"ranks", "max_pending_values", kCount, &c.ranks.max_pending_values},
      {"fp16_scaler", "steps", kCount, &c.fp16_scaler.steps},
      {"adam", "g_over_sqrt_v", kAboveOne, &c.adam.g_over_sqrt_v},
      {"adam", "jump_ratio", kAboveOne, &c.adam.jump_ratio},
      {"adam", "min_reports", kCount, &c.adam.min_reports},
      {"adam", "eps_multiple", kPositive, &c.adam.eps_multiple},
      {"adam", "stall_reports", kCount, &c.adam.stall_reports},
      {"adam", "collapse_ratio", kAboveOne, &c.adam.collapse_ratio},
      {"adam", "collapse_fraction", kFraction, &c.adam.collapse_fraction},
      {"moe", "settle_steps", kCount, &c.moe.settle_steps},
      {"moe", "level_reports", kCount, &c.moe.level_reports},
      {"moe", "collapse_top_k_multiple", kAboveOne, &c.moe.collapse_top_k_multiple},
      {"moe", "dead_steps", kCount, &c.moe.dead_steps},
      {"moe", "dead_min_reports", kCount, &c.moe.dead_min_reports},
      {"moe", "imbalance", kAboveOne, &c.moe.imbalance},
      {"moe", "horizon_steps", kCount, &c.moe.horizon_steps},
      {"moe", "aux_high", kAboveOne, &c.moe.aux_high},
      {"moe", "aux_low", kFraction, &c.moe.aux_low},
      {"moe", "z_ratio", kAboveOne, &c.moe.z_ratio},
      {"moe", "z_growth_steps", kCount, &c.moe.z_growth_steps},
      {"moe", "persist_steps", kCount, &c.moe.persist_steps},
      {"moe", "persist_reports", kCount, &c.moe.persist_reports},
      {"moe", "dropped_fraction", kFraction, &c.moe.dropped_fraction},
      {"moe", "ep_ratio", kAboveOne, &c.moe.ep_ratio},
      {"moe", "bias_mean_sd", kPositive, &c.moe.bias_mean_sd},
      {"moe", "bias_flip_share", kFraction, &c.moe.bias_flip_share},
      {"hazard", "enabled", kFlag, &c.hazard.enabled},
      {"hazard", "use_update_ratio", kFlag, &c.hazard.use_update_ratio},
      {"hazard", "window", kWindow, &c.hazard.window},
      {"hazard", "alpha", kNonNegative, &c.hazard.alpha},
      {"hazard", "theta", kAny, &c.hazard.theta},
      {"hazard", "min_layers", kCount, &c.hazard.min_layers},
      {"hazard", "cooldown_steps", kCount, &c.hazard.cooldown_steps},
      {"fp8", "overflow_fraction", kOpenFraction, &c.fp8.overflow_fraction},
      {"fp8", "underflow_fraction", kOpenFraction, &c.fp8.underflow_fraction},
      {"fp8", "reports", kReports, &c.fp8.reports},
      {"fp8", "scale_ratio", kAboveOne, &c.fp8.scale_ratio},
      {"fp8", "amax_spread", kOpenFraction, &c.fp8.amax_spread},
      {"fp8", "growth_factor", kAboveOne, &c.fp8.growth_factor},
      {"fp8", "horizon_steps", kCount, &c.fp8.horizon_steps},
      {"silent", "seconds", kSeconds, &c.silent.seconds},
      {"finished_runs", "retention_seconds", kSeconds,
       &c.finished_runs.retention_seconds},
      {"closed_loop", "max_rollbacks", kCount, &c.closed_loop.max_rollbacks},
      {"closed_loop", "min_steps_between", kCount, &c.closed_loop.min_steps_between},
      {"closed_loop", "lead_steps", kCount, &c.closed_loop.lead_steps},
      {"straggler", "slack", kAboveOne, &c.timing.straggler.slack},
      {"straggler", "threshold", kPositive, &c.timing.straggler.threshold},
      {"straggler", "clip", kAboveOne, &c.timing.straggler.clip},
      {"straggler", "ratio", kAboveOne, &c.timing.straggler.ratio},
      {"straggler", "resolve_ratio", kAboveOne,
       &c.timing.straggler.resolve_ratio},
      {"straggler", "min_ranks", kCount, &c.timing.straggler.min_ranks},
      {"straggler", "warmup_records", kCount,
       &c.timing.straggler.warmup_records},
      {"input_stall", "fraction", kFraction, &c.timing.input_stall.fraction},
      {"input_stall", "resolve_fraction", kFraction,
       &c.timing.input_stall.resolve_fraction},
      {"goodput", "gap_factor", kAboveOne, &c.timing.goodput.gap_factor},
      {"goodput", "min_gap_seconds", kPositive,
       &c.timing.goodput.min_gap_seconds},
      {"spike_replay", "judge_after_steps", kCount,
       &c.timing.spike_replay.judge_after_steps},
      {"spike_replay", "tolerance_steps", kCount,
       &c.timing.spike_replay.tolerance_steps},
      {"host_suspect", "window_seconds", kSeconds,
       &c.host_suspect.window_seconds},
      {"host_suspect", "min_runs", kCount, &c.host_suspect.min_runs},
  };
}

constexpr absl::string_view kDisabledKey = "disabled";

// The groups of `fields`, in the order they first appear.
std::vector<absl::string_view> Groups(const std::vector<Field>& fields) {
  std::vector<absl::string_view> groups;
  for (const Field& f : fields) {
    if (!f.group.empty() && std::find(groups.begin(), groups.end(), f.group) == groups.end()) {
      groups.push_back(f.group);
    }
  }
  return groups;
}

// Builds "NAME:LINE: message" errors. yaml-cpp counts lines from 0.
class Errors {
 public:
  explicit Errors(const std::string& name) : name_(name) {}

  absl::Status At(const YAML::Mark& mark, absl::string_view message) const {
    if (mark.is_null() || mark.line < 0) {
      return absl::InvalidArgumentError(absl::StrCat(name_, ": ", message));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ":", mark.line + 1, ": ", message));
  }

 private:
  const std::string& name_;
};

absl::string_view NodeKind(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "nothing";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    default:
      return "a scalar";
  }
}

// A value's mark, or its key's when the value is empty (yaml-cpp places an
// empty value where the next token starts, often on the next line).
YAML::Mark MarkOf(const YAML::Node& value, const YAML::Node& key) {
  const YAML::Mark m = value.Mark();
  return value.IsNull() || m.is_null() || m.line < 0 ? key.Mark() : m;
}

absl::Status SetField(const Field& field, const YAML::Node& key,
                      const YAML::Node& value, const Errors& errors) {
  const YAML::Mark mark = MarkOf(value, key);
  const std::string name = field.Dotted();
  if (bool* const* flag = std::get_if<bool*>(&field.ref)) {
    // true or false (0 and 1 too: the files before bools were bools).
    const std::string text = value.IsScalar() && value.Tag() != "!" ? value.Scalar() : "";
    if (text == "true" || text == "1") {
      **flag = true;
    } else if (text == "false" || text == "0") {
      **flag = false;
    } else {
      return errors.At(mark, absl::StrCat(name, ": expected true or false, got ",
                                          value.IsScalar() ? absl::StrCat("'", text, "'")
                                                           : NodeKind(value)));
    }
    return absl::OkStatus();
  }
  const bool integer = !std::holds_alternative<double*>(field.ref);
  const char* wanted = integer ? "an integer" : "a number";
  // A quoted scalar is a string in YAML, even "0.05".
  if (!value.IsScalar() || value.Tag() == "!") {
    return errors.At(mark, absl::StrCat(name, ": expected ", wanted, ", got ",
                                        value.IsScalar() ? "a string"
                                                         : NodeKind(value)));
  }
  const std::string& text = value.Scalar();
  double v = 0;
  if (integer) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(text, &n)) {
      return errors.At(mark, absl::StrCat(name, ": expected ", wanted,
                                          ", got '", text, "'"));
    }
    v = static_cast<double>(n);
  } else if (!absl::SimpleAtod(text, &v) || !std::isfinite(v)) {
    return errors.At(mark, absl::StrCat(name, ": expected ", wanted, ", got '",
                                        text, "'"));
  }
  if (!InRange(v, field.range)) {
    return errors.At(mark, absl::StrCat(name, " must be ", field.range.text,
                                        ", got ", text));
  }
  std::visit(
      [v](auto* p) { *p = static_cast<std::remove_pointer_t<decltype(p)>>(v); },
      field.ref);
  return absl::OkStatus();
}

std::string KnownAlertnames() {
  std::vector<std::string> names;
  for (const AlertSpec& spec : AllAlertSpecs()) names.emplace_back(spec.name);
  return absl::StrJoin(names, ", ");
}

absl::Status SetDisabled(const YAML::Node& key, const YAML::Node& value,
                         const Errors& errors, std::set<std::string>* out) {
  if (value.IsNull()) return absl::OkStatus();
  if (!value.IsSequence()) {
    return errors.At(MarkOf(value, key),
                     absl::StrCat("disabled: expected a list of alertnames, got ",
                                  NodeKind(value)));
  }
  for (const YAML::Node& item : value) {
    if (!item.IsScalar()) {
      return errors.At(MarkOf(item, key),
                       absl::StrCat("disabled: expected an alertname, got ",
                                    NodeKind(item)));
    }
    if (!AlertKindByName(item.Scalar()).has_value()) {
      return errors.At(item.Mark(),
                       absl::StrCat("disabled: unknown alertname '",
                                    item.Scalar(), "' (known: ",
                                    KnownAlertnames(), ")"));
    }
    out->insert(item.Scalar());
  }
  return absl::OkStatus();
}

// closed_loop.mode (a word) and closed_loop.auto (a list of actions), the
// closed loop's settings that are not numbers.
absl::Status SetClosedLoopWords(const YAML::Node& key, const YAML::Node& value,
                                const Errors& errors, ClosedLoopConfig* out) {
  if (key.Scalar() == "mode") {
    std::optional<ClosedLoopConfig::Mode> mode;
    if (value.IsScalar()) mode = ParseClosedLoopMode(value.Scalar());
    if (!mode.has_value()) {
      return errors.At(MarkOf(value, key),
                       "closed_loop.mode: expected off, propose or auto");
    }
    out->mode = *mode;
    return absl::OkStatus();
  }
  if (!value.IsSequence()) {
    return errors.At(MarkOf(value, key),
                     absl::StrCat("closed_loop.auto: expected a list of actions, got ",
                                  NodeKind(value)));
  }
  out->auto_actions.clear();
  for (const auto& item : value) {
    const bool known =
        item.IsScalar() && std::any_of(std::begin(kDirectiveActions), std::end(kDirectiveActions),
                                       [&](const char* a) { return item.Scalar() == a; });
    if (!known) {
      return errors.At(item.Mark(),
                       "closed_loop.auto: expected actions among checkpoint_now, skip, "
                       "rollback, scale_lr, stop");
    }
    out->auto_actions.insert(item.Scalar());
  }
  return absl::OkStatus();
}

// Parses a parsed document into `config`. `lines` gets the 1-based line of
// every key set, by dotted name, for the checks across keys.
absl::Status Apply(const YAML::Node& root, const Errors& errors,
                   HealthConfig* config, std::map<std::string, int>* lines) {
  if (root.IsNull()) return absl::OkStatus();
  if (!root.IsMap()) {
    return errors.At(root.Mark(),
                     absl::StrCat("expected a map of settings at the top level, "
                                  "got ",
                                  NodeKind(root)));
  }
  const std::vector<Field> fields = Fields(*config);
  auto find = [&](absl::string_view group, absl::string_view key) -> const Field* {
    for (const Field& f : fields) {
      if (f.group == group && f.key == key) return &f;
    }
    return nullptr;
  };
  // The keys allowed in `group` ("" for the top level), for error messages.
  auto known_in = [&](absl::string_view group) {
    std::vector<absl::string_view> names;
    for (const Field& f : fields) {
      if (f.group == group) names.push_back(f.key);
    }
    if (group == "closed_loop") {
      names.push_back("mode");
      names.push_back("auto");
    }
    if (group.empty()) {
      names.push_back(kDisabledKey);
      for (absl::string_view g : Groups(fields)) names.push_back(g);
    }
    return absl::StrJoin(names, ", ");
  };
  // Records a key, refusing one given twice (yaml-cpp keeps both).
  auto note = [&](const std::string& dotted,
                  const YAML::Node& key) -> absl::Status {
    const int line = key.Mark().line + 1;
    auto [it, inserted] = lines->emplace(dotted, line);
    if (!inserted) {
      return errors.At(key.Mark(), absl::StrCat("duplicate key '", dotted,
                                               "' (first at line ",
                                               it->second, ")"));
    }
    return absl::OkStatus();
  };

  for (const auto& top : root) {
    const YAML::Node& key = top.first;
    const YAML::Node& value = top.second;
    if (!key.IsScalar()) {
      return errors.At(key.Mark(), "keys must be plain names");
    }
    const std::string& name = key.Scalar();
    if (absl::Status s = note(name, key); !s.ok()) return s;
    if (name == kDisabledKey) {
      if (absl::Status s = SetDisabled(key, value, errors, &config->disabled);
          !s.ok()) {
        return s;
      }
      continue;
    }
    if (const Field* field = find("", name); field != nullptr) {
      if (absl::Status s = SetField(*field, key, value, errors); !s.ok()) {
        return s;
      }
      continue;
    }
    const bool is_group =
        std::any_of(fields.begin(), fields.end(),
                    [&](const Field& f) { return f.group == name; });
    if (!is_group) {
      return errors.At(key.Mark(), absl::StrCat("unknown key '", name,
                                               "' (known: ", known_in(""),
                                               ")"));
    }
    if (value.IsNull()) continue;  // every key of the group commented out
    if (!value.IsMap()) {
      return errors.At(MarkOf(value, key),
                       absl::StrCat(name, ": expected a map of settings, got ",
                                    NodeKind(value)));
    }
    for (const auto& inner : value) {
      const YAML::Node& sub = inner.first;
      if (!sub.IsScalar()) {
        return errors.At(sub.Mark(), "keys must be plain names");
      }
      const std::string dotted = absl::StrCat(name, ".", sub.Scalar());
      if (name == "closed_loop" && (sub.Scalar() == "mode" || sub.Scalar() == "auto")) {
        if (absl::Status s = note(dotted, sub); !s.ok()) return s;
        if (absl::Status s = SetClosedLoopWords(sub, inner.second, errors, &config->closed_loop);
            !s.ok()) {
          return s;
        }
        continue;
      }
      const Field* f = find(name, sub.Scalar());
      if (f == nullptr) {
        return errors.At(sub.Mark(), absl::StrCat("unknown key '", dotted,
                                                 "' (", name, " has: ",
                                                 known_in(name), ")"));
      }
      if (absl::Status s = note(dotted, sub); !s.ok()) return s;
      if (absl::Status s = SetField(*f, sub, inner.second, errors); !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

// Settings that are each in range but together make an alert impossible.
absl::Status CheckAcrossKeys(const HealthConfig& c,
                             const std::map<std::string, int>& lines,
                             const std::string& name) {
  const std::pair<const char*, uint32_t> needs_window[] = {
      {"clip_fraction.min_steps", c.clip_fraction.min_steps},
      {"skip_rate.min_steps", c.skip_rate.min_steps},
      {"post_clip.min_steps", c.post_clip.min_steps},
  };
  for (const auto& [key, min_steps] : needs_window) {
    if (min_steps <= c.window_steps) continue;
    // Blame the key the file set (one of the two was set: defaults agree).
    auto it = lines.find(key);
    if (it == lines.end()) it = lines.find("window_steps");
    const int line = it == lines.end() ? 0 : it->second;
    return absl::InvalidArgumentError(absl::StrCat(
        name, ":", line, ": ", key, " (", min_steps,
        ") exceeds window_steps (", c.window_steps,
        "): the alert could never fire"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HealthConfig> ParseHealthConfig(
    const std::string& yaml_text, const std::string& name_for_errors) {
  const Errors errors(name_for_errors);
  HealthConfig config;
  std::map<std::string, int> lines;
  // yaml-cpp reports through exceptions; none leaves this function.
  try {
    const YAML::Node root = YAML::Load(yaml_text);
    if (absl::Status s = Apply(root, errors, &config, &lines); !s.ok()) {
      return s;
    }
  } catch (const YAML::Exception& e) {
    return errors.At(e.mark, e.msg);
  }
  if (absl::Status s = CheckAcrossKeys(config, lines, name_for_errors);
      !s.ok()) {
    return s;
  }
  return config;
}

std::string PrintHealthConfig(const HealthConfig& config) {
  HealthConfig copy = config;  // Fields() takes pointers into a mutable config
  const std::vector<Field> fields = Fields(copy);
  const auto value = [](const FieldRef& ref) {
    return std::visit(
        [](auto* p) -> std::string {
          if constexpr (std::is_same_v<decltype(p), bool*>) {
            return *p ? "true" : "false";
          } else if constexpr (std::is_same_v<decltype(p), double*>) {
            char buf[32];  // the shortest text that reads back to the same double
            const auto r = std::to_chars(buf, buf + sizeof buf, *p);
            return std::string(buf, r.ptr);
          } else {
            return absl::StrCat(*p);
          }
        },
        ref);
  };
  std::string out;
  for (const Field& f : fields) {
    if (f.group.empty()) absl::StrAppend(&out, f.key, ": ", value(f.ref), "\n");
  }
  absl::StrAppend(&out, kDisabledKey, ": [",
                  absl::StrJoin(config.disabled, ", "), "]\n");
  for (absl::string_view group : Groups(fields)) {
    absl::StrAppend(&out, group, ":\n");
    for (const Field& f : fields) {
      if (f.group == group) absl::StrAppend(&out, "  ", f.key, ": ", value(f.ref), "\n");
    }
    if (group == "closed_loop") {
      absl::StrAppend(&out, "  mode: ", ClosedLoopModeName(config.closed_loop.mode), "\n",
                      "  auto: [", absl::StrJoin(config.closed_loop.auto_actions, ", "),
                      "]\n");
    }
  }
  return out;
}

absl::StatusOr<HealthConfig> LoadHealthConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read config ", path, ": ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("read error in config ", path));
  }
  return ParseHealthConfig(text.str(), path);
}

}  // namespace trainwatch
