// Hugging Face trainer_state.json (the Trainer's checkpoint state): its
// log_history holds one entry per logging step ({"step", "loss",
// "grad_norm", "learning_rate", "epoch"}), eval entries ({"eval_loss"...})
// and a final summary ({"train_runtime", "train_loss"...}).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "import/import_files.h"
#include "nlohmann/json.hpp"

namespace trainwatch::cli {
namespace {

// Python's json module writes non-finite floats as bare NaN, Infinity and
// -Infinity, which JSON parsers refuse: quote them (outside strings) so they
// parse, and read them back with ParseLogNumber. Newlines are kept, so a
// parse error's offset still gives the right line.
std::string QuoteNonFinite(absl::string_view text) {
  std::string out;
  out.reserve(text.size() + 64);
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) {
        out += text[++i];
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') in_string = true;
    bool replaced = false;
    for (absl::string_view word : {"-Infinity", "Infinity", "NaN"}) {
      if (text.substr(i, word.size()) == word) {
        absl::StrAppend(&out, "\"", word, "\"");
        i += word.size() - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) out += c;
  }
  return out;
}

int64_t LineOf(absl::string_view text, size_t byte) {
  byte = std::min(byte, text.size());
  return 1 + std::count(text.begin(), text.begin() + byte, '\n');
}

std::optional<double> Number(const nlohmann::json& v) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) return ParseLogNumber(v.get<std::string>());
  return std::nullopt;
}

}  // namespace

absl::Status ParseHfTrainerState(absl::string_view text, absl::string_view name,
                                 const TagMap& map, LoggedRun* run) {
  const std::string quoted = QuoteNonFinite(text);
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(quoted);
  } catch (const nlohmann::json::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ":", LineOf(quoted, e.byte == 0 ? 0 : e.byte - 1),
        ": not valid JSON: ", e.what()));
  }
  if (!state.is_object() || !state.contains("log_history") ||
      !state["log_history"].is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": no \"log_history\" array: not a Hugging Face "
              "trainer_state.json (give --format)"));
  }
  if (state.contains("logging_steps") && state["logging_steps"].is_number()) {
    const double every = state["logging_steps"].get<double>();
    if (every >= 1 && every < 1e12) {
      run->logging_steps = static_cast<uint64_t>(every);
    }
  }
  uint64_t eval_entries = 0, summary_entries = 0;
  const nlohmann::json& history = state["log_history"];
  for (size_t i = 0; i < history.size(); ++i) {
    const nlohmann::json& entry = history[i];
    const std::string where = absl::StrCat(name, ": log_history[", i, "]");
    if (!entry.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": an entry must be an object"));
    }
    bool eval = false;
    for (const auto& [key, value] : entry.items()) {
      if (key.rfind("eval_", 0) == 0 || key.rfind("test_", 0) == 0) eval = true;
    }
    if (eval) {
      ++eval_entries;
      continue;
    }
    if (entry.contains("train_runtime")) {
      ++summary_entries;  // the run's averages, not a step
      continue;
    }
    if (!entry.contains("step")) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the entry has no \"step\""));
    }
    std::optional<double> step = Number(entry["step"]);
    if (!step.has_value() || !(*step >= 0) || *step != std::floor(*step) ||
        *step > 1e15) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": \"step\" must be a non-negative integer, got ",
          entry["step"].dump()));
    }
    for (const auto& [key, value] : entry.items()) {
      if (key == "step" || key == "epoch") continue;
      std::optional<TagTarget> target = LookUpTag(key, map);
      if (!target.has_value()) continue;
      if (value.is_null()) continue;  // e.g. grad_norm null under DeepSpeed
      std::optional<double> v = Number(value);
      if (!v.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": \"", key, "\" must be a number, got ", value.dump()));
      }
      run->Set(static_cast<uint64_t>(*step), *target, *v);
    }
  }
  if (run->source == LogSource::kUnknown) run->source = LogSource::kHuggingFace;
  if (eval_entries + summary_entries > 0) {
    run->notes.push_back(absl::StrCat(name, ": ", eval_entries,
                                      " eval entries and ", summary_entries,
                                      " summary entries ignored"));
  }
  return absl::OkStatus();
}

}  // namespace trainwatch::cli
