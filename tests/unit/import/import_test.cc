// Tests of `import`'s readers (client/cli/import_*.cc): TFRecord framing and
// Event parsing on the real event files of ../shared/testdata/tensorboard
// and on corrupt and truncated files written here, the tag table, the
// trainer_state.json / stdout / CSV parsers, and what PlanImport infers.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "gtest/gtest.h"
#include "shared_data.h"
#include "import/import_files.h"
#include "import/import_log.h"
#include "import/import_tensorboard.h"
#include "import/import_text.h"

namespace trainwatch::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Contains;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// --- A minimal event-file writer, only for corrupt and truncated cases. ---

void PutTag(std::string* out, int field, int wire) {
  google::protobuf::io::StringOutputStream s(out);
  google::protobuf::io::CodedOutputStream c(&s);
  c.WriteTag((field << 3) | wire);
}
void PutVarint(std::string* out, uint64_t v) {
  google::protobuf::io::StringOutputStream s(out);
  google::protobuf::io::CodedOutputStream c(&s);
  c.WriteVarint64(v);
}
void PutBytes(std::string* out, int field, const std::string& bytes) {
  PutTag(out, field, 2);
  PutVarint(out, bytes.size());
  *out += bytes;
}
void PutFixed32(std::string* out, int field, uint32_t v) {
  PutTag(out, field, 5);
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

std::string SimpleValue(const std::string& tag, float value) {
  std::string v;
  PutBytes(&v, 1, tag);
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  PutFixed32(&v, 2, bits);
  return v;
}

// A Summary.Value holding a scalar tensor: dtype float with float_val, or
// dtype double with tensor_content.
std::string TensorValue(const std::string& tag, double value, bool as_double) {
  std::string tensor;
  PutTag(&tensor, 1, 0);
  PutVarint(&tensor, as_double ? 2 : 1);
  PutBytes(&tensor, 2, "");  // scalar shape
  if (as_double) {
    std::string content(8, '\0');
    std::memcpy(content.data(), &value, 8);
    PutBytes(&tensor, 4, content);
  } else {
    float f = static_cast<float>(value);
    std::string packed(4, '\0');
    std::memcpy(packed.data(), &f, 4);
    PutBytes(&tensor, 5, packed);
  }
  std::string plugin;
  PutBytes(&plugin, 1, "scalars");
  std::string metadata;
  PutBytes(&metadata, 1, plugin);
  std::string v;
  PutBytes(&v, 1, tag);
  PutBytes(&v, 8, tensor);
  PutBytes(&v, 9, metadata);
  return v;
}

std::string EventWith(int64_t step, const std::vector<std::string>& values) {
  std::string summary;
  for (const std::string& v : values) PutBytes(&summary, 1, v);
  std::string event;
  PutTag(&event, 2, 0);
  PutVarint(&event, static_cast<uint64_t>(step));
  PutBytes(&event, 5, summary);
  return event;
}

std::string Le(uint64_t v, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
  return out;
}

std::string Frame(const std::string& data) {
  const std::string len = Le(data.size(), 8);
  return len + Le(MaskCrc(Crc32c(len)), 4) + data +
         Le(MaskCrc(Crc32c(data)), 4);
}

std::string TestDataDir() {
  return std::string(TW_SHARED_TESTDATA) + "/tensorboard/";
}

std::string WriteTemp(const std::string& name, const std::string& bytes) {
  const std::string path =
      (std::filesystem::temp_directory_path() / name).string();
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// --- TFRecord framing and Event parsing. ---

TEST(Crc32c, KnownVector) {
  // The CRC-32C check value (RFC 3720).
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
}

TEST(EventFile, ReadsSimpleValuesAndScalarTensors) {
  const std::string file =
      Frame(EventWith(1, {SimpleValue("train/loss", 2.5f)})) +
      Frame(EventWith(2, {TensorValue("grad-norm", 0.75, false),
                          TensorValue("learning-rate", 3e-4, true)}));
  std::vector<std::tuple<std::string, int64_t, double>> points;
  int64_t truncated = -1;
  ASSERT_TRUE(ReadEventScalars(file, "f",
                               [&](const ScalarPoint& p) {
                                 points.emplace_back(std::string(p.tag),
                                                     p.step, p.value);
                               },
                               &truncated)
                  .ok());
  EXPECT_EQ(truncated, -1);
  ASSERT_EQ(points.size(), 3u);
  EXPECT_EQ(points[0], std::make_tuple(std::string("train/loss"), 1, 2.5));
  EXPECT_EQ(std::get<0>(points[1]), "grad-norm");
  EXPECT_FLOAT_EQ(std::get<2>(points[1]), 0.75);
  EXPECT_DOUBLE_EQ(std::get<2>(points[2]), 3e-4);
}

TEST(EventFile, TruncatedTailKeepsEarlierRecords) {
  const std::string first = Frame(EventWith(1, {SimpleValue("loss", 1.0f)}));
  const std::string second = Frame(EventWith(2, {SimpleValue("loss", 2.0f)}));
  for (size_t cut : {size_t{5}, size_t{12}, second.size() - 1}) {
    const std::string file = first + second.substr(0, cut);
    int points = 0;
    int64_t truncated = -1;
    ASSERT_TRUE(ReadEventScalars(file, "f",
                                 [&](const ScalarPoint&) { ++points; },
                                 &truncated)
                    .ok());
    EXPECT_EQ(points, 1) << "cut " << cut;
    EXPECT_EQ(truncated, static_cast<int64_t>(first.size())) << "cut " << cut;
  }
}

TEST(EventFile, DataCrcMismatchNamesTheOffset) {
  const std::string first = Frame(EventWith(1, {SimpleValue("loss", 1.0f)}));
  std::string second = Frame(EventWith(2, {SimpleValue("loss", 2.0f)}));
  second[14] ^= 0x40;  // inside the data
  absl::Status s = ReadEventScalars(first + second, "run.tfevents",
                                    [](const ScalarPoint&) {});
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(),
              HasSubstr("run.tfevents:offset " + std::to_string(first.size())));
  EXPECT_THAT(s.message(), HasSubstr("data CRC"));
}

TEST(EventFile, LengthCrcMismatchIsAnError) {
  std::string file = Frame(EventWith(1, {SimpleValue("loss", 1.0f)}));
  file[9] ^= 1;
  absl::Status s = ReadEventScalars(file, "f", [](const ScalarPoint&) {});
  EXPECT_THAT(s.message(), HasSubstr("f:offset 0: record length CRC"));
}

TEST(EventFile, ImportReportsTruncationAndUsesTheTable) {
  const std::string good =
      Frame(EventWith(1, {SimpleValue("train/grad_norm", 1.5f),
                          SimpleValue("train/loss", 3.0f),
                          SimpleValue("eval/loss", 9.0f)}));
  const std::string path = WriteTemp("tw_import_trunc.tfevents",
                                     good + good.substr(0, 20));
  LoggedRun run;
  ASSERT_TRUE(ImportTensorBoard(path, {}, &run).ok());
  ASSERT_EQ(run.steps.size(), 1u);
  EXPECT_FLOAT_EQ(*run.steps[1].grad_norm, 1.5);
  EXPECT_EQ(run.source, LogSource::kHuggingFace);
  EXPECT_THAT(run.notes, Contains(HasSubstr(absl::StrCat(
                             "truncated at offset ", good.size()))));
  EXPECT_THAT(run.notes, Contains(HasSubstr("eval/loss")));
}

// The real Megatron-LM file: every grad-norm point, none of the "vs samples"
// copies (whose steps are sample counts up to 27520).
TEST(EventFile, RealMegatronFile) {
  TW_SKIP_WITHOUT_SHARED(TestDataDir() +
                      "elena-lyulina__Megatron-LM-Attention-Benchmark__events."
                      "out.tfevents.1776244695.nid007435.275938.0");
  LoggedRun run;
  ASSERT_TRUE(ImportTensorBoard(
                  TestDataDir() +
                      "elena-lyulina__Megatron-LM-Attention-Benchmark__events."
                      "out.tfevents.1776244695.nid007435.275938.0",
                  {}, &run)
                  .ok());
  int norms = 0, losses = 0, lrs = 0, times = 0;
  for (const auto& [step, s] : run.steps) {
    norms += s.grad_norm.has_value();
    losses += s.loss.has_value();
    lrs += s.lr.has_value();
    times += s.step_time_s.has_value();
    EXPECT_LE(step, 344u);
  }
  EXPECT_EQ(norms, 344);
  EXPECT_EQ(losses, 344);
  EXPECT_EQ(lrs, 344);
  EXPECT_EQ(times, 343);
  EXPECT_EQ(run.source, LogSource::kMegatron);
  EXPECT_NEAR(*run.steps[5].grad_norm, 111.6, 0.1);
}

TEST(EventFile, RealSparseHfFile) {
  TW_SKIP_WITHOUT_SHARED(TestDataDir() +
                      "anra8571__WikipediaLLM__events.out.tfevents.1755815213."
                      "Cerebro.18280.1");
  LoggedRun run;
  ASSERT_TRUE(ImportTensorBoard(
                  TestDataDir() +
                      "anra8571__WikipediaLLM__events.out.tfevents.1755815213."
                      "Cerebro.18280.1",
                  {}, &run)
                  .ok());
  std::vector<uint64_t> norm_steps;
  for (const auto& [step, s] : run.steps) {
    if (s.grad_norm.has_value()) norm_steps.push_back(step);
  }
  EXPECT_EQ(norm_steps,
            (std::vector<uint64_t>{500, 1000, 1500, 2000, 2500, 3000}));
  absl::StatusOr<ImportPlan> plan = PlanImport(run, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->labels["logged_every"], "500");
  // The window's span is said in the server's terms, not as a fixed W.
  EXPECT_THAT(plan->notes, Contains(HasSubstr("the server's W, window_steps, spans W x 500 "
                                              "steps: 500000 at its default 1000")));
  EXPECT_EQ(plan->max_norm, 1.0);  // the HF default, said in the notes
  EXPECT_THAT(plan->notes, Contains(HasSubstr("max_grad_norm")));
}

// --- The tag table. ---

TEST(TagTable, CommonNamesAndExclusions) {
  EXPECT_EQ(LookUpTag("train/grad_norm", {})->field, LogField::kGradNorm);
  EXPECT_EQ(LookUpTag("lm loss", {})->field, LogField::kLoss);
  EXPECT_EQ(LookUpTag("train/lm_loss", {})->field, LogField::kLoss);
  EXPECT_EQ(LookUpTag("Learning-Rate", {})->field, LogField::kLr);
  EXPECT_EQ(LookUpTag("runtime/iteration_time", {})->field, LogField::kStepTime);
  EXPECT_DOUBLE_EQ(LookUpTag("elapsed time per iteration (ms)", {})->scale,
                   1e-3);
  EXPECT_FALSE(LookUpTag("grad-norm vs samples", {}).has_value());
  EXPECT_FALSE(LookUpTag("train/train_loss", {}).has_value());
  EXPECT_FALSE(LookUpTag("eval/loss", {}).has_value());
  TagMap map;
  ASSERT_TRUE(AddTagMapping("my/norm=grad_norm", &map).ok());
  ASSERT_TRUE(AddTagMapping("a=b=loss", &map).ok());
  EXPECT_EQ(LookUpTag("My/Norm", map)->field, LogField::kGradNorm);
  EXPECT_EQ(LookUpTag("a=b", map)->field, LogField::kLoss);
  EXPECT_FALSE(AddTagMapping("x=nonsense", &map).ok());
  EXPECT_FALSE(AddTagMapping("nofield", &map).ok());
}

// --- trainer_state.json. ---

TEST(HfTrainerState, ReadsTrainEntriesOnly) {
  const std::string text = R"({
  "logging_steps": 10,
  "log_history": [
    {"epoch": 0.1, "grad_norm": 2.5, "learning_rate": 1e-05, "loss": 3.1, "step": 10},
    {"epoch": 0.2, "grad_norm": NaN, "learning_rate": 2e-05, "loss": 3.0, "step": 20},
    {"epoch": 0.2, "eval_loss": 2.9, "eval_runtime": 1.0, "step": 20},
    {"epoch": 0.3, "grad_norm": Infinity, "learning_rate": 3e-05, "loss": 2.8, "step": 30},
    {"epoch": 1.0, "step": 30, "train_loss": 2.95, "train_runtime": 100.0, "total_flos": 1}
  ]
})";
  LoggedRun run;
  ASSERT_TRUE(ParseHfTrainerState(text, "trainer_state.json", {}, &run).ok());
  ASSERT_EQ(run.steps.size(), 3u);
  EXPECT_DOUBLE_EQ(*run.steps[10].grad_norm, 2.5);
  EXPECT_TRUE(std::isnan(*run.steps[20].grad_norm));
  EXPECT_DOUBLE_EQ(*run.steps[20].loss, 3.0);  // not eval_loss
  EXPECT_TRUE(std::isinf(*run.steps[30].grad_norm));
  EXPECT_DOUBLE_EQ(*run.steps[30].loss, 2.8);  // not the summary's train_loss
  EXPECT_EQ(run.logging_steps, 10u);
  EXPECT_EQ(run.source, LogSource::kHuggingFace);
}

TEST(HfTrainerState, ErrorsNameTheLineOrEntry) {
  LoggedRun run;
  absl::Status bad_json = ParseHfTrainerState(
      "{\n  \"log_history\": [\n    {\"step\": 1,,}\n  ]\n}", "ts.json", {},
      &run);
  EXPECT_THAT(bad_json.message(), HasSubstr("ts.json:3:"));
  absl::Status no_step = ParseHfTrainerState(
      R"({"log_history": [{"loss": 1.0, "step": 1}, {"loss": 2.0}]})", "ts.json",
      {}, &run);
  EXPECT_THAT(no_step.message(), HasSubstr("ts.json: log_history[1]"));
  absl::Status not_hf = ParseHfTrainerState(R"({"a": 1})", "x.json", {}, &run);
  EXPECT_THAT(not_hf.message(), HasSubstr("log_history"));
}

// --- Training stdout. ---

TEST(TrainingStdout, MegatronDeepSpeedNeoxAndLlmc) {
  const std::string text =
      "building GPT model ...\n"
      " [2024-05-01 10:00:01] iteration        1/     100 | consumed samples:  "
      "512 | elapsed time per iteration (ms): 1500.0 | learning rate: "
      "1.000E-05 | global batch size:   512 | lm loss: 1.100000E+01 | loss "
      "scale: 65536.0 | grad norm: 12.345 | number of skipped iterations:   0 "
      "| number of nan iterations:   0 |\n"
      "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: "
      "65536, reducing to 32768\n"
      " iteration        2/     100 | elapsed time per iteration (ms): 900.0 "
      "| learning rate: 2.000E-05 | lm loss: 1.090000E+01 |\n"
      " iteration        3/     100 | lm loss: nan | loss scale: 32768.0 | "
      "grad norm: 3.0 | number of skipped iterations:   0 | number of nan "
      "iterations:   1 |\n"
      " samples/sec: 12.3 | iteration        4/     100 | lm_loss: 1.05E+01 | "
      "loss scale: 32768.0 | number of skipped iterations:   1 |\n"
      "step    5/19073 | train loss 10.5 | norm 2.5 | lr 6.00e-04 | (3451.40 "
      "ms | 151906 tok/s)\n";
  LoggedRun run;
  ASSERT_TRUE(ParseTrainingStdout(text, "train.log", {}, &run).ok());
  ASSERT_EQ(run.steps.size(), 5u);
  const LoggedStep& s1 = run.steps[1];
  EXPECT_DOUBLE_EQ(*s1.grad_norm, 12.345);
  EXPECT_DOUBLE_EQ(*s1.loss, 11.0);
  EXPECT_DOUBLE_EQ(*s1.lr, 1e-5);
  EXPECT_DOUBLE_EQ(*s1.loss_scale, 65536);
  EXPECT_DOUBLE_EQ(*s1.step_time_s, 1.5);
  EXPECT_EQ(s1.skipped, 0u);
  EXPECT_EQ(run.steps[2].skipped, 1u);  // the overflow line before it
  EXPECT_DOUBLE_EQ(*run.steps[2].loss_scale, 32768);
  EXPECT_TRUE(run.steps[3].nan_iteration);
  EXPECT_EQ(run.steps[4].skipped, 1u);
  EXPECT_DOUBLE_EQ(*run.steps[4].loss, 10.5);
  EXPECT_DOUBLE_EQ(*run.steps[5].grad_norm, 2.5);
  EXPECT_DOUBLE_EQ(*run.steps[5].loss, 10.5);
  EXPECT_EQ(run.source, LogSource::kMegatron);
}

TEST(TrainingStdout, BadValueNamesTheLine) {
  LoggedRun run;
  absl::Status s = ParseTrainingStdout(
      "noise\n iteration 1/ 10 | grad norm: 1.0 |\n iteration 2/ 10 | grad "
      "norm: abc |\n",
      "train.log", {}, &run);
  EXPECT_THAT(s.message(), HasSubstr("train.log:3:"));
  absl::Status none = ParseTrainingStdout("hello\nworld\n", "x.log", {}, &run);
  EXPECT_THAT(none.message(), HasSubstr("x.log: no training line"));
}

TEST(ParseOverflowLine, LeavesItsScaleForTheNextIterationLine) {
  LoggedRun run;
  StdoutParse parse{.map = {}, .run = &run};
  absl::StatusOr<bool> read = ParseOverflowLine(
      "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: "
      "65536, reducing to 32768",
      "t.log:1", &parse);
  ASSERT_TRUE(read.ok() && *read);
  read = ParseOverflowLine(
      "Overflow detected. Skipping step. Attempted loss scale: 4096, reducing "
      "to 2048",
      "t.log:2", &parse);
  ASSERT_TRUE(read.ok() && *read);
  EXPECT_EQ(parse.overflow_lines, 2u);
  EXPECT_EQ(parse.pending_overflows, 2u);
  EXPECT_EQ(parse.pending_scale, 2048.0);
  EXPECT_EQ(parse.step_lines, 0u);
  EXPECT_TRUE(run.steps.empty());
  read = ParseOverflowLine(" iteration 1/ 10 | loss scale: 1.0 |", "t.log:3", &parse);
  ASSERT_TRUE(read.ok());
  EXPECT_FALSE(*read);
}

TEST(ParseLlmcLogLine, ReadsKnownKeysButNotTheEvalLoss) {
  LoggedRun run;
  StdoutParse parse{.map = {}, .run = &run};
  absl::StatusOr<bool> read = ParseLlmcLogLine(
      "s:100 trl:3.2164 tel:3.5 lr:0.0006 norm:0.31", "llmc.log:1", &parse);
  ASSERT_TRUE(read.ok() && *read);
  EXPECT_EQ(parse.step_lines, 1u);
  ASSERT_EQ(run.steps.count(100), 1u);
  const LoggedStep& s = run.steps[100];
  EXPECT_DOUBLE_EQ(*s.loss, 3.2164);  // trl, not tel
  EXPECT_DOUBLE_EQ(*s.lr, 0.0006);
  EXPECT_DOUBLE_EQ(*s.grad_norm, 0.31);

  // Its format, but nothing trainwatch reads: claimed, not a step line.
  read = ParseLlmcLogLine("s:101 tel:3.4", "llmc.log:2", &parse);
  ASSERT_TRUE(read.ok() && *read);
  EXPECT_EQ(parse.step_lines, 1u);
  EXPECT_EQ(run.steps.count(101), 0u);

  read = ParseLlmcLogLine("step 1/10 | train loss 3.0", "llmc.log:3", &parse);
  ASSERT_TRUE(read.ok());
  EXPECT_FALSE(*read);

  read = ParseLlmcLogLine("s:102 trl:abc", "llmc.log:4", &parse);
  EXPECT_THAT(read.status().message(),
              HasSubstr("llmc.log:4: \"trl:abc\" is not a number"));
}

TEST(ParseIterationLine, TakesPendingOverflowsUnlessTheLineCountsSkips) {
  LoggedRun run;
  StdoutParse parse{.map = {}, .run = &run};
  parse.pending_overflows = 2;
  parse.pending_scale = 1024.0;
  absl::StatusOr<bool> read = ParseIterationLine(
      " iteration        7/     100 | lm loss: 2.5 | grad norm: 0.75 |",
      "t.log:1", &parse);
  ASSERT_TRUE(read.ok() && *read);
  EXPECT_EQ(parse.step_lines, 1u);
  EXPECT_EQ(run.steps[7].skipped, 2u);
  EXPECT_EQ(run.steps[7].loss_scale, 1024.0);
  EXPECT_DOUBLE_EQ(*run.steps[7].grad_norm, 0.75);
  EXPECT_EQ(parse.pending_overflows, 0u);
  EXPECT_FALSE(parse.pending_scale.has_value());

  // The line's own skip count and loss scale win over the overflow lines'.
  parse.pending_overflows = 3;
  parse.pending_scale = 512.0;
  read = ParseIterationLine(
      " iteration 8/ 100 | loss scale: 256.0 | number of skipped iterations: 1 "
      "| number of nan iterations: 2 |",
      "t.log:2", &parse);
  ASSERT_TRUE(read.ok() && *read);
  EXPECT_EQ(run.steps[8].skipped, 1u);
  EXPECT_EQ(run.steps[8].loss_scale, 256.0);
  EXPECT_TRUE(run.steps[8].nan_iteration);

  // llm.c's stdout: "key value" segments.
  read = ParseIterationLine("step    9/19073 | train loss 10.5 | norm 2.5 |",
                            "t.log:3", &parse);
  ASSERT_TRUE(read.ok() && *read);
  EXPECT_DOUBLE_EQ(*run.steps[9].loss, 10.5);
  EXPECT_DOUBLE_EQ(*run.steps[9].grad_norm, 2.5);

  read = ParseIterationLine("s:10 trl:3.0", "t.log:4", &parse);
  ASSERT_TRUE(read.ok());
  EXPECT_FALSE(*read);
  read = ParseIterationLine(" iteration 11/ 100 | number of nan iterations: x |",
                            "t.log:5", &parse);
  EXPECT_THAT(read.status().message(),
              HasSubstr("t.log:5: \"number of nan iterations: x\": the count"));
}

// --- CSV. ---

TEST(CsvLog, HeaderMappingAndErrors) {
  LoggedRun run;
  ASSERT_TRUE(ParseCsvLog("\"Step\",\"train/grad_norm\",train/loss,other\n"
                          "1,0.5,2.0,x\n2,,1.9,y\n3.0,nan,1.8,z\n",
                          "w.csv", {}, &run)
                  .ok());
  ASSERT_EQ(run.steps.size(), 3u);
  EXPECT_DOUBLE_EQ(*run.steps[1].grad_norm, 0.5);
  EXPECT_FALSE(run.steps[2].grad_norm.has_value());
  EXPECT_TRUE(std::isnan(*run.steps[3].grad_norm));
  LoggedRun bad;
  EXPECT_THAT(ParseCsvLog("step,loss\n1,2\n2,x\n", "b.csv", {}, &bad).message(),
              HasSubstr("b.csv:3:"));
  EXPECT_THAT(ParseCsvLog("step,loss\n1,2,3\n", "c.csv", {}, &bad).message(),
              HasSubstr("c.csv:2: 3 cells"));
  EXPECT_THAT(ParseCsvLog("Wall time,Step,Value\n1,1,2\n", "tb.csv", {}, &bad)
                  .message(),
              HasSubstr("--map"));
  TagMap map;
  ASSERT_TRUE(AddTagMapping("Value=grad_norm", &map).ok());
  LoggedRun mapped;
  ASSERT_TRUE(
      ParseCsvLog("Wall time,Step,Value\n1,7,2.5\n", "tb.csv", map, &mapped).ok());
  EXPECT_DOUBLE_EQ(*mapped.steps[7].grad_norm, 2.5);
}

TEST(CsvLog, Fp8ColumnsBecomeTheFp8Map) {
  LoggedRun run;
  ASSERT_TRUE(ParseCsvLog(
                  "step,grad_norm,fp8/Layers.0/fc1:input/amax,fp8/Layers.0/fc1:input/scale,"
                  "fp8/Layers.0/fc1:input/format,fp8/Layers.0/fc1:input/underflow_fraction,"
                  "fp8/fc2:grad_output/amax,fp8/fc2:grad_output/scale,fp8/x/bogus\n"
                  "10,0.5,3.5,128,3,0.25,0.01,5e6,1\n"
                  "20,0.6,3.6,124,3,1.5,0.02,2.8e6,1\n",
                  "fp8.csv", {}, &run)
                  .ok());
  ImportSettings settings;
  absl::StatusOr<ImportPlan> plan = PlanImport(run, settings);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->records.size(), 2u);
  const v1::StepRecord& r = plan->records[0];
  ASSERT_EQ(r.fp8_size(), 2);
  // The tensor name keeps its case and its '/'.
  const v1::Fp8TensorStats& in = r.fp8().at("Layers.0/fc1:input");
  EXPECT_EQ(in.format(), v1::E4M3_FNUZ);
  EXPECT_DOUBLE_EQ(in.amax(), 3.5);
  EXPECT_DOUBLE_EQ(in.scale(), 128);
  EXPECT_DOUBLE_EQ(in.underflow_fraction(), 0.25);
  // No format column: gradients read as E5M2, said in the notes.
  EXPECT_EQ(r.fp8().at("fc2:grad_output").format(), v1::E5M2);
  EXPECT_THAT(absl::StrJoin(plan->notes, "\n"), HasSubstr("without a fp8/<tensor>/format"));
  // A share outside [0, 1] is left out (the server would refuse the batch).
  EXPECT_FALSE(plan->records[1].fp8().at("Layers.0/fc1:input").has_underflow_fraction());
  EXPECT_THAT(absl::StrJoin(plan->notes, "\n"), HasSubstr("outside [0, 1] left out"));
}

TEST(DetectFormat, ByContent) {
  EXPECT_EQ(DetectFormat("x", Frame("abc")), ImportFormat::kTensorBoard);
  EXPECT_EQ(DetectFormat("trainer_state.json", " {\"log_history\": []}"),
            ImportFormat::kHf);
  EXPECT_EQ(DetectFormat("a.csv", "step,loss\n1,2\n"), ImportFormat::kCsv);
  EXPECT_EQ(DetectFormat("out.log", " iteration 1/ 2 | lm loss: 1 |\n"),
            ImportFormat::kMegatron);
}

// --- What PlanImport infers. ---

LoggedRun HfRun(int steps, double norm) {
  LoggedRun run;
  run.source = LogSource::kHuggingFace;
  for (int i = 1; i <= steps; ++i) {
    run.Set(i, LogField::kGradNorm, norm);
    run.Set(i, LogField::kLoss, 3.0 - i * 0.001);
    // 20 warmup steps, then linear decay.
    run.Set(i, LogField::kLr, i <= 20 ? 5e-5 * i / 20 : 5e-5 * (1 - (i - 20.0) / steps));
  }
  return run;
}

TEST(PlanImport, InfersWarmupFromTheLrRamp) {
  absl::StatusOr<ImportPlan> plan = PlanImport(HfRun(200, 0.5), {});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->warmup_steps, 20u);
  EXPECT_THAT(plan->notes, Contains(HasSubstr("warmup: 20 steps, inferred")));
  ImportSettings given;
  given.warmup_steps = 5;
  plan = PlanImport(HfRun(200, 0.5), given);
  EXPECT_EQ(plan->warmup_steps, 5u);
  EXPECT_THAT(plan->notes, Contains(HasSubstr("the LR ramp says 20")));
}

TEST(PlanImport, HfFp16WithoutLoggedScaleInfersAScaler) {
  ImportSettings settings;
  settings.precision = Precision::kFp16;
  absl::StatusOr<ImportPlan> plan = PlanImport(HfRun(200, 0.5), settings);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->precision, Precision::kUnspecified);
  EXPECT_EQ(plan->labels["precision"], "fp16");
  EXPECT_EQ(plan->labels["loss_scaler"], "inferred");
  EXPECT_THAT(plan->notes, Contains(HasSubstr("GradScaler is inferred")));
}

TEST(PlanImport, RecoveredNonFiniteNormsAreSkips) {
  LoggedRun run = HfRun(200, 0.5);
  run.Set(3, LogField::kGradNorm, kInf);
  run.Set(4, LogField::kGradNorm, kNaN);
  absl::StatusOr<ImportPlan> plan = PlanImport(run, {});
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->records[2].skipped());
  EXPECT_TRUE(plan->records[3].skipped());
  EXPECT_FALSE(plan->records[4].skipped());
  EXPECT_THAT(plan->notes, Contains(HasSubstr("2 logged steps with a non-finite")));
}

TEST(PlanImport, NanFromTheStartIsNotASkip) {
  LoggedRun run = HfRun(200, kNaN);
  absl::StatusOr<ImportPlan> plan = PlanImport(run, {});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->records.front().step(), 1u);
  EXPECT_FALSE(plan->records.front().skipped());
  EXPECT_TRUE(std::isnan(plan->records.front().grad_norm()));
  EXPECT_THAT(plan->notes, Contains(HasSubstr("did not recover")));
}

TEST(PlanImport, ZeroNormsWithALossAreArtifacts) {
  LoggedRun run = HfRun(200, 0.5);
  for (int i = 50; i < 120; ++i) run.Set(i, LogField::kGradNorm, 0.0);
  absl::StatusOr<ImportPlan> plan = PlanImport(run, {});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->records.size(), 130u);
  for (const auto& r : plan->records) EXPECT_NE(r.grad_norm(), 0.0);
  EXPECT_THAT(plan->notes,
              Contains(HasSubstr("70 logged norms are exactly 0.0")));
}

TEST(PlanImport, NoNormAtAllKeepsTheLoss) {
  LoggedRun run;
  for (int i = 1; i <= 10; ++i) run.Set(i, LogField::kLoss, 2.0);
  absl::StatusOr<ImportPlan> plan = PlanImport(run, {});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->records.size(), 10u);
  EXPECT_EQ(plan->max_norm, 0.0);
  EXPECT_EQ(plan->labels["grad_norm"], "not logged");
}

TEST(PlanImport, MegatronSkipsAndUnitScale) {
  LoggedRun run;
  run.source = LogSource::kMegatron;
  for (int i = 1; i <= 10; ++i) {
    run.Set(i, LogField::kLoss, 2.0);
    run.Set(i, LogField::kLossScale, 1.0);
    if (i != 4) run.Set(i, LogField::kGradNorm, 1.0);
  }
  run.steps[4].skipped = 1;
  absl::StatusOr<ImportPlan> plan = PlanImport(run, {});
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->records[3].skipped());
  EXPECT_TRUE(std::isinf(plan->records[3].grad_norm()));
  EXPECT_FALSE(plan->records[0].has_loss_scale());  // 1.0: no scaling
  EXPECT_EQ(plan->precision, Precision::kUnspecified);
}

TEST(IsZeroNormArtifact, AnExactZeroNormBesideAFiniteNonZeroLoss) {
  EXPECT_TRUE(IsZeroNormArtifact({.grad_norm = 0.0, .loss = 2.5}));
  EXPECT_TRUE(IsZeroNormArtifact({.grad_norm = -0.0, .loss = -1.0}));
  EXPECT_FALSE(IsZeroNormArtifact({.grad_norm = 1e-30, .loss = 2.5}));
  EXPECT_FALSE(IsZeroNormArtifact({.grad_norm = 0.0}));  // no loss to judge by
  EXPECT_FALSE(IsZeroNormArtifact({.grad_norm = 0.0, .loss = 0.0}));
  EXPECT_FALSE(IsZeroNormArtifact({.grad_norm = 0.0, .loss = kNaN}));
  EXPECT_FALSE(IsZeroNormArtifact({.grad_norm = 0.0, .loss = kInf}));
  EXPECT_FALSE(IsZeroNormArtifact({.loss = 2.5}));  // no norm at all
}

TEST(InferSkips, ARecoveredShortStreakIsSkippedTheRestApplied) {
  LoggedRun run;
  for (uint64_t i = 1; i <= 200; ++i) run.Set(i, LogField::kGradNorm, 1.0);
  run.Set(10, LogField::kGradNorm, kInf);  // recovered at 12
  run.Set(11, LogField::kGradNorm, kNaN);
  run.Set(20, LogField::kGradNorm, kInf);  // the log says skipped itself
  run.steps[20].skipped = 1;
  for (uint64_t i = 100; i <= 150; ++i) run.Set(i, LogField::kGradNorm, kNaN);
  run.Set(200, LogField::kGradNorm, kInf);  // never recovered
  std::vector<std::string> notes;
  const std::map<uint64_t, bool> skips = InferSkips(run, &notes);
  EXPECT_EQ(skips.at(10), true);
  EXPECT_EQ(skips.at(11), true);
  EXPECT_EQ(skips.count(20), 0u);
  EXPECT_EQ(skips.at(100), false);  // 51 steps: longer than a scaler backs off
  EXPECT_EQ(skips.at(150), false);
  EXPECT_EQ(skips.at(200), false);
  EXPECT_EQ(skips.count(12), 0u);
  EXPECT_EQ(skips.size(), 2u + 51u + 1u);
  EXPECT_THAT(notes, Contains(HasSubstr("skipped steps: 2 logged steps")));
  EXPECT_THAT(notes, Contains(HasSubstr("non-finite: 52 logged steps with a "
                                        "non-finite grad norm (steps 100..150)")));
}

TEST(MakeRecord, DropsAZeroNormArtifactUnlessTheRunIsNormBlind) {
  const LoggedStep zero{.grad_norm = 0.0, .loss = 2.5, .lr = 1e-4};
  RecordCounts counts;
  EXPECT_FALSE(MakeRecord(3, zero, {}, &counts).has_value());
  EXPECT_EQ(counts.no_norm, 1u);

  // A run with no other norm keeps it as it is, and its clipping unknown.
  std::optional<v1::StepRecord> blind =
      MakeRecord(3, zero, {.norm_blind = true}, &counts);
  ASSERT_TRUE(blind.has_value());
  EXPECT_EQ(blind->grad_norm(), 0.0);
  EXPECT_FALSE(blind->has_clipped());
  EXPECT_EQ(blind->lr(), 1e-4);
  // Without a norm at all it is sent with 0 and not clipped.
  std::optional<v1::StepRecord> no_norm =
      MakeRecord(4, {.loss = 2.5}, {.norm_blind = true}, &counts);
  ASSERT_TRUE(no_norm.has_value());
  EXPECT_EQ(no_norm->grad_norm(), 0.0);
  ASSERT_TRUE(no_norm->has_clipped());
  EXPECT_FALSE(no_norm->clipped());
  EXPECT_EQ(counts.no_norm, 1u);
}

TEST(MakeRecord, SkipsUnitScalesAndFp8Defaults) {
  LoggedStep logged{.grad_norm = kInf, .loss_scale = 1.0};
  logged.fp8["layer.0:grad_output"].set_overflow_fraction(1.5);
  logged.fp8["layer.0:input"].set_format(v1::E4M3);
  logged.fp8["layer.0:input"].set_underflow_fraction(0.25);
  RecordRules rules{.drop_unit_scale = true, .inferred_skips = {{5, true}}};
  RecordCounts counts;
  std::optional<v1::StepRecord> r = MakeRecord(5, logged, rules, &counts);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->step(), 5u);
  EXPECT_TRUE(r->skipped());
  EXPECT_TRUE(std::isinf(r->grad_norm()));
  EXPECT_FALSE(r->has_loss_scale());
  const v1::Fp8TensorStats& grad = r->fp8().at("layer.0:grad_output");
  EXPECT_EQ(grad.format(), v1::E5M2);  // HYBRID: gradients in E5M2
  EXPECT_FALSE(grad.has_overflow_fraction());  // 1.5 is not a share
  EXPECT_EQ(r->fp8().at("layer.0:input").underflow_fraction(), 0.25);
  EXPECT_EQ(counts.fp8_unformatted, 1u);
  EXPECT_EQ(counts.fp8_bad_shares, 1u);
  EXPECT_EQ(counts.reported_skips, 0u);  // inferred, not reported

  // A step the log reports as skipped has an overflowed, unprinted norm.
  r = MakeRecord(6, {.skipped = 1}, {}, &counts);
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->skipped());
  EXPECT_TRUE(std::isinf(r->grad_norm()));
  EXPECT_EQ(counts.reported_skips, 1u);
}

TEST(ParseLogNumber, Spellings) {
  EXPECT_DOUBLE_EQ(*ParseLogNumber("1.500E-04"), 1.5e-4);
  EXPECT_TRUE(std::isnan(*ParseLogNumber("nan")));
  EXPECT_TRUE(std::isinf(*ParseLogNumber("-Infinity")));
  EXPECT_FALSE(ParseLogNumber("0x10").has_value());
  EXPECT_FALSE(ParseLogNumber("1.0abc").has_value());
  EXPECT_FALSE(ParseLogNumber("").has_value());
}

}  // namespace
}  // namespace trainwatch::cli
