// Tests of trainwatchctl's JSONL step-log reader and JSON writer.
#include "steplog/steplog.h"

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "fill_fields.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "output/json_out.h"
#include "trainwatch/run_start.h"

namespace trainwatch::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// Reads every entry of `text`; fails the test on an error.
std::vector<StepLogEntry> ReadAll(const std::string& text) {
  std::istringstream in(text);
  StepLogReader reader(&in, "run.jsonl");
  std::vector<StepLogEntry> entries;
  while (true) {
    absl::StatusOr<std::optional<StepLogEntry>> next = reader.Next();
    EXPECT_TRUE(next.ok()) << next.status();
    if (!next.ok() || !next->has_value()) break;
    entries.push_back(**next);
  }
  return entries;
}

// The first error reading `text` produces (OK if there is none).
absl::Status FirstError(const std::string& text) {
  std::istringstream in(text);
  StepLogReader reader(&in, "run.jsonl");
  while (true) {
    absl::StatusOr<std::optional<StepLogEntry>> next = reader.Next();
    if (!next.ok()) return next.status();
    if (!next->has_value()) return absl::OkStatus();
  }
}

TEST(StepLogReader, ParsesRunStartWithLabelsAndPrecision) {
  std::vector<StepLogEntry> entries =
      ReadAll(R"({"run_start": {"run_id": "r1", "rank": 1, "world_size": 4, )"
              R"("precision": "FP16", "max_norm": 1.5, "warmup_steps": 10, )"
              R"("labels": {"model": "tiny", "owner": "ana"}}})"
              "\n");
  ASSERT_EQ(entries.size(), 1u);
  const auto* start = std::get_if<v1::RunStart>(&entries[0]);
  ASSERT_NE(start, nullptr);
  EXPECT_EQ(start->run_id(), "r1");
  EXPECT_EQ(start->rank(), 1u);
  EXPECT_EQ(start->world_size(), 4u);
  EXPECT_EQ(start->precision(), v1::FP16);
  EXPECT_EQ(start->max_norm(), 1.5);
  EXPECT_EQ(start->warmup_steps(), 10u);
  EXPECT_EQ(start->labels().at("model"), "tiny");
  EXPECT_EQ(start->labels().at("owner"), "ana");

  ClientOptions options;
  ApplyRunStart(*start, &options);
  EXPECT_EQ(options.run_id, "r1");
  EXPECT_EQ(options.precision, Precision::kFp16);
  EXPECT_EQ(options.world_size, 4u);
  EXPECT_EQ(options.labels.size(), 2u);
}

TEST(StepLogReader, ParsesNonFiniteValuesInAStepLine) {
  std::vector<StepLogEntry> entries =
      ReadAll(R"({"step": 12, "grad_norm": "Infinity", "loss": "NaN", )"
              R"("log_z": "-Infinity", "loss_scale": 65536, "skipped": true, )"
              R"("batch_ids": [24, 25]})");
  ASSERT_EQ(entries.size(), 1u);
  const auto* record = std::get_if<v1::StepRecord>(&entries[0]);
  ASSERT_NE(record, nullptr);
  EXPECT_EQ(record->step(), 12u);
  EXPECT_TRUE(std::isinf(record->grad_norm()) && record->grad_norm() > 0);
  EXPECT_TRUE(std::isnan(record->loss()));
  EXPECT_TRUE(std::isinf(record->log_z()) && record->log_z() < 0);
  EXPECT_EQ(record->loss_scale(), 65536.0);
  EXPECT_TRUE(record->skipped());
  EXPECT_THAT(record->batch_ids(), ::testing::ElementsAre(24, 25));
}

TEST(StepLogReader, ParsesAnEventLine) {
  std::vector<StepLogEntry> entries = ReadAll(
      R"({"event": {"step": 100, "kind": "CHECKPOINT_SAVED", "detail": "ckpt-100"}})");
  ASSERT_EQ(entries.size(), 1u);
  const auto* event = std::get_if<v1::RunEvent>(&entries[0]);
  ASSERT_NE(event, nullptr);
  EXPECT_EQ(event->step(), 100u);
  EXPECT_EQ(event->kind(), v1::CHECKPOINT_SAVED);
  EXPECT_EQ(event->detail(), "ckpt-100");
  EXPECT_EQ(*ToClientEventKind(event->kind()), EventKind::kCheckpointSaved);
}

TEST(StepLogReader, SkipsBlankLinesAndCountsThem) {
  std::istringstream in("\n{\"step\": 1}\n   \n\r\n{\"step\": 2}\r\n\n");
  StepLogReader reader(&in, "run.jsonl");
  auto first = reader.Next();
  ASSERT_TRUE(first.ok() && first->has_value());
  EXPECT_EQ(std::get<v1::StepRecord>(**first).step(), 1u);
  EXPECT_EQ(reader.line_number(), 2);
  auto second = reader.Next();
  ASSERT_TRUE(second.ok() && second->has_value());
  EXPECT_EQ(std::get<v1::StepRecord>(**second).step(), 2u);
  EXPECT_EQ(reader.line_number(), 5);
  auto end = reader.Next();
  ASSERT_TRUE(end.ok());
  EXPECT_FALSE(end->has_value());
}

TEST(StepLogReader, UnknownFieldIsAnErrorWithItsLineNumber) {
  absl::Status status = FirstError(
      "{\"step\": 0, \"grad_norm\": 0.3}\n\n{\"step\": 1, \"gradnorm\": "
      "0.3}\n");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), StartsWith("run.jsonl:3: "));
  EXPECT_THAT(std::string(status.message()), HasSubstr("gradnorm"));
}

TEST(StepLogReader, MalformedJsonNamesTheLineAndStopsThere) {
  std::istringstream in(
      "{\"step\": 0, \"grad_norm\": 0.3}\n"
      "{\"step\": 1, \"grad_norm\": oops}\n"
      "{\"step\": 2, \"grad_norm\": 0.3}\n");
  StepLogReader reader(&in, "run.jsonl");
  ASSERT_TRUE(reader.Next().ok());
  absl::StatusOr<std::optional<StepLogEntry>> bad = reader.Next();
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              StartsWith("run.jsonl:2: invalid JSON"));
  EXPECT_THAT(std::string(bad.status().message()), Not(HasSubstr("\n")));
  // The error is sticky: line 3 is never handed out.
  EXPECT_EQ(reader.Next().status(), bad.status());
}

TEST(StepLogReader, WrapperLineWithBothKeysIsAnError) {
  absl::Status status = FirstError(
      R"({"event": {"step": 1, "kind": "RUN_FINISHED"}, "run_start": {"run_id": "r"}})");
  EXPECT_THAT(std::string(status.message()), StartsWith("run.jsonl:1: "));
  EXPECT_THAT(std::string(status.message()), HasSubstr("exactly one"));
}

TEST(StepLogReader, EventWithoutKindIsAnError) {
  absl::Status status = FirstError(R"({"event": {"step": 5}})");
  EXPECT_THAT(std::string(status.message()), StartsWith("run.jsonl:1: "));
  EXPECT_THAT(std::string(status.message()), HasSubstr("kind"));
}

TEST(StepLogReader, AcceptsLowerCasePrecisionAsThePythonApiSpellsIt) {
  std::vector<StepLogEntry> entries =
      ReadAll(R"({"run_start": {"run_id": "r", "precision": "bf16"}})");
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(std::get<v1::RunStart>(entries[0]).precision(), v1::BF16);
}

TEST(StepLogReader, LineThatIsNotAnObjectIsAnError) {
  absl::Status status = FirstError("{\"step\": 1}\n[1, 2]\n");
  EXPECT_THAT(std::string(status.message()),
              StartsWith("run.jsonl:2: invalid JSON"));
}

TEST(StepLogReader, StepLineWithoutAStepIsAnErrorButStepZeroIsFine) {
  absl::Status status = FirstError("{\"step\": 0}\n{\"grad_norm\": 0.3}\n");
  EXPECT_THAT(std::string(status.message()),
              StartsWith("run.jsonl:2: invalid step line: no \"step\""));
  EXPECT_EQ(ReadAll("{\"step\": 0, \"grad_norm\": 0.3}\n").size(), 1u);
}

TEST(StepLogReader, StepsGoingBackwardsAreNotItsBusiness) {
  std::vector<StepLogEntry> entries =
      ReadAll("{\"step\": 40}\n{\"step\": 12}\n{\"step\": 12}\n");
  EXPECT_EQ(entries.size(), 3u);
}

// Replay sends the record as read, and the client derives clipped and
// clip_coef only where they are absent: a present zero must stay present.
TEST(StepLogReader, KeepsOptionalFieldPresence) {
  const std::vector<StepLogEntry> entries = ReadAll(
      "{\"step\": 7, \"grad_norm\": 0.5, \"loss_scale\": 1024, "
      "\"clip_coef\": 0, \"batch_ids\": [3]}\n");
  ASSERT_EQ(entries.size(), 1u);
  const auto& record = std::get<v1::StepRecord>(entries[0]);
  EXPECT_EQ(record.step(), 7u);
  EXPECT_EQ(record.loss_scale(), 1024.0);
  ASSERT_TRUE(record.has_clip_coef());
  EXPECT_EQ(record.clip_coef(), 0.0);
  EXPECT_FALSE(record.has_clipped());
  EXPECT_FALSE(record.has_loss());
  EXPECT_FALSE(record.has_lr());
  EXPECT_FALSE(record.has_max_attn_logit());
  EXPECT_FALSE(record.has_shard_sq_sum());
  ASSERT_EQ(record.batch_ids_size(), 1);
  EXPECT_EQ(record.batch_ids(0), 3);
}

TEST(StepLogReader, CarriesStepTimesAndTheHost) {
  const std::vector<StepLogEntry> entries = ReadAll(
      "{\"run_start\": {\"run_id\": \"r\", \"rank\": 3, \"world_size\": 8, "
      "\"host\": \"node-17\"}}\n"
      "{\"step\": 5, \"grad_norm\": 1, \"step_time_s\": 0.42, "
      "\"data_wait_s\": 0.1}\n"
      "{\"step\": 6, \"grad_norm\": 1}\n");
  ASSERT_EQ(entries.size(), 3u);
  ClientOptions options;
  ApplyRunStart(std::get<v1::RunStart>(entries[0]), &options);
  EXPECT_EQ(options.host, "node-17");
  const auto& timed = std::get<v1::StepRecord>(entries[1]);
  EXPECT_EQ(timed.step_time_s(), 0.42);
  EXPECT_EQ(timed.data_wait_s(), 0.1);
  const auto& bare = std::get<v1::StepRecord>(entries[2]);
  EXPECT_FALSE(bare.has_step_time_s());
  EXPECT_FALSE(bare.has_data_wait_s());
}

TEST(WriteStep, WritesStepTimesThatParseBack) {
  v1::StepRecord record;
  record.set_step(4);
  record.set_step_time_s(1.25);
  record.set_data_wait_s(0.5);
  std::string out;
  JsonWriter w(&out);
  WriteStep(w, record, 0, 0);
  EXPECT_THAT(out, HasSubstr(R"("step_time_s":1.25,"data_wait_s":0.5)"));
}

// A format this build has no name for (a newer client's) goes out as its
// number, so the line reads back; its name would be "" (found by the fuzzer).
TEST(WriteStep, WritesAnUnnamedFp8FormatAsItsNumberAndReadsItBack) {
  v1::StepRecord record;
  record.set_step(5);
  (*record.mutable_fp8())["l0:input"].set_format(static_cast<v1::Fp8Format>(47));
  (*record.mutable_fp8())["l0:weight"].set_format(v1::E4M3);
  std::string out;
  JsonWriter w(&out);
  WriteStep(w, record, 0, 0);
  EXPECT_THAT(out, HasSubstr(R"("l0:input":{"format":47,)"));
  EXPECT_THAT(out, HasSubstr(R"("l0:weight":{"format":"E4M3",)"));
  constexpr absl::string_view kKeys = R"({"rank":0,"attempt":0,)";
  std::istringstream in("{" + out.substr(kKeys.size()) + "\n");
  StepLogReader reader(&in, "t.jsonl");
  auto entry = reader.Next();
  ASSERT_TRUE(entry.ok()) << entry.status();
  ASSERT_TRUE(entry->has_value());
  const auto& back = std::get<v1::StepRecord>(**entry);
  EXPECT_EQ(back.fp8().at("l0:input").format(), 47);
  EXPECT_EQ(back.fp8().at("l0:weight").format(), v1::E4M3);
}

// `steps --json` writes every field of a record, and the step log reads it
// back the same: filled by reflection, so a field added to StepRecord and
// not written by WriteStep (client/output/json_out.cc, a hand-written list)
// fails here. Its "rank" key is the record's rank, as QuerySteps gives it.
TEST(WriteStep, EveryFieldOfARecordReadsBackFromItsLine) {
  v1::StepRecord record;
  testing::FillEveryField(&record);
  std::string out;
  JsonWriter w(&out);
  WriteStep(w, record, record.rank(), 7);
  const std::string attempt = R"("attempt":7,)";
  const size_t at = out.find(attempt);
  ASSERT_NE(at, std::string::npos) << out;
  std::istringstream in(out.erase(at, attempt.size()) + "\n");
  StepLogReader reader(&in, "t.jsonl");
  auto entry = reader.Next();
  ASSERT_TRUE(entry.ok()) << entry.status() << "\n" << out;
  ASSERT_TRUE(entry->has_value());
  const auto& back = std::get<v1::StepRecord>(**entry);
  std::string diff;
  google::protobuf::util::MessageDifferencer differ;
  differ.ReportDifferencesToString(&diff);
  EXPECT_TRUE(differ.Compare(record, back)) << diff << "\n" << out;
}

TEST(JsonQuote, EscapesQuotesBackslashNewlineAndControlChars) {
  EXPECT_EQ(JsonQuote("a\"b\\c\nd\x01"
                      "e"),
            R"("a\"b\\c\nd\u0001e")");
  EXPECT_EQ(JsonQuote("tab\there"), R"("tab\there")");
  EXPECT_EQ(JsonQuote("caf\xc3\xa9"), "\"caf\xc3\xa9\"");
}

TEST(FormatDouble, RoundTripsAndNamesNonFinite) {
  EXPECT_EQ(FormatDouble(0.1), "0.1");
  EXPECT_EQ(FormatDouble(65536.0), "65536");
  const double third = 1.0 / 3.0;
  EXPECT_EQ(std::stod(FormatDouble(third)), third);
  EXPECT_EQ(FormatDouble(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(FormatDouble(-std::numeric_limits<double>::infinity()),
            "-Infinity");
}

TEST(WriteStep, PrintsNumbersBareAndNonFiniteAsStrings) {
  v1::StepRecord record;
  record.set_step(12);
  record.set_grad_norm(std::numeric_limits<double>::infinity());
  record.set_loss(std::numeric_limits<double>::quiet_NaN());
  record.set_loss_scale(32768);
  record.set_skipped(true);
  record.add_batch_ids(24);
  record.add_batch_ids(25);
  std::string out;
  JsonWriter w(&out);
  WriteStep(w, record, /*rank=*/2, /*attempt=*/1);
  EXPECT_EQ(out, R"({"rank":2,"attempt":1,"step":12,"grad_norm":"Infinity",)"
                 R"("skipped":true,"loss_scale":32768,"loss":"NaN",)"
                 R"("time_unix_nanos":0,"batch_ids":[24,25]})");
}

TEST(WriteStep, OmitsAbsentOptionalFieldsButKeepsPresentZeros) {
  v1::StepRecord record;
  record.set_step(3);
  record.set_clipped(false);
  std::string out;
  JsonWriter w(&out);
  WriteStep(w, record, 0, 0);
  EXPECT_THAT(out, HasSubstr(R"("clipped":false)"));
  EXPECT_THAT(out, Not(HasSubstr("clip_coef")));
  EXPECT_THAT(out, Not(HasSubstr("loss_scale")));
  EXPECT_THAT(out, Not(HasSubstr("batch_ids")));
}

TEST(WriteAlert, HasEveryKeyAndNullWhileFiring) {
  v1::Alert alert;
  alert.set_alertname("GradNormSpike");
  alert.set_run("r1");
  alert.set_severity(v1::SEVERITY_WARNING);
  alert.set_state(v1::ALERT_STATE_FIRING);
  alert.set_started_step(150);
  alert.set_peak_value(12.5);
  alert.set_description("norm \"12.5\" is 40x\nthe mean");
  std::string out;
  JsonWriter w(&out);
  WriteAlert(w, alert);
  for (const char* key :
       {"alertname", "run", "severity", "state", "started_step",
        "resolved_step", "peak_value", "description", "likely_cause", "fix",
        "batch_ids", "summary", "rank", "started_unix_nanos",
        "resolved_unix_nanos"}) {
    EXPECT_THAT(out, HasSubstr(absl::StrCat("\"", key, "\":"))) << key;
  }
  EXPECT_THAT(out, HasSubstr(R"("started_step":150,"resolved_step":null)"));
  EXPECT_THAT(out, HasSubstr(R"("batch_ids":[])"));
  EXPECT_THAT(out, HasSubstr(R"(norm \"12.5\" is 40x\nthe mean)"));

  alert.set_state(v1::ALERT_STATE_RESOLVED);
  alert.set_resolved_step(400);
  out.clear();
  JsonWriter w2(&out);
  WriteAlert(w2, alert);
  EXPECT_THAT(out, HasSubstr(R"("resolved_step":400)"));
}

TEST(JsonWriter, SeparatesNestedValuesAndParsesBackAsAStepRecord) {
  std::string out;
  JsonWriter w(&out);
  w.BeginArray();
  for (uint64_t step : {uint64_t{1}, uint64_t{1} << 60}) {
    v1::StepRecord record;
    record.set_step(step);
    record.set_lr(3e-4);
    (*record.mutable_layer_stats())["mlp"].set_grad_rms(0.25);
    WriteStep(w, record, 0, 0);
  }
  w.EndArray();
  EXPECT_THAT(out, StartsWith(R"([{"rank":0,"attempt":0,"step":1,)"));
  EXPECT_THAT(
      out, HasSubstr(R"(},{"rank":0,"attempt":0,"step":1152921504606846976,)"));
  EXPECT_THAT(
      out,
      HasSubstr(R"("layer_stats":{"mlp":{"grad_norm":0,"grad_rms":0.25,)"));

  // The object is the JSONL step-line format plus rank and attempt: strip
  // those and the reader must take it back unchanged.
  v1::StepRecord record;
  record.set_step(9);
  record.set_grad_norm(std::numeric_limits<double>::quiet_NaN());
  record.set_lr(3e-4);
  record.add_batch_ids(-1);
  std::string line;
  JsonWriter w3(&line);
  WriteStep(w3, record, 0, 0);
  const std::string prefix = R"({"rank":0,"attempt":0,)";
  ASSERT_THAT(line, StartsWith(prefix));
  std::vector<StepLogEntry> entries =
      ReadAll("{" + line.substr(prefix.size()) + "\n");
  ASSERT_EQ(entries.size(), 1u);
  const v1::StepRecord& back = std::get<v1::StepRecord>(entries[0]);
  EXPECT_EQ(back.step(), 9u);
  EXPECT_TRUE(std::isnan(back.grad_norm()));
  EXPECT_EQ(back.lr(), 3e-4);
  EXPECT_THAT(back.batch_ids(), ::testing::ElementsAre(-1));
}

}  // namespace
}  // namespace trainwatch::cli
