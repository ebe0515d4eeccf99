// trainwatchctl and the C++ client across a fleet (docs/fleet.md): every call
// about a run carries x-trainwatch-run (what a fleet's proxy routes by), and
// `--server A,B,C` fans `runs` and `alerts` out to every server and sends a
// run-scoped command to the server that holds the run. Against in-process
// fake servers that record what they were asked and with which metadata.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "cli/cli.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "trainwatch/channel.h"
#include "trainwatch/client.h"
#include "trainwatch/v1/trainwatch.grpc.pb.h"

namespace trainwatch::cli {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// One call as the fake saw it: the method and its x-trainwatch-run value
// ("-" when absent).
struct Call {
  std::string method;
  std::string run_header;
  bool operator==(const Call&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Call& c) {
  return os << c.method << "[" << c.run_header << "]";
}

// A server that holds the runs it is given (each with one alert), acks every
// Report batch, and records each call. Thread-safe.
class FakeServer final : public v1::TrainingHealth::Service {
 public:
  explicit FakeServer(std::vector<std::pair<std::string, uint64_t>> runs)
      : runs_(std::move(runs)) {}

  grpc::Status Report(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::ReportResponse, v1::ReportRequest>* stream)
      override {
    Record("Report", context);
    v1::ReportRequest request;
    while (stream->Read(&request)) {
      const uint64_t seq = request.has_batch()   ? request.batch().seq()
                           : request.has_event() ? request.event().seq()
                                                 : 0;
      if (request.has_batch()) {
        absl::MutexLock lock(&mu_);
        steps_ += request.batch().records_size();
      }
      if (seq == 0) continue;
      v1::ReportResponse response;
      response.set_acked_seq(seq);
      stream->Write(response);
    }
    return grpc::Status::OK;
  }

  grpc::Status ListRuns(grpc::ServerContext* context,
                        const v1::ListRunsRequest*,
                        v1::ListRunsResponse* response) override {
    Record("ListRuns", context);
    for (const auto& [run, last_step] : runs_) {
      v1::RunSummary* summary = response->add_runs();
      summary->set_run_id(run);
      summary->set_last_step(last_step);
    }
    return grpc::Status::OK;
  }

  grpc::Status ListAlerts(grpc::ServerContext* context,
                          const v1::ListAlertsRequest* request,
                          v1::ListAlertsResponse* response) override {
    Record("ListAlerts", context);
    for (const auto& [run, last_step] : runs_) {
      if (!request->run_id().empty() && request->run_id() != run) continue;
      v1::Alert* alert = response->add_alerts();
      alert->set_alertname("GradNormSpike");
      alert->set_run(run);
      alert->set_state(v1::ALERT_STATE_FIRING);
      alert->set_started_step(last_step);
    }
    return grpc::Status::OK;
  }

  grpc::Status GetRunHealth(grpc::ServerContext* context,
                            const v1::GetRunHealthRequest* request,
                            v1::GetRunHealthResponse* response) override {
    Record("GetRunHealth", context);
    for (const auto& [run, last_step] : runs_) {
      if (run != request->run_id()) continue;
      response->mutable_run()->set_run_id(run);
      response->mutable_run()->set_last_step(last_step);
      return grpc::Status::OK;
    }
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        "no run \"" + request->run_id() + "\"");
  }

  grpc::Status QuerySteps(grpc::ServerContext* context,
                          const v1::QueryStepsRequest* request,
                          grpc::ServerWriter<v1::StepRecords>* writer) override {
    Record("QuerySteps", context);
    v1::StepRecords chunk;
    chunk.add_items()->mutable_record()->set_step(7);
    writer->Write(chunk);
    return grpc::Status::OK;
  }

  std::vector<Call> calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  uint64_t steps() {
    absl::MutexLock lock(&mu_);
    return steps_;
  }

 private:
  void Record(const std::string& method, grpc::ServerContext* context) {
    const auto& metadata = context->client_metadata();
    auto it = metadata.find(kRunHeader);
    std::string run = it == metadata.end()
                          ? "-"
                          : std::string(it->second.data(), it->second.size());
    absl::MutexLock lock(&mu_);
    calls_.push_back({method, run});
  }

  const std::vector<std::pair<std::string, uint64_t>> runs_;
  absl::Mutex mu_;
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
  uint64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
};

struct Result {
  int code;
  std::string out;
  std::string err;
};

Result Ctl(std::vector<std::string> args) {
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  int code = RunCli(std::move(args));
  std::string out = ::testing::internal::GetCapturedStdout();
  return {code, out, ::testing::internal::GetCapturedStderr()};
}

// A loopback address nothing listens on: a port bound and released.
std::string DeadAddress() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
}

// Three fake servers: a holds run-a, b holds run-b1 and run-b2, c holds
// run-moved's old history (last step 100) and b its newer part (step 900).
class FleetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fakes_.push_back(std::make_unique<FakeServer>(
        std::vector<std::pair<std::string, uint64_t>>{{"run-a", 10}}));
    fakes_.push_back(std::make_unique<FakeServer>(
        std::vector<std::pair<std::string, uint64_t>>{
            {"run-b1", 20}, {"run-b2", 30}, {"run-moved", 900}}));
    fakes_.push_back(std::make_unique<FakeServer>(
        std::vector<std::pair<std::string, uint64_t>>{{"run-moved", 100}}));
    for (auto& fake : fakes_) {
      int port = 0;
      grpc::ServerBuilder builder;
      builder.AddListeningPort("127.0.0.1:0",
                               grpc::InsecureServerCredentials(), &port);
      builder.RegisterService(fake.get());
      servers_.push_back(builder.BuildAndStart());
      addresses_.push_back(absl::StrCat("127.0.0.1:", port));
    }
  }
  void TearDown() override {
    for (auto& server : servers_) server->Shutdown();
  }

  std::string All() const { return absl::StrJoin(addresses_, ","); }

  std::vector<std::unique_ptr<FakeServer>> fakes_;
  std::vector<std::unique_ptr<grpc::Server>> servers_;
  std::vector<std::string> addresses_;
};

TEST_F(FleetTest, ClientSendsRunHeaderOnReport) {
  ClientOptions options;
  options.address = addresses_[0];
  options.run_id = "run-a";
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  for (uint64_t step = 1; step <= 5; ++step) {
    (*client)->Record({.step = step, .grad_norm = 0.5});
  }
  ASSERT_TRUE((*client)->Close(std::chrono::seconds(10)).ok());
  EXPECT_THAT(fakes_[0]->calls(), ElementsAre(Call{"Report", "run-a"}));
  EXPECT_EQ(fakes_[0]->steps(), 5u);
}

TEST_F(FleetTest, RunScopedQueriesSendRunHeader) {
  for (std::vector<std::string> args :
       {std::vector<std::string>{"health", "--run", "run-a"},
        {"spikes", "--run", "run-a"},
        {"steps", "--run", "run-a"},
        {"alerts", "--run", "run-a"}}) {
    args.insert(args.begin(), {"--server", addresses_[0]});
    Result r = Ctl(args);
    EXPECT_EQ(r.code, 0) << args[2] << ": " << r.err;
  }
  EXPECT_EQ(Ctl({"--server", addresses_[0], "runs"}).code, 0);
  EXPECT_EQ(Ctl({"--server", addresses_[0], "alerts"}).code, 0);
  // A listing of the whole server is about no run: no header.
  EXPECT_THAT(fakes_[0]->calls(),
              ElementsAre(Call{"GetRunHealth", "run-a"},
                          Call{"GetRunHealth", "run-a"},
                          Call{"QuerySteps", "run-a"},
                          Call{"ListAlerts", "run-a"}, Call{"ListRuns", "-"},
                          Call{"ListAlerts", "-"}));
}

TEST_F(FleetTest, RunsFanOutToEveryServerAndMerge) {
  Result r = Ctl({"--server", All(), "runs"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("SERVER"));
  for (const char* run : {"run-a", "run-b1", "run-b2"}) {
    EXPECT_THAT(r.out, HasSubstr(run));
  }
  // Sorted by run across servers; a moved run shows once per server.
  EXPECT_LT(r.out.find("run-a"), r.out.find("run-b1"));
  EXPECT_LT(r.out.find("run-b2"), r.out.find("run-moved"));
  EXPECT_NE(r.out.find(addresses_[2]), std::string::npos);
  for (auto& fake : fakes_) {
    EXPECT_THAT(fake->calls(), ElementsAre(Call{"ListRuns", "-"}));
  }

  Result json = Ctl({"--server", All(), "runs", "--json"});
  ASSERT_EQ(json.code, 0) << json.err;
  EXPECT_THAT(json.out, HasSubstr(absl::StrCat("\"run_id\":\"run-b2\"")));
  EXPECT_THAT(json.out, HasSubstr(absl::StrCat("\"server\":\"", addresses_[1],
                                               "\"")));
}

TEST_F(FleetTest, UnansweredServerIsNamedAndTheRestStillPrint) {
  const std::string dead = DeadAddress();
  for (const char* command : {"runs", "alerts"}) {
    Result r = Ctl({"--server", All() + "," + dead, "--timeout", "5", command});
    EXPECT_EQ(r.code, 1) << command;
    EXPECT_THAT(r.out, AllOf(HasSubstr("run-a"), HasSubstr("run-b1"),
                             HasSubstr("run-b2")))
        << command;
    EXPECT_THAT(r.err, HasSubstr("server " + dead + ": ")) << command;
    EXPECT_THAT(r.err, HasSubstr("1 of 4 servers did not answer")) << command;
    for (const std::string& live : addresses_) {
      EXPECT_THAT(r.err, Not(HasSubstr("server " + live + ":"))) << command;
    }
  }
}

TEST_F(FleetTest, AlertsFanOutAndMerge) {
  Result r = Ctl({"--server", All(), "alerts", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* run : {"run-a", "run-b1", "run-b2", "run-moved"}) {
    EXPECT_THAT(r.out, HasSubstr(absl::StrCat("\"run\":\"", run, "\"")));
  }
  // run-moved has an alert on both servers that held it.
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("\"server\":\"", addresses_[2])));
}

TEST_F(FleetTest, RunScopedCommandGoesToTheServerThatHoldsTheRun) {
  Result r = Ctl({"--server", All(), "health", "--run", "run-b2"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("run-b2"));
  EXPECT_THAT(fakes_[1]->calls(), ElementsAre(Call{"ListRuns", "-"},
                                              Call{"GetRunHealth", "run-b2"}));
  EXPECT_THAT(fakes_[0]->calls(), ElementsAre(Call{"ListRuns", "-"}));
  EXPECT_THAT(fakes_[2]->calls(), ElementsAre(Call{"ListRuns", "-"}));

  Result steps = Ctl({"--server", All(), "steps", "--run", "run-a"});
  ASSERT_EQ(steps.code, 0) << steps.err;
  EXPECT_EQ(fakes_[0]->calls().back(), (Call{"QuerySteps", "run-a"}));
}

TEST_F(FleetTest, MovedRunUsesTheServerWithItsLatestStep) {
  Result r = Ctl({"--server", All(), "spikes", "--run", "run-moved"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("moved when the fleet changed"));
  EXPECT_THAT(r.err, HasSubstr("using " + addresses_[1]));
  EXPECT_EQ(fakes_[1]->calls().back(), (Call{"GetRunHealth", "run-moved"}));
}

TEST_F(FleetTest, RunOnNoServerIsNotFound) {
  Result r = Ctl({"--server", All(), "health", "--run", "nowhere"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("run nowhere is on none of the servers"));
  EXPECT_THAT(r.err, HasSubstr("proxy"));
}

TEST_F(FleetTest, ReplayResumesOnTheServerThatHoldsTheRun) {
  const std::string path = ::testing::TempDir() + "fleet_replay.jsonl";
  std::ofstream(path) << "{\"step\": 31, \"grad_norm\": 0.5}\n"
                         "{\"step\": 32, \"grad_norm\": 0.6}\n";
  Result r = Ctl({"--server", All(), "replay", path, "--run", "run-b1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(fakes_[1]->steps(), 2u);
  EXPECT_EQ(fakes_[0]->steps(), 0u);
  EXPECT_EQ(fakes_[2]->steps(), 0u);
  EXPECT_EQ(fakes_[1]->calls().back(), (Call{"Report", "run-b1"}));
}

TEST(FleetFlags, EmptyAddressInTheListIsAUsageError) {
  Result r = Ctl({"--server", "127.0.0.1:1,,127.0.0.1:2", "runs"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("an empty address in the list"));
}

}  // namespace
}  // namespace trainwatch::cli
