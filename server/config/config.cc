#include "config/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
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
#include "config/config_fields.h"
#include "health/alert_catalog.h"

namespace trainwatch {
namespace {

constexpr absl::string_view kDisabledKey = "disabled";

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
    for (const WordKey& w : WordKeys()) {
      if (w.group == group) names.push_back(w.key);
    }
    if (group.empty()) {
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
