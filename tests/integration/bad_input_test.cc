// Bad input against the real trainwatch-server: each case
// sends raw protos with the generated stub (the C++ client would refuse some
// of them itself) and asserts the documented gRPC status and a message that
// names the field, value or step. Every case also proves that the server
// keeps serving and loses nothing: a healthy stream opened before the bad one
// gets an ack after it, and what was acked before the bad message is stored.
// The table in docs/errors-and-limits.md lists the same cases.
#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "harness.h"
#include "raw_stream.h"
#include "trainwatch/v1/trainwatch.grpc.pb.h"
#include "eventually.h"

namespace trainwatch::testing {
namespace {

using ::trainwatch::testing::Eventually;

using ::testing::HasSubstr;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
// Short keepalive, so that the dead-peer cases end in seconds.
const std::vector<std::string> kKeepaliveArgs = {"--keepalive-time", "1",
                                                 "--keepalive-timeout", "1"};


v1::ReportRequest Start(const std::string& run, uint32_t rank = 0,
                        uint32_t world_size = 1) {
  v1::ReportRequest r;
  v1::RunStart* s = r.mutable_start();
  s->set_run_id(run);
  s->set_rank(rank);
  s->set_world_size(world_size);
  s->set_precision(v1::BF16);
  s->set_max_norm(1.0);
  return r;
}

// A batch of ordinary records for `steps`, in the order given.
v1::ReportRequest Batch(uint64_t seq, const std::vector<uint64_t>& steps) {
  v1::ReportRequest r;
  r.mutable_batch()->set_seq(seq);
  for (uint64_t step : steps) {
    v1::StepRecord* rec = r.mutable_batch()->add_records();
    rec->set_step(step);
    rec->set_grad_norm(0.5);
  }
  return r;
}

std::vector<uint64_t> Range(uint64_t first, uint64_t n) {
  std::vector<uint64_t> steps;
  for (uint64_t i = first; i < first + n; ++i) steps.push_back(i);
  return steps;
}

v1::ReportRequest Event(uint64_t seq, uint64_t step, v1::EventKind kind,
                        const std::string& detail = "") {
  v1::ReportRequest r;
  r.mutable_event()->set_seq(seq);
  r.mutable_event()->set_step(step);
  r.mutable_event()->set_kind(kind);
  r.mutable_event()->set_detail(detail);
  return r;
}

// The fixture: a server with short keepalive, and a healthy stream opened
// before any bad input. TearDown proves the server kept serving: the healthy
// stream is acked after the bad input, every step it sent is stored, and
// the refusals were counted in trainwatch_ingest_rejected_total.
class BadInput : public ::testing::Test {
 protected:
  virtual std::vector<std::string> ExtraArgs() const { return kKeepaliveArgs; }

  void SetUp() override {
    server_ =
        std::make_unique<ServerProcess>(dir_.File("tw.db"), 0, ExtraArgs());
    ASSERT_GT(server_->grpc_port(), 0);
    stub_ = v1::TrainingHealth::NewStub(grpc::CreateChannel(
        server_->grpc_address(), grpc::InsecureChannelCredentials()));
    healthy_ = std::make_unique<RawStream>(server_->grpc_address());
    healthy_->Send(Start("healthy"));
    SendHealthyBatch();
  }

  void TearDown() override {
    if (healthy_ == nullptr) return;
    SendHealthyBatch();
    EXPECT_TRUE(healthy_->Finish().ok());
    EXPECT_EQ(StoredSteps("healthy").size(), healthy_steps_)
        << "the healthy stream lost records";
    std::string metrics = Metrics();
    for (const char* reason : {"invalid_argument", "resource_exhausted"}) {
      EXPECT_EQ(MetricValue(
                    metrics,
                    std::string("trainwatch_ingest_rejected_total{reason=\"") +
                        reason + "\"}"),
                refused_[reason])
          << reason;
    }
    EXPECT_EQ(MetricValue(metrics,
                          "trainwatch_ingest_rejected_total{reason=\"invalid_record\"}"),
              refused_records_);
  }

  void SendHealthyBatch() {
    ++healthy_seq_;
    healthy_->Send(Batch(healthy_seq_, Range(healthy_steps_, 10)));
    healthy_steps_ += 10;
    ASSERT_TRUE(healthy_->WaitAck(healthy_seq_))
        << "the healthy stream got no ack";
  }

  // Sends `messages` on a new stream and returns its final status.
  grpc::Status SendOnNewStream(const std::vector<v1::ReportRequest>& messages) {
    RawStream s(server_->grpc_address());
    for (const v1::ReportRequest& m : messages) {
      if (!s.Send(m)) break;  // the server ended the stream
    }
    return s.Finish();
  }

  // Opens a stream for `run`, has 10 records acked, then sends `bad`.
  // Returns the final status; checks that what was acked is stored.
  grpc::Status SendAfterGood(const v1::ReportRequest& bad,
                             const std::string& run = "bad-run") {
    RawStream s(server_->grpc_address());
    s.Send(Start(run));
    s.Send(Batch(1, Range(0, 10)));
    EXPECT_TRUE(s.WaitAck(1));
    s.Send(bad);
    grpc::Status status = s.Finish();
    EXPECT_EQ(StoredSteps(run).size(), 10u)
        << "records acked before the bad message";
    return status;
  }

  // Opens a stream for `run`, has 10 records (steps 0..9) acked, then sends
  // `bad` (seq 2), a batch holding a bad record among good ones: the bad
  // record is refused alone, the batch acked, the stream kept. Returns the
  // first refusal's reason; checks one record was refused and `stored` steps
  // are stored.
  std::string RefusedAlone(const v1::ReportRequest& bad, const std::string& run,
                           std::vector<uint64_t> stored) {
    RawStream s(server_->grpc_address());
    s.Send(Start(run));
    s.Send(Batch(1, Range(0, 10)));
    EXPECT_TRUE(s.WaitAck(1));
    s.Send(bad);
    EXPECT_TRUE(s.WaitAck(2)) << "the batch with a bad record was not acked";
    EXPECT_EQ(s.rejected(), 1u);
    // The stream goes on: a later batch is stored too.
    s.Send(Batch(3, {100}));
    EXPECT_TRUE(s.WaitAck(3));
    EXPECT_TRUE(s.Finish().ok());
    stored.push_back(100);
    std::vector<uint64_t> expected = Range(0, 10);
    expected.insert(expected.end(), stored.begin(), stored.end());
    EXPECT_EQ(StoredStepNumbers(run), expected);
    ++refused_records_;
    return s.reason();
  }

  // Asserts the status and counts the refusal for TearDown.
  void ExpectRefused(const grpc::Status& status, grpc::StatusCode code,
                     const std::string& message) {
    EXPECT_EQ(status.error_code(), code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(message));
    if (code == grpc::StatusCode::INVALID_ARGUMENT)
      ++refused_["invalid_argument"];
    if (code == grpc::StatusCode::RESOURCE_EXHAUSTED)
      ++refused_["resource_exhausted"];
  }

  std::vector<v1::StepRecords::Item> StoredSteps(const std::string& run) {
    grpc::ClientContext ctx;
    v1::QueryStepsRequest req;
    req.set_run_id(run);
    std::unique_ptr<grpc::ClientReader<v1::StepRecords>> reader =
        stub_->QuerySteps(&ctx, req);
    std::vector<v1::StepRecords::Item> items;
    v1::StepRecords chunk;
    while (reader->Read(&chunk)) {
      items.insert(items.end(), chunk.items().begin(), chunk.items().end());
    }
    grpc::Status status = reader->Finish();
    EXPECT_TRUE(status.ok() ||
                status.error_code() == grpc::StatusCode::NOT_FOUND)
        << status.error_message();
    return items;
  }

  std::vector<uint64_t> StoredStepNumbers(const std::string& run) {
    std::vector<uint64_t> steps;
    for (const auto& item : StoredSteps(run))
      steps.push_back(item.record().step());
    return steps;
  }

  v1::ListRunsResponse Runs() {
    grpc::ClientContext ctx;
    v1::ListRunsResponse resp;
    EXPECT_TRUE(stub_->ListRuns(&ctx, {}, &resp).ok());
    return resp;
  }

  // The labels ListRuns gives for `run`; fails the test if it is not listed.
  std::map<std::string, std::string> LabelsOf(const std::string& run) {
    v1::ListRunsResponse runs = Runs();
    for (const v1::RunSummary& r : runs.runs()) {
      if (r.run_id() == run) return {r.labels().begin(), r.labels().end()};
    }
    ADD_FAILURE() << "run " << run << " is not listed";
    return {};
  }

  std::set<std::string> AlertNames(const std::string& run) {
    grpc::ClientContext ctx;
    v1::ListAlertsRequest req;
    req.set_run_id(run);
    v1::ListAlertsResponse resp;
    EXPECT_TRUE(stub_->ListAlerts(&ctx, req, &resp).ok());
    std::set<std::string> names;
    for (const v1::Alert& a : resp.alerts()) names.insert(a.alertname());
    return names;
  }

  std::string Metrics() { return HttpGet(server_->metrics_url()); }

  double StreamsActive() {
    return MetricValue(Metrics(), "trainwatch_streams_active");
  }

  CommandResult Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), {BinDir() + "/trainwatchctl", "--server",
                               server_->grpc_address()});
    return RunCommand(args);
  }

  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<v1::TrainingHealth::Stub> stub_;
  std::unique_ptr<RawStream> healthy_;
  uint64_t healthy_seq_ = 0;
  uint64_t healthy_steps_ = 0;
  std::map<std::string, double> refused_;
  double refused_records_ = 0;  // refused alone (reason="invalid_record")
};

// ---- The first message and the RunStart ------------------------------------

TEST_F(BadInput, FirstMessageABatchIsRefused) {
  ExpectRefused(SendOnNewStream({Batch(1, Range(0, 3))}),
                grpc::StatusCode::INVALID_ARGUMENT,
                "the first message of a Report stream must be a RunStart");
}

TEST_F(BadInput, FirstMessageAnEventIsRefused) {
  ExpectRefused(SendOnNewStream({Event(1, 0, v1::CHECKPOINT_SAVED)}),
                grpc::StatusCode::INVALID_ARGUMENT,
                "the first message of a Report stream must be a RunStart");
}

TEST_F(BadInput, EmptyRequestIsRefused) {
  ExpectRefused(SendOnNewStream({v1::ReportRequest()}),
                grpc::StatusCode::INVALID_ARGUMENT,
                "empty ReportRequest: set one of start, batch, event or directive_ack");
}

TEST_F(BadInput, RepeatedRunStartIsRefusedAndTheAckedBatchKept) {
  ExpectRefused(SendAfterGood(Start("bad-run")),
                grpc::StatusCode::INVALID_ARGUMENT,
                "run bad-run rank 0: RunStart repeated on one stream");
}

TEST_F(BadInput, RunIdOf128CharactersIsAccepted) {
  const std::string longest(128, 'a');
  EXPECT_TRUE(SendOnNewStream({Start(longest), Batch(1, {0})}).ok());
  EXPECT_EQ(StoredSteps(longest).size(), 1u);
}

struct BadRunId {
  const char* name;
  std::string run_id;
  const char* error;
};

void PrintTo(const BadRunId& b, std::ostream* os) { *os << b.name; }

const BadRunId kBadRunIds[] = {
    {"Empty", "", "run_id is empty"},
    {"TooLong", std::string(129, 'a'), "run_id is 129 characters; at most 128"},
    {"Space", "bad run",
     "run_id has character 0x20 at position 3; allowed: [A-Za-z0-9._:/-]"},
    {"Quote", "run\"1", "run_id has character 0x22 at position 3"},
    // "run-é": the first byte of its UTF-8 is named.
    {"Unicode", "run-\xc3\xa9", "run_id has character 0xc3 at position 4"},
    // Not UTF-8 at all: protobuf cannot parse the message, which must still
    // end the stream with a clear status.
    {"NotUtf8", "run-\xff", "cannot parse the ReportRequest"},
    // The charset refuses it long before SQL could see it.
    {"SqlLooking", "x';DROP TABLE runs;--",
     "run_id has character 0x27 at position 1"},
};

class BadRunIds : public BadInput,
                  public ::testing::WithParamInterface<BadRunId> {};

// Refused with a message naming the problem; the run is not created and the
// tables are intact (only the healthy run is listed).
TEST_P(BadRunIds, AreRefusedNamingTheProblem) {
  ExpectRefused(SendOnNewStream({Start(GetParam().run_id)}),
                grpc::StatusCode::INVALID_ARGUMENT, GetParam().error);
  v1::ListRunsResponse runs = Runs();
  ASSERT_EQ(runs.runs_size(), 1);
  EXPECT_EQ(runs.runs(0).run_id(), "healthy");
}

INSTANTIATE_TEST_SUITE_P(RunIds, BadRunIds, ::testing::ValuesIn(kBadRunIds),
                         [](const auto& info) {
                           return std::string(info.param.name);
                         });

TEST_F(BadInput, RankNotBelowWorldSizeIsRefused) {
  ExpectRefused(SendOnNewStream({Start("r", 4, 4)}),
                grpc::StatusCode::INVALID_ARGUMENT,
                "rank 4 is not below world_size 4 (run r)");
}

TEST_F(BadInput, WorldSizeZeroIsReadAsOne) {
  EXPECT_TRUE(SendOnNewStream({Start("w0", 0, 0), Batch(1, {0})}).ok());
  EXPECT_EQ(StoredSteps("w0").size(), 1u);
  ExpectRefused(SendOnNewStream({Start("w0", 1, 0)}),
                grpc::StatusCode::INVALID_ARGUMENT,
                "rank 1 is not below world_size 1 (world_size 0 is read as 1)");
}

class BadMaxNorm : public BadInput,
                   public ::testing::WithParamInterface<double> {};

TEST_P(BadMaxNorm, IsRefusedNamingTheValue) {
  v1::ReportRequest start = Start("mn");
  start.mutable_start()->set_max_norm(GetParam());
  ExpectRefused(SendOnNewStream({start}), grpc::StatusCode::INVALID_ARGUMENT,
                "max_norm must be finite and >= 0, got ");
}

INSTANTIATE_TEST_SUITE_P(Values, BadMaxNorm,
                         ::testing::Values(-1.0, kNaN, kInf, -kInf),
                         [](const auto& info) {
                           double v = info.param;
                           return std::string(std::isnan(v) ? "NaN"
                                              : std::isinf(v)
                                                  ? (v > 0 ? "Inf" : "MinusInf")
                                                  : "Negative");
                         });

TEST_F(BadInput, AdamSettingsOutOfRangeAreRefused) {
  v1::ReportRequest start = Start("adam");
  start.mutable_start()->set_adam_eps(-1e-8);
  ExpectRefused(SendOnNewStream({start}), grpc::StatusCode::INVALID_ARGUMENT,
                "adam_eps must be finite and >= 0, got -1e-08");
  start.mutable_start()->clear_adam_eps();
  start.mutable_start()->set_adam_beta2(1.0);
  ExpectRefused(SendOnNewStream({start}), grpc::StatusCode::INVALID_ARGUMENT,
                "adam_beta2 must be in [0, 1), got 1");
}

TEST_F(BadInput, UnknownPrecisionValueIsRefused) {
  v1::ReportRequest start = Start("prec");
  start.mutable_start()->set_precision(static_cast<v1::Precision>(7));
  ExpectRefused(
      SendOnNewStream({start}), grpc::StatusCode::INVALID_ARGUMENT,
      "precision 7 is not a known value; use FP32, BF16 or FP16 (run prec)");
}

// ---- Labels ----------------------------------------------------------------

TEST_F(BadInput, TooManyLabelsAreRefused) {
  v1::ReportRequest start = Start("labels");
  for (int i = 0; i < 33; ++i) {
    (*start.mutable_start()->mutable_labels())["k" + std::to_string(i)] = "v";
  }
  ExpectRefused(SendOnNewStream({start}), grpc::StatusCode::INVALID_ARGUMENT,
                "RunStart has 33 labels; at most 32");
}

TEST_F(BadInput, LabelNameTooLongOrNotAPrometheusNameIsRefused) {
  v1::ReportRequest start = Start("labels");
  (*start.mutable_start()->mutable_labels())[std::string(65, 'k')] = "v";
  ExpectRefused(
      SendOnNewStream({start}), grpc::StatusCode::INVALID_ARGUMENT,
      "must match [A-Za-z_][A-Za-z0-9_]* and have at most 64 characters");
  start.mutable_start()->mutable_labels()->clear();
  (*start.mutable_start()->mutable_labels())["team-name"] = "v";
  ExpectRefused(SendOnNewStream({start}), grpc::StatusCode::INVALID_ARGUMENT,
                "label name \"team-name\" must match");
}

TEST_F(BadInput, LabelValueTooLongIsRefused) {
  v1::ReportRequest start = Start("labels");
  (*start.mutable_start()->mutable_labels())["owner"] = std::string(257, 'v');
  ExpectRefused(SendOnNewStream({start}), grpc::StatusCode::INVALID_ARGUMENT,
                "label \"owner\" has a value of 257 characters; at most 256");
}

// Quotes, backslashes and newlines are data: stored and returned verbatim.
// RunStart labels are not Prometheus labels (only `run` is, and its charset
// needs no escaping), so /metrics stays valid; it is checked with promtool.
TEST_F(BadInput, LabelValuesWithQuotesBackslashesAndNewlinesAreKeptVerbatim) {
  const std::string tricky = "say \"hi\"\\n back\\slash\nnew line\ttab";
  v1::ReportRequest start = Start("tricky-labels");
  (*start.mutable_start()->mutable_labels())["note"] = tricky;
  EXPECT_TRUE(SendOnNewStream({start, Batch(1, Range(0, 5))}).ok());
  EXPECT_EQ(LabelsOf("tricky-labels")["note"], tricky);
  CommandResult runs = Ctl({"runs", "--json"});
  ASSERT_EQ(runs.exit_code, 0) << runs.err;
  json listed = json::parse(runs.out);
  bool found_json = false;
  for (const json& run : listed) {
    if (run["run_id"] != "tricky-labels") continue;
    found_json = true;
    EXPECT_EQ(run["labels"]["note"].get<std::string>(), tricky);
  }
  EXPECT_TRUE(found_json);
  std::string metrics = Metrics();
  EXPECT_EQ(
      MetricValue(metrics, "trainwatch_steps_total{run=\"tricky-labels\"}"), 5);
  CommandResult lint = RunCommand({"promtool", "check", "metrics"}, metrics);
  EXPECT_EQ(lint.exit_code, 0) << lint.out << lint.err;
}

// SQL in a label value and an event detail is only ever a bound parameter.
TEST_F(BadInput, SqlLookingLabelValueAndEventDetailAreStoredVerbatim) {
  const std::string label = "x'); DROP TABLE runs; --";
  const std::string detail = "'; DELETE FROM step_chunks; --";
  v1::ReportRequest start = Start("sql-text");
  (*start.mutable_start()->mutable_labels())["note"] = label;
  EXPECT_TRUE(SendOnNewStream({start, Batch(1, Range(0, 5)),
                               Event(2, 4, v1::CHECKPOINT_SAVED, detail)})
                  .ok());
  EXPECT_EQ(LabelsOf("sql-text")["note"], label);
  EXPECT_EQ(StoredSteps("sql-text").size(), 5u);
  // The operator's view: the file holds the detail as text.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2(dir_.File("tw.db").c_str(), &db,
                            SQLITE_OPEN_READONLY, nullptr),
            SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(
      sqlite3_prepare_v2(db, "SELECT detail FROM events", -1, &stmt, nullptr),
      SQLITE_OK);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_ROW);
  EXPECT_EQ(reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0)),
            detail);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
}

// ---- Steps: order, duplicates, limits ---------------------------------------

// docs/contracts.md: a duplicate or older step is ignored. Within one batch too:
// the batch is acked and the older record is not stored.
TEST_F(BadInput, StepGoingBackwardsWithinABatchIsIgnored) {
  EXPECT_TRUE(SendOnNewStream({Start("back"), Batch(1, {10, 11, 5, 12})}).ok());
  EXPECT_EQ(StoredStepNumbers("back"), (std::vector<uint64_t>{10, 11, 12}));
}

TEST_F(BadInput, StepsGoingBackwardsAcrossBatchesAreIgnored) {
  EXPECT_TRUE(SendOnNewStream({Start("back"), Batch(1, Range(0, 10)),
                               Batch(2, Range(5, 10))})
                  .ok());
  EXPECT_EQ(StoredStepNumbers("back"), Range(0, 15));
  EXPECT_EQ(MetricValue(Metrics(), "trainwatch_steps_total{run=\"back\"}"), 15);
}

TEST_F(BadInput, DuplicateStepsAreStoredAndCountedOnce) {
  EXPECT_TRUE(SendOnNewStream({Start("dup"), Batch(1, {0, 1, 1, 2}),
                               Batch(2, Range(0, 3)), Batch(2, Range(0, 3))})
                  .ok());
  // A resend on a new stream (after a reconnect) is deduplicated as well.
  EXPECT_TRUE(SendOnNewStream({Start("dup"), Batch(1, Range(0, 4))}).ok());
  EXPECT_EQ(StoredStepNumbers("dup"), Range(0, 4));
  EXPECT_EQ(MetricValue(Metrics(), "trainwatch_steps_total{run=\"dup\"}"), 4);
}

// A client's -1 read as unsigned, in a batch of good steps: refused alone,
// naming the step; the steps around it in its batch are stored and acked,
// and so is everything the stream sends after it.
TEST_F(BadInput, AStepOf2To64Minus1IsRefusedAloneAndItsNeighboursStored) {
  v1::ReportRequest bad = Batch(2, {10, 11, 12});
  bad.mutable_batch()->mutable_records(1)->set_step(std::numeric_limits<uint64_t>::max());
  EXPECT_THAT(RefusedAlone(bad, "minus-one", {10, 12}),
              HasSubstr("run minus-one rank 0: step 18446744073709551615 is not below 2^63"));
  EXPECT_EQ(MetricValue(Metrics(), "trainwatch_steps_total{run=\"minus-one\"}"), 13);
}

TEST_F(BadInput, BatchOverTheRecordLimitIsRefusedAndTheLimitAccepted) {
  RawStream s(server_->grpc_address());
  s.Send(Start("big"));
  s.Send(Batch(1, Range(0, 16384)));
  EXPECT_TRUE(s.WaitAck(1));
  s.Send(Batch(2, Range(16384, 16385)));
  ExpectRefused(s.Finish(), grpc::StatusCode::INVALID_ARGUMENT,
                "run big rank 0: batch seq 2 has 16385 records; at most 16384");
  EXPECT_EQ(StoredSteps("big").size(), 16384u);
}

// gRPC refuses a message over the server's receive limit (16 MiB) before
// trainwatch sees it, with RESOURCE_EXHAUSTED; it is not counted as a
// refusal of ours.
TEST_F(BadInput, MessageOverTheSizeLimitIsRefusedByGrpc) {
  v1::ReportRequest big = Batch(2, Range(10, 40));
  for (v1::StepRecord& r : *big.mutable_batch()->mutable_records()) {
    for (int i = 0; i < 65536; ++i)
      r.add_batch_ids(std::numeric_limits<int64_t>::max() - i);
  }
  ASSERT_GT(big.ByteSizeLong(), 16u << 20);
  grpc::Status status = SendAfterGood(big);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("larger than max"));
  std::printf("gRPC's refusal: %s\n", status.error_message().c_str());
}

// RunStart.host becomes a label (alerts, trainwatch_host_incidents_total):
// a 15 MiB host name is refused, /metrics stays as small as it was.
TEST_F(BadInput, AHostNameOverItsLimitIsRefused) {
  const size_t metrics_before = Metrics().size();
  v1::ReportRequest start = Start("long-host");
  start.mutable_start()->set_host(std::string(15 << 20, 'h'));
  ExpectRefused(SendOnNewStream({start, Batch(1, Range(0, 3))}),
                grpc::StatusCode::INVALID_ARGUMENT,
                "RunStart.host has 15728640 characters; at most 253 (run long-host)");
  EXPECT_LT(Metrics().size(), metrics_before + 4096);
  EXPECT_TRUE(StoredSteps("long-host").empty());
}

// The server's resident memory (VmRSS of /proc/PID/status), in bytes.
uint64_t ResidentBytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  ADD_FAILURE() << "no VmRSS for pid " << pid;
  return 0;
}

// A ReportRequest whose batch is `batch_bytes` verbatim (an unknown field 2
// of an empty message is serialized as is, and field 2 is `batch` on the
// server's side): the test never materialises the millions of records it
// sends.
v1::ReportRequest RawBatch(std::string batch_bytes) {
  v1::ReportRequest r;
  r.GetReflection()->MutableUnknownFields(&r)->AddLengthDelimited(
      v1::ReportRequest::kBatchFieldNumber, std::move(batch_bytes));
  return r;
}

// A StepRecord's bytes whose field `field` is `bytes` verbatim (and its
// step, when given).
std::string RecordWithRawField(int field, std::string bytes,
                               std::optional<uint64_t> step = std::nullopt) {
  v1::StepRecord r;
  if (step.has_value()) r.set_step(*step);
  r.GetReflection()->MutableUnknownFields(&r)->AddLengthDelimited(field, std::move(bytes));
  return r.SerializeAsString();
}

// The server's memory after a hostile message: under 256 MB (its shipped
// pod has 4 GiB; one such message once took 3.5 GB).
void ExpectResidentStaysBounded(pid_t pid, uint64_t before, const char* what) {
  const uint64_t after = ResidentBytes(pid);
  std::printf("server RSS: %.1f MB before, %.1f MB after %s\n", before / 1e6, after / 1e6,
              what);
  EXPECT_LT(after, 256u << 20);
}

void AppendVarint(uint64_t v, std::string& out) {
  for (; v >= 0x80; v >>= 7) out += static_cast<char>((v & 0x7f) | 0x80);
  out += static_cast<char>(v);
}

std::string Repeat(const std::string& bytes, size_t n) {
  std::string out;
  out.reserve(bytes.size() * n);
  for (size_t i = 0; i < n; ++i) out += bytes;
  return out;
}

// One message may not cost what its bytes do not: 8M empty StepRecords are
// 16 MB on the wire and gigabytes once parsed. The record count is judged
// on the wire, before the parse: refused with the usual message, the
// server's memory stays bounded and it keeps serving (TearDown).
TEST_F(BadInput, EightMillionEmptyRecordsAreRefusedBeforeTheyAreParsed) {
  const uint64_t before = ResidentBytes(server_->pid());
  // Field 1 (seq) = 2, then 8M empty records (field 2, length 0).
  v1::ReportRequest bad = RawBatch("\x08\x02" + Repeat(std::string("\x12\x00", 2), 8'000'000));
  ASSERT_LT(bad.ByteSizeLong(), 16u << 20);
  ExpectRefused(SendAfterGood(bad), grpc::StatusCode::INVALID_ARGUMENT,
                "run bad-run rank 0: batch seq 2 has 8000000 records; at most 16384");
  ExpectResidentStaysBounded(server_->pid(), before, "the 8M-record message");
}

// The same bound for what hides inside one record: 8M empty MoE layers (and
// the same in layer_stats entries, within every per-record limit but
// spread over records) are refused as a whole before the parse.
TEST_F(BadInput, MillionsOfEmptyEntriesInOneMessageAreRefusedBeforeTheyAreParsed) {
  const uint64_t before = ResidentBytes(server_->pid());
  // A record: step 1 (field 1), moe (field 18) of 7.9M empty layers.
  const std::string layers = Repeat(std::string("\x0a\x00", 2), 7'900'000);
  const std::string moe = RecordWithRawField(v1::StepRecord::kMoeFieldNumber, layers, 1);
  v1::StepBatch head;
  head.set_seq(2);
  std::string batch = head.SerializeAsString();
  batch += '\x12';  // records
  AppendVarint(moe.size(), batch);
  batch += moe;
  ExpectRefused(SendAfterGood(RawBatch(batch)), grpc::StatusCode::INVALID_ARGUMENT,
                "refused before parsing: send smaller batches");
  // 1024 records of 4000 empty layer_stats each: every record within its
  // limit (4096), 4M entries in the message.
  const std::string record_bytes =
      Repeat(RecordWithRawField(v1::StepRecord::kLayerStatsFieldNumber, ""), 4000);
  std::string many = head.SerializeAsString();
  for (int i = 0; i < 1024; ++i) {
    many += '\x12';
    AppendVarint(record_bytes.size() + 2, many);
    many += std::string("\x08", 1) + static_cast<char>(i % 100 + 1) + record_bytes;
  }
  ExpectRefused(SendAfterGood(RawBatch(many), "bad-run-2"),
                grpc::StatusCode::INVALID_ARGUMENT,
                "refused before parsing: send smaller batches");
  ExpectResidentStaysBounded(server_->pid(), before, "the 8M-entry messages");
}

TEST_F(BadInput, TooManyLayerStatsAreRefusedAlone) {
  v1::ReportRequest bad = Batch(2, {10, 11});
  auto* layers = bad.mutable_batch()->mutable_records(1)->mutable_layer_stats();
  for (int i = 0; i < 4097; ++i)
    (*layers)["layer." + std::to_string(i)].set_grad_norm(1);
  EXPECT_THAT(RefusedAlone(bad, "bad-layers", {10}),
              HasSubstr("run bad-layers rank 0: step 11: layer_stats has 4097 layers; at most 4096"));
}

TEST_F(BadInput, LayerNameTooLongIsRefusedAlone) {
  v1::ReportRequest bad = Batch(2, {10, 11});
  (*bad.mutable_batch()->mutable_records(0)->mutable_layer_stats())[std::string(
      300, 'L')];
  const std::string reason = RefusedAlone(bad, "bad-name", {11});
  EXPECT_THAT(reason, HasSubstr("step 10: layer name \"LLLL"));
  EXPECT_THAT(reason, HasSubstr("has 300 characters; at most 256"));
}

TEST_F(BadInput, BatchIdsOverTheLimitAreRefusedAlone) {
  v1::ReportRequest bad = Batch(2, {10, 11});
  for (int i = 0; i < 65537; ++i)
    bad.mutable_batch()->mutable_records(0)->add_batch_ids(i);
  EXPECT_THAT(RefusedAlone(bad, "bad-ids", {11}),
              HasSubstr("step 10: batch_ids has 65537 entries; at most 65536"));
}

TEST_F(BadInput, FiniteClipCoefOutsideZeroOneIsRefusedAlone) {
  v1::ReportRequest bad = Batch(2, {10, 11});
  bad.mutable_batch()->mutable_records(1)->set_clip_coef(7.0);
  EXPECT_THAT(RefusedAlone(bad, "bad-coef", {10}),
              HasSubstr("step 11: clip_coef must be in [0, 1], got 7"));
}

TEST_F(BadInput, NegativeTimestampIsRefusedAlone) {
  v1::ReportRequest bad = Batch(2, {10, 11});
  bad.mutable_batch()->mutable_records(0)->set_time_unix_nanos(-5);
  EXPECT_THAT(RefusedAlone(bad, "bad-time", {11}),
              HasSubstr("step 10: time_unix_nanos is negative (-5)"));
}

TEST_F(BadInput, AnMoeCountVectorOfTheWrongLengthIsRefusedAlone) {
  RawStream s(server_->grpc_address());
  v1::ReportRequest start = Start("bad-moe");
  start.mutable_start()->mutable_moe()->set_num_experts(4);
  start.mutable_start()->mutable_moe()->set_top_k(2);
  s.Send(start);
  v1::ReportRequest batch = Batch(1, {0, 1});
  for (int i = 0; i < 2; ++i) {
    v1::MoeLayerStats* l = batch.mutable_batch()->mutable_records(i)->mutable_moe()->add_layers();
    l->set_layer("3");
    for (int e = 0; e < (i == 0 ? 4 : 3); ++e) l->add_tokens_per_expert(100);
  }
  s.Send(batch);
  ASSERT_TRUE(s.WaitAck(1));
  EXPECT_EQ(s.rejected(), 1u);
  EXPECT_THAT(s.reason(), HasSubstr("step 1: moe.layers[0].tokens_per_expert has 3 entries; "
                                    "the run's RunStart.moe.num_experts is 4"));
  EXPECT_TRUE(s.Finish().ok());
  EXPECT_EQ(StoredStepNumbers("bad-moe"), std::vector<uint64_t>{0});
  ++refused_records_;
}

// ---- Events ----------------------------------------------------------------

TEST_F(BadInput, EventWithAnUnknownKindIsRefused) {
  ExpectRefused(SendAfterGood(Event(2, 9, static_cast<v1::EventKind>(9))),
                grpc::StatusCode::INVALID_ARGUMENT,
                "run bad-run rank 0: event at step 9 has no valid kind (9)");
}

TEST_F(BadInput, EventWithAnOverlongDetailIsRefused) {
  ExpectRefused(
      SendAfterGood(Event(2, 9, v1::CHECKPOINT_SAVED, std::string(4097, 'd'))),
      grpc::StatusCode::INVALID_ARGUMENT,
      "event at step 9: detail has 4097 characters; at most 4096");
}

// ---- Active runs -----------------------------------------------------------

class BadInputFewRuns : public BadInput {
 protected:
  std::vector<std::string> ExtraArgs() const override {
    return {"--max-active-runs", "2"};
  }
};

TEST_F(BadInputFewRuns, MoreActiveRunsThanTheLimitAreRefusedUntilOneFinishes) {
  // "healthy" is one active run; "second" makes two.
  EXPECT_TRUE(SendOnNewStream({Start("second"), Batch(1, {0})}).ok());
  ExpectRefused(SendOnNewStream({Start("third")}),
                grpc::StatusCode::RESOURCE_EXHAUSTED,
                "this server already monitors 2 active runs, its --max-active-runs limit");
  // A known active run may open more streams (another rank, a reconnect).
  EXPECT_TRUE(SendOnNewStream({Start("second"), Batch(1, {1})}).ok());
  // Once a run finishes, its place is free.
  EXPECT_TRUE(
      SendOnNewStream({Start("second"), Event(1, 1, v1::RUN_FINISHED)}).ok());
  EXPECT_TRUE(Eventually(
      [&] { return MetricValue(Metrics(), "trainwatch_runs_active") == 1; }));
  EXPECT_TRUE(SendOnNewStream({Start("third"), Batch(1, {0})}).ok());
  EXPECT_EQ(StoredSteps("third").size(), 1u);
  EXPECT_EQ(StoredSteps("second").size(), 2u);
}

// ---- Connections: idle, stopped and silent peers ----------------------------

// Idle is allowed: a trainer may pause (evaluation, a long checkpoint) and
// RunSilent is the alert for that. A live peer answers keepalive pings, so
// its stream stays open however long it is quiet.
TEST_F(BadInput, IdleLiveStreamIsKeptOpen) {
  RawStream s(server_->grpc_address());
  s.Send(Start("idle"));
  s.Send(Batch(1, Range(0, 5)));
  ASSERT_TRUE(s.WaitAck(1));
  ASSERT_TRUE(Eventually([&] { return StreamsActive() == 2; })) << StreamsActive();
  // Quiet for several keepalive periods (1 s each): pings flow and are
  // answered.
  std::this_thread::sleep_for(std::chrono::seconds(5));
  EXPECT_EQ(StreamsActive(), 2);
  s.Send(Batch(2, Range(5, 5)));
  EXPECT_TRUE(s.WaitAck(2));
  EXPECT_TRUE(s.Finish().ok());
  EXPECT_EQ(StoredSteps("idle").size(), 10u);
}

// A child process with a pipe on its stdin.
class Child {
 public:
  explicit Child(const std::vector<std::string>& argv) {
    int fds[2];
    EXPECT_EQ(pipe(fds), 0);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[0], 0);
      close(fds[1]);
      int null = open("/dev/null", O_WRONLY);
      dup2(null, 1);
      std::vector<char*> cargs;
      for (const auto& a : argv) cargs.push_back(const_cast<char*>(a.c_str()));
      cargs.push_back(nullptr);
      execv(cargs[0], cargs.data());
      _exit(127);
    }
    close(fds[0]);
    stdin_ = fds[1];
  }
  ~Child() {
    if (stdin_ >= 0) close(stdin_);
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      kill(pid_, SIGCONT);
      waitpid(pid_, nullptr, 0);
    }
  }
  void Write(const std::string& text) {
    ASSERT_EQ(write(stdin_, text.data(), text.size()),
              static_cast<ssize_t>(text.size()));
  }
  // Closes stdin and returns the exit status.
  int Wait() {
    close(stdin_);
    stdin_ = -1;
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
};

std::string StepLines(uint64_t first, uint64_t n) {
  std::string out;
  for (uint64_t i = first; i < first + n; ++i) {
    out += json{{"step", i}, {"grad_norm", 0.5}}.dump() + "\n";
  }
  return out;
}

// A trainer that stops answering (SIGSTOP: the kernel still holds its TCP
// connection, the process never answers a ping) after a quiet spell longer
// than several keepalive periods: keepalive drops the connection and its
// stream ends. Once it continues, it reconnects and resends; nothing is lost.
TEST_F(BadInput, StoppedTrainerIsDroppedByKeepaliveAndResendsLater) {
  Child trainer({BinDir() + "/trainwatchctl", "--server",
                 server_->grpc_address(), "replay", "-"});
  trainer.Write(R"({"run_start": {"run_id": "stopped", "precision": "BF16"}})"
                "\n");
  trainer.Write(StepLines(0, 100));
  ASSERT_TRUE(Eventually([&] { return StoredSteps("stopped").size() == 100; }));
  ASSERT_TRUE(Eventually([&] { return StreamsActive() == 2; })) << StreamsActive();
  std::this_thread::sleep_for(
      std::chrono::seconds(4));  // idle, answering pings
  ASSERT_EQ(StreamsActive(), 2);
  kill(trainer.pid(), SIGSTOP);
  EXPECT_TRUE(Eventually([&] { return StreamsActive() == 1; }))
      << "the stopped trainer's stream is still open: " << StreamsActive();
  kill(trainer.pid(), SIGCONT);
  trainer.Write(StepLines(100, 100));
  EXPECT_EQ(trainer.Wait(), 0);
  EXPECT_EQ(StoredStepNumbers("stopped"), Range(0, 200));
}

// Raw TCP: the HTTP/2 preface, SETTINGS and the HEADERS of a Report call,
// then silence (no SETTINGS ack, no PING ack). The server drops the
// connection, and the stream it opened ends.
TEST_F(BadInput, SilentHttp2ConnectionIsDropped) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server_->grpc_port()));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  std::string out = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  out += std::string("\0\0\0\x04\0\0\0\0\0", 9);  // empty SETTINGS
  // HPACK literal fields without indexing, new names, no Huffman.
  std::string block;
  for (auto [name, value] : std::vector<std::pair<std::string, std::string>>{
           {":method", "POST"},
           {":scheme", "http"},
           {":path", "/trainwatch.v1.TrainingHealth/Report"},
           {":authority", "127.0.0.1"},
           {"content-type", "application/grpc"},
           {"te", "trailers"}}) {
    block += '\0';
    block += static_cast<char>(name.size());
    block += name;
    block += static_cast<char>(value.size());
    block += value;
  }
  // HEADERS, END_HEADERS, stream 1.
  out += std::string{0, 0, static_cast<char>(block.size()), 1, 4, 0, 0, 0, 1};
  out += block;
  ASSERT_EQ(write(fd, out.data(), out.size()),
            static_cast<ssize_t>(out.size()));
  EXPECT_TRUE(Eventually([&] { return StreamsActive() == 2; })) << StreamsActive();
  // Read (never answer) until the server closes the connection.
  bool closed = Eventually([&] {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) return false;
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof(buf));
    return n <= 0;
  });
  close(fd);
  EXPECT_TRUE(closed) << "the server kept a silent connection open";
  EXPECT_TRUE(Eventually([&] { return StreamsActive() == 1; })) << StreamsActive();
}

// ---- NaN and Inf in every float --------------------------------------------

struct FloatField {
  const char* name;
  void (*set)(v1::StepRecord*, double);
  // Where `steps --json` shows it.
  const char* json_pointer;
  // The gauge that shows the last value, or "".
  const char* gauge;
  // The alerts that must fire when the value is `v` (on a step that was not
  // skipped), and none other.
  std::set<std::string> (*alerts)(double v);
};

void PrintTo(const FloatField& f, std::ostream* os) { *os << f.name; }

std::set<std::string> NoAlerts(double) { return {}; }
std::set<std::string> NonFiniteUpdate(double) { return {"NonFiniteUpdate"}; }

v1::LayerStats* Layer(v1::StepRecord* r) {
  return &(*r->mutable_layer_stats())["l0"];
}

const FloatField kFloatFields[] = {
    {"grad_norm", [](v1::StepRecord* r, double v) { r->set_grad_norm(v); },
     "/grad_norm", "trainwatch_grad_norm", NonFiniteUpdate},
    {"clip_coef", [](v1::StepRecord* r, double v) { r->set_clip_coef(v); },
     "/clip_coef", "trainwatch_clip_coefficient", NoAlerts},
    {"loss_scale", [](v1::StepRecord* r, double v) { r->set_loss_scale(v); },
     "/loss_scale", "trainwatch_loss_scale",
     [](double v) -> std::set<std::string> {
       if (v < 0) return {"LossScaleCollapse"};  // a scale below 1
       return {};
     }},
    {"max_attn_logit",
     [](v1::StepRecord* r, double v) { r->set_max_attn_logit(v); },
     "/max_attn_logit", "trainwatch_max_attention_logit",
     [](double v) -> std::set<std::string> {
       if (v > 0) return {"AttentionLogitGrowth"};  // at or above the cap
       return {};
     }},
    {"log_z", [](v1::StepRecord* r, double v) { r->set_log_z(v); }, "/log_z",
     "trainwatch_log_z", NoAlerts},
    {"loss", [](v1::StepRecord* r, double v) { r->set_loss(v); }, "/loss",
     "trainwatch_loss", NonFiniteUpdate},
    {"lr", [](v1::StepRecord* r, double v) { r->set_lr(v); }, "/lr",
     "trainwatch_learning_rate", NoAlerts},
    {"shard_sq_sum",
     [](v1::StepRecord* r, double v) { r->set_shard_sq_sum(v); },
     "/shard_sq_sum", "", NoAlerts},
    {"layer_grad_norm",
     [](v1::StepRecord* r, double v) { Layer(r)->set_grad_norm(v); },
     "/layer_stats/l0/grad_norm", "", NoAlerts},
    {"layer_grad_rms",
     [](v1::StepRecord* r, double v) { Layer(r)->set_grad_rms(v); },
     "/layer_stats/l0/grad_rms", "", NoAlerts},
    {"layer_g_over_sqrt_v_rms",
     [](v1::StepRecord* r, double v) { Layer(r)->set_g_over_sqrt_v_rms(v); },
     "/layer_stats/l0/g_over_sqrt_v_rms", "",
     [](double v) -> std::set<std::string> {
       if (v > 0) return {"AdamStaleSecondMoment"};  // >= the threshold
       return {};
     }},
};

// Finite values for every float, so that only the field under test differs.
v1::StepRecord Ordinary(uint64_t step) {
  v1::StepRecord r;
  r.set_step(step);
  r.set_grad_norm(0.5);
  r.set_clipped(false);
  r.set_clip_coef(1.0);
  r.set_loss_scale(65536);
  r.set_max_attn_logit(5);
  r.set_log_z(1.0);
  r.set_loss(2.0);
  r.set_lr(1e-3);
  r.set_shard_sq_sum(0.25);
  *Layer(&r) = [] {
    v1::LayerStats l;
    l.set_grad_norm(0.5);
    l.set_grad_rms(0.01);
    l.set_g_over_sqrt_v_rms(1.0);
    return l;
  }();
  return r;
}

class NonFinite
    : public BadInput,
      public ::testing::WithParamInterface<std::tuple<FloatField, double>> {};

// Stored as data, read back as "NaN" / "Infinity" / "-Infinity", shown by
// the field's gauge, /metrics still valid, and the detectors that read the
// field react (NonFiniteUpdate for grad_norm and loss).
TEST_P(NonFinite, IsAcceptedStoredAndDetected) {
  const auto& [field, value] = GetParam();
  v1::ReportRequest start = Start("nf");
  start.mutable_start()->set_precision(v1::FP16);
  start.mutable_start()->set_adam_eps(1e-8);
  v1::ReportRequest good, bad;
  good.mutable_batch()->set_seq(1);
  for (uint64_t i = 0; i < 20; ++i)
    *good.mutable_batch()->add_records() = Ordinary(i);
  bad.mutable_batch()->set_seq(2);
  v1::StepRecord* r = bad.mutable_batch()->add_records();
  *r = Ordinary(20);
  field.set(r, value);
  EXPECT_TRUE(SendOnNewStream({start, good, bad}).ok());

  CommandResult steps = Ctl({"steps", "--run", "nf", "--from", "20", "--json"});
  ASSERT_EQ(steps.exit_code, 0) << steps.err;
  json got = json::parse(steps.out);
  ASSERT_EQ(got.size(), 1u) << steps.out;
  const std::string text = std::isnan(value) ? "NaN"
                           : value > 0       ? "Infinity"
                                             : "-Infinity";
  EXPECT_EQ(got[0].at(json::json_pointer(field.json_pointer)), text)
      << steps.out;
  EXPECT_EQ(StoredSteps("nf").size(), 21u);

  std::string metrics = Metrics();
  const std::string sel = "{run=\"nf\"}";
  if (*field.gauge != '\0') {
    double shown = MetricValue(metrics, field.gauge + sel);
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(shown)) << field.gauge << " " << shown;
    } else {
      EXPECT_EQ(shown, value) << field.gauge;
    }
  }
  const std::set<std::string> expected = field.alerts(value);
  EXPECT_EQ(MetricValue(metrics, "trainwatch_nonfinite_steps_total" + sel),
            expected.count("NonFiniteUpdate") ? 1 : 0);
  EXPECT_EQ(AlertNames("nf"), expected);
  CommandResult lint = RunCommand({"promtool", "check", "metrics"}, metrics);
  EXPECT_EQ(lint.exit_code, 0) << lint.out << lint.err;
}

INSTANTIATE_TEST_SUITE_P(EveryFloat, NonFinite,
                         ::testing::Combine(::testing::ValuesIn(kFloatFields),
                                            ::testing::Values(kNaN, kInf,
                                                              -kInf)),
                         [](const auto& info) {
                           double v = std::get<1>(info.param);
                           return std::string(std::get<0>(info.param).name) +
                                  "_" +
                                  (std::isnan(v) ? "NaN"
                                   : v > 0       ? "Inf"
                                                 : "MinusInf");
                         });

// ---- JSONL step logs (trainwatchctl replay) ---------------------------------

struct BadLine {
  const char* name;
  const char* line;
  const char* error;  // expected in stderr after "FILE:3: "
};

const BadLine kBadLines[] = {
    {"BadJson", R"({"step": 2, "grad_norm": oops})", "invalid JSON"},
    {"WrongType", R"({"step": 2, "grad_norm": true})", "invalid step line"},
    {"UnknownField", R"({"step": 2, "gradnorm": 0.3})", "gradnorm"},
    {"BareNaNToken", R"({"step": 2, "grad_norm": NaN})", "invalid JSON"},
    {"MissingStep", R"({"grad_norm": 0.3})", "no \"step\""},
    {"NotAnObject", R"([2, 0.3])", "a line must be one JSON object"},
    {"EventWithoutKind", R"({"event": {"step": 2}})", "event has no \"kind\""},
};

void PrintTo(const BadLine& b, std::ostream* os) { *os << b.line; }

class BadJsonl : public BadInput,
                 public ::testing::WithParamInterface<BadLine> {};

// Exit 1, "FILE:LINE: what" on stderr, lines before it sent, none after.
TEST_P(BadJsonl, IsReportedWithItsLineAndNothingAfterIsSent) {
  const std::string path = dir_.File("log.jsonl");
  std::ofstream(path)
      << R"({"run_start": {"run_id": "jsonl", "precision": "BF16"}})"
         "\n"
      << R"({"step": 1, "grad_norm": 0.3})"
         "\n"
      << GetParam().line << "\n"
      << R"({"step": 3, "grad_norm": 0.3})"
         "\n";
  CommandResult r = Ctl({"replay", path});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr(path + ":3: "));
  EXPECT_THAT(r.err, HasSubstr(GetParam().error));
  EXPECT_EQ(StoredStepNumbers("jsonl"), (std::vector<uint64_t>{1}));
}

INSTANTIATE_TEST_SUITE_P(Lines, BadJsonl, ::testing::ValuesIn(kBadLines),
                         [](const auto& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace trainwatch::testing
