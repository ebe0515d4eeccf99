// Every field of RunStart and StepRecord through each path by which the
// client sends it: a JSONL step log's line, read by the steplog reader, made
// into the ClientOptions or queued record the client holds, and turned into
// the message the sender writes; and a record as a Step (Record(), the
// Python binding). The messages are filled by reflection (fill_fields.h),
// so a field added to the proto fails here until every path carries it (or
// is listed in kNotCarried with the reason).
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "fill_fields.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "proto_convert.h"
#include "steplog/steplog.h"
#include "trainwatch/run_start.h"
#include "trainwatch/run_start_fields.h"
#include "trainwatch/step_fields.h"

namespace trainwatch {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using ::trainwatch::testing::FilledMessage;

// A field a path does not carry on purpose: the path (as the tests below
// name it), the field's full name, and why. None does today: what the
// client fills itself (a time of 0, a measured step_time_s, a derived
// clipped and clip_coef, world_size 0 read as 1) it fills only where the
// message has no value, and the filled messages have one everywhere.
struct NotCarried {
  std::string_view path;
  std::string_view field;  // e.g. "trainwatch.v1.StepRecord.time_unix_nanos"
  std::string_view why;
};
const std::vector<NotCarried> kNotCarried = {};

// MessageDifferencer's report of what `path` lost or changed, one line a
// field ("deleted: moe { ... }", "modified: rank: 21 -> 0"); "" when
// nothing was.
std::string Lost(std::string_view path, const Message& given, const Message& sent) {
  google::protobuf::util::MessageDifferencer differ;
  for (const NotCarried& n : kNotCarried) {
    if (n.path != path) continue;
    const auto* pool = given.GetDescriptor()->file()->pool();
    const FieldDescriptor* f = pool->FindFieldByName(std::string(n.field));
    EXPECT_NE(f, nullptr) << "kNotCarried names " << n.field << ", no field";
    if (f != nullptr) differ.IgnoreField(f);
  }
  std::string report;
  differ.ReportDifferencesToString(&report);
  differ.Compare(given, sent);
  return report;
}

// `message` as one JSONL line, the way the step log documents it: proto3
// JSON with the proto's own field names, a run_start wrapped.
std::string JsonLine(const Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string json;
  EXPECT_TRUE(google::protobuf::util::MessageToJsonString(message, &json, options).ok());
  if (message.GetDescriptor() == v1::RunStart::descriptor()) {
    return "{\"run_start\": " + json + "}\n";
  }
  return json + "\n";
}

// The one entry the steplog reader reads from `line`.
cli::StepLogEntry ReadLine(const std::string& line) {
  std::istringstream in(line);
  cli::StepLogReader reader(&in, "fields.jsonl");
  absl::StatusOr<std::optional<cli::StepLogEntry>> entry = reader.Next();
  EXPECT_TRUE(entry.ok()) << entry.status() << "\n" << line;
  if (!entry.ok() || !entry->has_value()) return cli::StepLogEntry{};
  return **entry;
}

#define TW_NAME(name, ...) #name,

struct Table {
  const Descriptor* message;
  std::set<std::string> names;
  const char* table;  // where it is
};

// Each table names every field of its message, so the generated conversions
// carry it (a name that is not a field does not compile).
TEST(FieldTables, NameEveryFieldOfTheirMessage) {
  const Table tables[] = {
      {v1::RunStart::descriptor(),
       {TRAINWATCH_FIELDS(TRAINWATCH_RUN_START_FIELDS, TW_NAME)},
       "TRAINWATCH_RUN_START_FIELDS (trainwatch/run_start_fields.h)"},
      {v1::MoeConfig::descriptor(),
       {TRAINWATCH_FIELDS(TRAINWATCH_MOE_CONFIG_FIELDS, TW_NAME)},
       "TRAINWATCH_MOE_CONFIG_FIELDS (trainwatch/run_start_fields.h)"},
      {v1::BaselineRef::descriptor(),
       {TRAINWATCH_FIELDS(TRAINWATCH_BASELINE_REF_FIELDS, TW_NAME)},
       "TRAINWATCH_BASELINE_REF_FIELDS (trainwatch/run_start_fields.h)"},
      {v1::StepRecord::descriptor(),
       {TRAINWATCH_FIELDS(TRAINWATCH_STEP_FIELDS, TW_NAME)},
       "TRAINWATCH_STEP_FIELDS (trainwatch/step_fields.h)"},
      {v1::LayerStats::descriptor(),
       {TRAINWATCH_FIELDS(TRAINWATCH_LAYER_STAT_FIELDS, TW_NAME)},
       "TRAINWATCH_LAYER_STAT_FIELDS (trainwatch/step_fields.h)"},
      {v1::Fp8TensorStats::descriptor(),
       {TRAINWATCH_FIELDS(TRAINWATCH_FP8_STAT_FIELDS, TW_NAME)},
       "TRAINWATCH_FP8_STAT_FIELDS (trainwatch/step_fields.h)"},
      {v1::MoeLayerStats::descriptor(),
       {TRAINWATCH_FIELDS(TRAINWATCH_MOE_LAYER_STAT_FIELDS, TW_NAME)},
       "TRAINWATCH_MOE_LAYER_STAT_FIELDS (trainwatch/step_fields.h)"},
      // StepRecord.moe is WRAPPED(moe, layers): MoeStats is its layers.
      {v1::MoeStats::descriptor(), {"layers"},
       "WRAPPED(moe, layers) of TRAINWATCH_STEP_FIELDS (trainwatch/step_fields.h)"},
  };
  for (const Table& t : tables) {
    for (int i = 0; i < t.message->field_count(); ++i) {
      const FieldDescriptor* f = t.message->field(i);
      EXPECT_EQ(t.names.count(f->name()), 1u)
          << t.message->name() << "." << f->name() << " (field " << f->number()
          << ") is not in " << t.table
          << ": the client's conversions do not carry it; add it there and to "
             "the client's struct";
    }
    for (const std::string& name : t.names) {
      EXPECT_NE(t.message->FindFieldByName(name), nullptr)
          << t.table << " names " << name << ", not a field of "
          << t.message->name();
    }
  }
}

// JSONL -> RunStart (steplog) -> ClientOptions (ApplyRunStart, replay) ->
// the RunStart the sender writes (MakeRunStart).
TEST(RunStartPaths, ARunStartLineReachesTheWireWithEveryField) {
  const v1::RunStart given = FilledMessage<v1::RunStart>();
  const std::string line = JsonLine(given);
  const cli::StepLogEntry entry = ReadLine(line);
  const auto* read = std::get_if<v1::RunStart>(&entry);
  ASSERT_NE(read, nullptr) << line;
  EXPECT_EQ(Lost("steplog", given, *read), "")
      << "the steplog reader lost or changed (above) of " << line;

  ClientOptions options;
  ApplyRunStart(*read, &options);
  const v1::RunStart sent = MakeRunStart(options);
  EXPECT_EQ(Lost("client options", given, sent), "")
      << "run_start line -> ClientOptions (ApplyRunStart) -> RunStart "
         "(MakeRunStart) lost or changed (above) of "
      << given.ShortDebugString();
}

// ApplyRunStart sets every RunStart field: options that held another run's
// (a moe block, adam_eps, labels) keep none of it.
TEST(RunStartPaths, ApplyRunStartLeavesNothingOfTheOptionsBefore) {
  ClientOptions options;
  ApplyRunStart(FilledMessage<v1::RunStart>(), &options);
  options.address = "10.0.0.1:50051";
  options.capacity = 7;
  v1::RunStart bare;
  bare.set_run_id("r");
  ApplyRunStart(bare, &options);
  v1::RunStart expected = bare;
  expected.set_world_size(1);  // 0 is read as 1
  EXPECT_EQ(Lost("client options", expected, MakeRunStart(options)), "");
  EXPECT_EQ(options.address, "10.0.0.1:50051");
  EXPECT_EQ(options.capacity, 7u);
}

// JSONL -> StepRecord (steplog) -> queued as it is (RecordProto: replay,
// import) -> the record the sender writes (AddStepRecord, with max_norm).
TEST(StepRecordPaths, AStepLineReachesTheWireWithEveryField) {
  const v1::StepRecord given = FilledMessage<v1::StepRecord>();
  const std::string line = JsonLine(given);
  const cli::StepLogEntry entry = ReadLine(line);
  const auto* read = std::get_if<v1::StepRecord>(&entry);
  ASSERT_NE(read, nullptr) << line;
  EXPECT_EQ(Lost("steplog", given, *read), "")
      << "the steplog reader lost or changed (above) of " << line;

  v1::StepBatch batch;
  internal::AddStepRecord(std::make_unique<v1::StepRecord>(*read),
                          /*max_norm=*/1.0, &batch);
  ASSERT_EQ(batch.records_size(), 1);
  EXPECT_EQ(Lost("record", given, batch.records(0)), "")
      << "a step line queued by RecordProto, as sent (AddStepRecord), lost or "
         "changed (above) of "
      << given.ShortDebugString();
}

// StepRecord -> Step (StepFromRecord) -> the record the sender writes for a
// Step (AddStepRecord -> FillStepRecord): every field of the wire's record
// has its place in a Step, so Record() and the Python binding can send it.
TEST(StepRecordPaths, EveryFieldHasItsPlaceInAStep) {
  const v1::StepRecord given = FilledMessage<v1::StepRecord>();
  v1::StepBatch batch;
  internal::AddStepRecord(internal::StepFromRecord(given), /*max_norm=*/1.0, &batch);
  ASSERT_EQ(batch.records_size(), 1);
  EXPECT_EQ(Lost("step", given, batch.records(0)), "")
      << "StepRecord -> Step (StepFromRecord) -> StepRecord (FillStepRecord) "
         "lost or changed (above) of "
      << given.ShortDebugString();
}

}  // namespace
}  // namespace trainwatch
