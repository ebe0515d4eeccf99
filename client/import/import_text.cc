// Text logs: training stdout (Megatron-LM, Megatron-DeepSpeed, GPT-NeoX,
// llm.c, DeepSpeed's overflow lines) and CSV with a step column.
#include <cmath>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "import/import_files.h"
#include "import/import_text.h"

namespace trainwatch::cli {
namespace {

// "iteration      100/  500000 |" (Megatron, GPT-NeoX) and "step    1/19073 |"
// (llm.c).
const std::regex& IterationPattern() {
  static const auto* re =
      new std::regex(R"((?:^|[\s|\]])(?:iteration|step)\s+(\d+)\s*/\s*(\d+))");
  return *re;
}

// DeepSpeed: "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss
// scale: 65536, reducing to 32768" and "Overflow detected. Skipping step.
// Attempted loss scale: 4096, reducing to 2048".
const std::regex& OverflowPattern() {
  static const auto* re = new std::regex(
      R"((?:OVERFLOW!|Overflow detected\.).*?reducing to\s+([0-9.eE+-]+))",
      std::regex::icase);
  return *re;
}

// llm.c's own log file (-o): "s:100 trl:3.2164 lr:0.0006 norm:0.31".
const std::regex& LlmcLogPattern() {
  static const auto* re = new std::regex(R"(^s:(\d+)\s+(.*)$)");
  return *re;
}

bool IsStepColumn(absl::string_view name) {
  for (absl::string_view s : {"step", "iteration", "global_step", "_step",
                              "trainer/global_step", "iter"}) {
    if (name == s) return true;
  }
  return false;
}

std::optional<uint64_t> ParseStep(absl::string_view text) {
  uint64_t step;
  if (absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &step)) return step;
  // Exports from trackers write steps as floats ("100.0").
  std::optional<double> v = ParseLogNumber(text);
  if (v.has_value() && *v >= 0 && *v == std::floor(*v) && *v < 1e18) {
    return static_cast<uint64_t>(*v);
  }
  return std::nullopt;
}

// Splits a CSV line (RFC 4180 quoting: "a,b" and "" inside quotes).
std::vector<std::string> SplitCsv(absl::string_view line) {
  std::vector<std::string> cells(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cells.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cells.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      cells.emplace_back();
    } else {
      cells.back() += c;
    }
  }
  return cells;
}

// A segment of an iteration line as key and value: "key: value" (the last
// colon splits), or llm.c's "train loss 3.21" (the last space); nullopt for
// a segment with neither.
std::optional<std::pair<std::string, std::string>> SplitSegment(
    absl::string_view segment) {
  const size_t colon = segment.rfind(':');
  if (colon != absl::string_view::npos) {
    return std::pair(std::string(segment.substr(0, colon)),
                     std::string(absl::StripAsciiWhitespace(segment.substr(colon + 1))));
  }
  const size_t space = segment.rfind(' ');
  if (space == absl::string_view::npos) return std::nullopt;
  return std::pair(std::string(segment.substr(0, space)),
                   std::string(segment.substr(space + 1)));
}

// The step in a line's first group (digits, which may still overflow);
// the error calls it `what`.
absl::StatusOr<uint64_t> MatchedStep(const std::smatch& m,
                                     absl::string_view where,
                                     absl::string_view what) {
  uint64_t step = 0;
  if (!absl::SimpleAtoi(m[1].str(), &step)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": bad ", what, " \"", m[1].str(), "\""));
  }
  return step;
}

}  // namespace

absl::StatusOr<bool> ParseOverflowLine(const std::string& line,
                                       absl::string_view /*where*/,
                                       StdoutParse* parse) {
  std::smatch m;
  if (!std::regex_search(line, m, OverflowPattern())) return false;
  ++parse->overflow_lines;
  ++parse->pending_overflows;
  parse->pending_scale = ParseLogNumber(m[1].str());
  return true;
}

absl::StatusOr<bool> ParseLlmcLogLine(const std::string& line,
                                      absl::string_view where,
                                      StdoutParse* parse) {
  std::smatch m;
  if (!std::regex_match(line, m, LlmcLogPattern())) return false;
  absl::StatusOr<uint64_t> parsed = MatchedStep(m, where, "step");
  if (!parsed.ok()) return parsed.status();
  const uint64_t step = *parsed;
  bool any = false;
  for (absl::string_view kv :
       absl::StrSplit(m[2].str(), ' ', absl::SkipWhitespace())) {
    const size_t colon = kv.find(':');
    if (colon == absl::string_view::npos) continue;
    std::string key(kv.substr(0, colon));
    if (key == "trl") key = "loss";
    if (key == "tel") continue;  // eval loss
    std::optional<TagTarget> target = LookUpTag(key, parse->map);
    if (!target.has_value()) continue;
    std::optional<double> v = ParseLogNumber(kv.substr(colon + 1));
    if (!v.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"", kv, "\" is not a number"));
    }
    parse->run->Set(step, *target, *v);
    any = true;
  }
  if (any) ++parse->step_lines;
  return true;
}

absl::StatusOr<bool> ParseIterationLine(const std::string& line,
                                        absl::string_view where,
                                        StdoutParse* parse) {
  std::smatch m;
  if (!std::regex_search(line, m, IterationPattern())) return false;
  absl::StatusOr<uint64_t> parsed = MatchedStep(m, where, "iteration");
  if (!parsed.ok()) return parsed.status();
  const uint64_t step = *parsed;
  ++parse->step_lines;
  LoggedRun* run = parse->run;
  run->steps[step];  // the line is a logged step even if it says little
  bool skip_count_given = false;
  for (absl::string_view segment : absl::StrSplit(line, '|')) {
    segment = absl::StripAsciiWhitespace(segment);
    if (segment.empty()) continue;
    std::optional<std::pair<std::string, std::string>> kv = SplitSegment(segment);
    if (!kv.has_value()) continue;
    const auto& [key, value] = *kv;
    // A timestamp prefix ("[2024-01-01 10:00:00] iteration") has colons
    // too; only known keys are read.
    std::optional<TagTarget> target = LookUpTag(key, parse->map);
    const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(key));
    if (lower == "number of nan iterations") {
      std::optional<double> v = ParseLogNumber(value);
      if (!v.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": \"", segment, "\": the count is not a number"));
      }
      if (*v > 0) run->steps[step].nan_iteration = true;
      continue;
    }
    if (!target.has_value()) continue;
    std::optional<double> v = ParseLogNumber(value);
    if (!v.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": \"", segment, "\": the value is not a number"));
    }
    if (target->field == LogField::kSkipped) skip_count_given = true;
    run->Set(step, *target, *v);
  }
  LoggedStep& s = run->steps[step];
  if (!skip_count_given && parse->pending_overflows > 0) {
    s.skipped = parse->pending_overflows;
  }
  if (!s.loss_scale.has_value() && parse->pending_scale.has_value()) {
    s.loss_scale = parse->pending_scale;
  }
  parse->pending_overflows = 0;
  parse->pending_scale.reset();
  return true;
}

absl::Status ParseTrainingStdout(absl::string_view text,
                                 absl::string_view name, const TagMap& map,
                                 LoggedRun* run) {
  // Tried in this order; the first that reads a line wins.
  using LineParser = absl::StatusOr<bool> (*)(const std::string&,
                                              absl::string_view, StdoutParse*);
  constexpr LineParser kParsers[] = {ParseOverflowLine, ParseLlmcLogLine,
                                     ParseIterationLine};
  StdoutParse parse{.map = map, .run = run};
  int64_t line_number = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++line_number;
    const std::string line(absl::StripTrailingAsciiWhitespace(raw));
    const std::string where = absl::StrCat(name, ":", line_number);
    for (LineParser parser : kParsers) {
      absl::StatusOr<bool> read = parser(line, where, &parse);
      if (!read.ok()) return read.status();
      if (*read) break;
    }
  }
  if (parse.step_lines == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name,
        ": no training line found: expected Megatron-LM / DeepSpeed / "
        "GPT-NeoX \"iteration N/ M | ...\" lines, llm.c \"step N/M | ...\" "
        "lines, a trainer_state.json, a CSV with a step column, or a "
        "TensorBoard event file (give --format)"));
  }
  if (run->source == LogSource::kUnknown) run->source = LogSource::kMegatron;
  if (parse.overflow_lines > 0) {
    run->notes.push_back(absl::StrCat(
        name, ": ", parse.overflow_lines,
        " DeepSpeed overflow lines: each marks the next iteration line's "
        "step as skipped, with the scale it reduced to"));
  }
  return absl::OkStatus();
}

absl::Status ParseCsvLog(absl::string_view text, absl::string_view name,
                         const TagMap& map, LoggedRun* run) {
  std::vector<std::string> header;
  int step_column = -1;
  std::vector<std::optional<TagTarget>> targets;
  int64_t line_number = 0;
  uint64_t rows = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++line_number;
    const absl::string_view line = absl::StripTrailingAsciiWhitespace(raw);
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    const std::string where = absl::StrCat(name, ":", line_number);
    std::vector<std::string> cells = SplitCsv(line);
    if (header.empty()) {
      header = cells;
      bool any = false;
      for (size_t i = 0; i < header.size(); ++i) {
        const std::string h =
            absl::AsciiStrToLower(absl::StripAsciiWhitespace(header[i]));
        if (step_column < 0 && IsStepColumn(h)) {
          step_column = static_cast<int>(i);
          targets.emplace_back();
          continue;
        }
        targets.push_back(LookUpTag(header[i], map));
        any = any || targets.back().has_value();
      }
      if (step_column < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": the header has no step column (step, iteration, "
                   "global_step, _step, iter)"));
      }
      if (!any) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": no column trainwatch reads (", line,
            "); name one with --map COLUMN=field"));
      }
      continue;
    }
    if (cells.size() != header.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": ", cells.size(), " cells, the header has ", header.size()));
    }
    std::optional<uint64_t> step = ParseStep(cells[step_column]);
    if (!step.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": step \"", cells[step_column],
          "\" is not a non-negative integer"));
    }
    ++rows;
    for (size_t i = 0; i < cells.size(); ++i) {
      if (!targets[i].has_value()) continue;
      if (absl::StripAsciiWhitespace(cells[i]).empty()) continue;
      std::optional<double> v = ParseLogNumber(cells[i]);
      if (!v.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": column \"", header[i], "\": \"", cells[i],
            "\" is not a number"));
      }
      run->Set(*step, *targets[i], *v);
    }
  }
  if (header.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": empty CSV"));
  }
  for (size_t i = 0; i < header.size(); ++i) {
    if (targets[i].has_value() &&
        SourceOfTag(header[i]) != LogSource::kUnknown &&
        run->source == LogSource::kUnknown) {
      run->source = SourceOfTag(header[i]);
    }
  }
  if (rows == 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": no data rows"));
  }
  return absl::OkStatus();
}

}  // namespace trainwatch::cli
