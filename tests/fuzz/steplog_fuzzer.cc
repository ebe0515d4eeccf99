// Fuzz target: the JSONL step-log reader that `trainwatchctl replay` uses.
//
// The input is a whole step log. Beyond "no crash, leak or UB" it checks the
// reader's contract (steplog.h): every line either parses or stops the read
// with "NAME:LINE: what" naming a non-blank line that exists; the end and an
// error are sticky. Each parsed entry is written back twice, in the proto3
// JSON mapping and (for a step) with the writer of `trainwatchctl steps
// --json`, and must read back as the same message.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/util/field_comparator.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "output/json_out.h"
#include "steplog/steplog.h"
#include "trainwatch/run_start.h"

namespace trainwatch::cli {
namespace {

constexpr absl::string_view kName = "fuzz.jsonl";

[[noreturn]] void Fail(absl::string_view what, absl::string_view detail) {
  std::fprintf(stderr, "steplog_fuzzer: %.*s: %.*s\n",
               static_cast<int>(what.size()), what.data(),
               static_cast<int>(detail.size()), detail.data());
  std::abort();
}

void Check(bool ok, absl::string_view what, absl::string_view detail = "") {
  if (!ok) Fail(what, detail);
}

// Makes every -0.0 a +0.0. Protobuf's JSON parser reads the "-0" that its
// printer (and FormatDouble) writes as the integer 0, so -0.0 comes back as
// +0.0, numerically the same value; but a proto3 double without `optional`
// counts as present only when its bits are non-zero, so the two differ in
// presence.
void NormalizeZeros(google::protobuf::Message* m) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* refl = m->GetReflection();
  std::vector<const FieldDescriptor*> fields;
  refl->ListFields(*m, &fields);
  for (const FieldDescriptor* f : fields) {
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE && !f->is_repeated()) {
      if (refl->GetDouble(*m, f) == 0) refl->SetDouble(m, f, 0.0);
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (!f->is_repeated()) {
        NormalizeZeros(refl->MutableMessage(m, f));
        continue;
      }
      for (int i = 0; i < refl->FieldSize(*m, f); ++i) {
        NormalizeZeros(refl->MutableRepeatedMessage(m, f, i));
      }
    }
  }
}

// Numeric equality: NaN equals NaN ("NaN" in a log is data), -0 equals +0.
bool SameMessage(const google::protobuf::Message& a,
                 const google::protobuf::Message& b) {
  std::unique_ptr<google::protobuf::Message> a2(a.New()), b2(b.New());
  a2->CopyFrom(a);
  b2->CopyFrom(b);
  NormalizeZeros(a2.get());
  NormalizeZeros(b2.get());
  google::protobuf::util::DefaultFieldComparator comparator;
  comparator.set_treat_nan_as_equal(true);
  google::protobuf::util::MessageDifferencer differ;
  differ.set_field_comparator(&comparator);
  return differ.Compare(*a2, *b2);
}

// Reads `text` as a one-line log and returns its single entry.
StepLogEntry ReadBack(const std::string& text) {
  std::istringstream in(text);
  StepLogReader reader(&in, "roundtrip");
  auto entry = reader.Next();
  Check(entry.ok(), "a written entry does not read back",
        entry.ok() ? text : std::string(entry.status().message()) + " <- " + text);
  Check(entry->has_value(), "a written entry reads as an empty log", text);
  return **entry;
}

template <typename T>
void ExpectSame(const T& original, const StepLogEntry& again,
                const std::string& text) {
  const T* back = std::get_if<T>(&again);
  Check(back != nullptr, "an entry reads back as another kind of line", text);
  Check(SameMessage(original, *back), "an entry reads back changed", text);
}

// Proto3 JSON with the snake_case names the step log documents.
template <typename T>
void RoundTripProtoJson(const google::protobuf::Message& line, const T& entry) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  // A step line must carry its step (a line without one is refused), and
  // proto3 JSON would leave out a step of 0.
  options.always_print_primitive_fields = true;
  std::string text;
  auto status = google::protobuf::util::MessageToJsonString(line, &text, options);
  Check(status.ok(), "a parsed entry cannot be printed as JSON",
        status.message().ToString());
  ExpectSame(entry, ReadBack(text), text);
}

// The `steps --json` form, without the stream keys that a log does not have.
// Its "rank" is the record's rank as QuerySteps gives it (a host stream's
// record carries one): kept when the record has one, else left out as the
// stream's; "attempt" is the stream's.
void RoundTripStepsJson(const v1::StepRecord& record) {
  std::string text;
  JsonWriter w(&text);
  WriteStep(w, record, record.rank(), /*attempt=*/0);
  const std::string keys = absl::StrCat(R"({"rank":)", record.rank(), R"(,"attempt":0,)");
  Check(absl::StartsWith(text, keys), "WriteStep starts with rank, attempt",
        text);
  text = (record.has_rank() ? absl::StrCat(R"({"rank":)", record.rank(), ",") : "{") +
         text.substr(keys.size());
  ExpectSame(record, ReadBack(text), text);
}

void RoundTrip(const StepLogEntry& entry) {
  if (const auto* record = std::get_if<v1::StepRecord>(&entry)) {
    RoundTripProtoJson(*record, *record);
    RoundTripStepsJson(*record);
  } else if (const auto* start = std::get_if<v1::RunStart>(&entry)) {
    v1::StepLogLine line;
    *line.mutable_run_start() = *start;
    RoundTripProtoJson(line, *start);
    ClientOptions options;
    ApplyRunStart(*start, &options);
    Check(options.world_size >= 1, "ApplyRunStart reads world_size 0 as 1");
    // Every field of the line reaches the RunStart that replay sends.
    v1::RunStart sent = *start;
    if (sent.world_size() == 0) sent.set_world_size(1);
    Check(SameMessage(MakeRunStart(options), sent),
          "replay sends another RunStart than its run_start line's",
          start->ShortDebugString());
  } else {
    const auto& event = std::get<v1::RunEvent>(entry);
    v1::StepLogLine line;
    *line.mutable_event() = event;
    RoundTripProtoJson(line, event);
    (void)ToClientEventKind(event.kind());
  }
}

}  // namespace
}  // namespace trainwatch::cli

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainwatch::cli;
  const std::string text(reinterpret_cast<const char*>(data), size);
  // The lines as std::getline sees them: a final '\n' ends the last line.
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  if (!text.empty() && text.back() == '\n') lines.pop_back();
  if (text.empty()) lines.clear();

  std::istringstream in(text);
  StepLogReader reader(&in, std::string(kName));
  int64_t last_line = 0;
  for (;;) {
    auto entry = reader.Next();
    const int64_t line = reader.line_number();
    Check(line >= last_line && line <= static_cast<int64_t>(lines.size()),
          "line_number() is a line of the input");
    if (!entry.ok()) {
      const absl::Status status = entry.status();
      Check(status.code() == absl::StatusCode::kInvalidArgument,
            "a bad line is INVALID_ARGUMENT", status.ToString());
      // "fuzz.jsonl:LINE: what", LINE the non-blank line that failed.
      std::vector<absl::string_view> parts =
          absl::StrSplit(status.message(), absl::MaxSplits(':', 2));
      int64_t reported = 0;
      Check(parts.size() == 3 && parts[0] == kName &&
                absl::SimpleAtoi(parts[1], &reported) &&
                absl::StartsWith(parts[2], " ") && parts[2].size() > 1,
            "an error reads NAME:LINE: what", status.message());
      Check(reported == line && reported >= 1 &&
                !absl::StripAsciiWhitespace(lines[reported - 1]).empty(),
            "an error names the bad, non-blank line", status.message());
      Check(reader.Next().status() == status, "an error is sticky");
      break;
    }
    if (!entry->has_value()) {
      Check(line == static_cast<int64_t>(lines.size()),
            "the end comes after the last line");
      auto again = reader.Next();
      Check(again.ok() && !again->has_value(), "the end is sticky");
      break;
    }
    Check(line > last_line, "each entry comes from a new line");
    last_line = line;
    RoundTrip(**entry);
  }
  return 0;
}
