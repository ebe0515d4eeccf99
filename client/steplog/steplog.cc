#include "steplog/steplog.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace trainwatch::cli {
namespace {

// The kind of a line, judged from its first key alone so that a step line
// (the common case, 100,000s of them) costs one JSON parse. A wrong guess is
// harmless: the parse that follows reports the unexpected field.
enum class LineKind { kStep, kWrapper };

// `line` starts with '{' after leading whitespace.
LineKind GuessKind(absl::string_view line) {
  line = absl::StripLeadingAsciiWhitespace(line);
  line = absl::StripLeadingAsciiWhitespace(line.substr(1));
  for (absl::string_view key : {"\"run_start\"", "\"event\""}) {
    if (absl::StartsWith(line, key)) return LineKind::kWrapper;
  }
  return LineKind::kStep;
}

// Protobuf reports a syntax error in three lines: what, an excerpt of the
// input, and a caret under the spot. Our errors are one line, so the caret
// becomes the text from that spot on: "Unexpected token near 'oops}'".
std::string OneLine(absl::string_view message) {
  std::vector<absl::string_view> lines = absl::StrSplit(message, '\n');
  if (lines.size() == 3 && absl::StripAsciiWhitespace(lines[2]) == "^") {
    const size_t col = lines[2].find('^');
    absl::string_view what = absl::StripSuffix(lines[0], ".");
    absl::string_view near = lines[1].substr(std::min(col, lines[1].size()));
    return absl::StrCat(what, " near '", near.substr(0, 32), "'");
  }
  return absl::StrJoin(lines, " ");
}

// `what` names the kind of line for errors that are not about syntax.
absl::Status ParseJson(absl::string_view line, absl::string_view what,
                       google::protobuf::Message* msg) {
  google::protobuf::util::JsonParseOptions options;
  // A misspelt field name ("gradnorm") must not silently become a zero.
  options.ignore_unknown_fields = false;
  // "fp16" as well as "FP16": the Python API spells precision in lower case.
  options.case_insensitive_enum_parsing = true;
  auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(line.data(), line.size()), msg, options);
  if (status.ok()) return absl::OkStatus();
  const std::string message = OneLine(status.message().ToString());
  // Syntax errors carry the excerpt (see OneLine); field errors do not.
  const bool syntax = absl::StrContains(message, " near '");
  return absl::InvalidArgumentError(
      absl::StrCat(syntax ? "invalid JSON" : what, ": ", message));
}

}  // namespace

StepLogReader::StepLogReader(std::istream* in, std::string name)
    : in_(in), name_(std::move(name)) {}

absl::StatusOr<std::optional<StepLogEntry>> StepLogReader::Next() {
  if (final_status_.has_value()) {
    if (final_status_->ok()) return std::nullopt;
    return *final_status_;
  }
  while (std::getline(*in_, line_)) {
    ++line_number_;
    if (absl::StripAsciiWhitespace(line_).empty()) continue;
    absl::StatusOr<StepLogEntry> entry = ParseLine(line_);
    if (!entry.ok()) {
      final_status_ = absl::InvalidArgumentError(absl::StrCat(
          name_, ":", line_number_, ": ", entry.status().message()));
      return *final_status_;
    }
    return std::optional<StepLogEntry>(*std::move(entry));
  }
  if (in_->bad()) {
    final_status_ = absl::DataLossError(
        absl::StrCat(name_, ":", line_number_ + 1, ": read error"));
    return *final_status_;
  }
  final_status_ = absl::OkStatus();
  return std::nullopt;
}

absl::StatusOr<StepLogEntry> StepLogReader::ParseLine(
    const std::string& line) const {
  if (!absl::StartsWith(absl::StripLeadingAsciiWhitespace(line), "{")) {
    return absl::InvalidArgumentError(
        "invalid JSON: a line must be one JSON object, {...}");
  }
  if (GuessKind(line) == LineKind::kStep) {
    v1::StepRecord record;
    if (absl::Status s = ParseJson(line, "invalid step line", &record);
        !s.ok()) {
      return s;
    }
    // proto3 JSON reads a missing "step" as 0; a step line must say its step.
    // Only lines that parsed to step 0 pay for the second parse.
    if (record.step() == 0) {
      google::protobuf::Struct object;
      if (ParseJson(line, "invalid step line", &object).ok() &&
          object.fields().count("step") == 0) {
        return absl::InvalidArgumentError(
            "invalid step line: no \"step\" (a step line needs its step "
            "number)");
      }
    }
    return record;
  }
  v1::StepLogLine wrapper;
  if (absl::Status s =
          ParseJson(line, "invalid run_start or event line", &wrapper);
      !s.ok()) {
    return s;
  }
  if (wrapper.has_run_start() == wrapper.has_event()) {
    return absl::InvalidArgumentError(
        "a line holds exactly one of \"run_start\" or \"event\"");
  }
  if (wrapper.has_run_start()) return std::move(*wrapper.mutable_run_start());
  if (wrapper.event().kind() == v1::EVENT_KIND_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        "event has no \"kind\" (CHECKPOINT_SAVED, RUN_FINISHED or RUN_FAILED)");
  }
  return std::move(*wrapper.mutable_event());
}

absl::StatusOr<EventKind> ToClientEventKind(v1::EventKind kind) {
  switch (kind) {
    case v1::CHECKPOINT_SAVED:
      return EventKind::kCheckpointSaved;
    case v1::RUN_FINISHED:
      return EventKind::kRunFinished;
    case v1::RUN_FAILED:
      return EventKind::kRunFailed;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown event kind ", static_cast<int>(kind)));
  }
}

}  // namespace trainwatch::cli
