// The closed loop end to end (docs/closed-loop.md) with the real server and
// trainwatchctl: a replayed run that applies a NaN step after a checkpoint
// gets a PROPOSED rollback in propose mode; `approve` (write scope for the
// run: another team's token cannot) approves it, once; a trainer's client
// stream receives it and acks it APPLIED; a server restart keeps the record.
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eventually.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "harness.h"
#include "trainwatch/client.h"

namespace trainwatch::testing {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr char kTeamA[] = "write-team-a-0123456789";
constexpr char kTeamB[] = "write-team-b-0123456789";
constexpr char kRun[] = "team-a/diverge";

class ClosedLoopIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(dir_.File("tokens")) << kTeamA << " read,write:team-a/\n"
                                       << kTeamB << " read,write:team-b/\n";
    chmod(dir_.File("tokens").c_str(), 0600);
    std::ofstream(dir_.File("a.token")) << kTeamA << "\n";
    std::ofstream(dir_.File("b.token")) << kTeamB << "\n";
    Start();
  }

  void Start() {
    server_.reset();
    server_ = std::make_unique<ServerProcess>(
        dir_.File("tw.db"), 0,
        std::vector<std::string>{"--auth-token-file", dir_.File("tokens"), "--closed-loop",
                                 "propose"});
  }

  CommandResult Ctl(const std::string& token, std::vector<std::string> args) {
    std::vector<std::string> argv = {BinDir() + "/trainwatchctl", "--server",
                                     server_->grpc_address(), "--token-file", dir_.File(token)};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv);
  }

  json Directives() {
    CommandResult r = Ctl("a.token", {"directives", "--run", kRun, "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? json::parse(r.out) : json::array();
  }

  // 300 steps, a checkpoint at step 100, and step 250 applied with a NaN
  // gradient norm: NonFiniteUpdate, critical, with a restart plan.
  std::string WriteLog() {
    const std::string path = dir_.File("run.jsonl");
    std::ofstream out(path);
    out << json{{"run_start", {{"run_id", kRun}, {"world_size", 1}, {"max_norm", 1.0}}}}.dump()
        << "\n";
    for (int i = 0; i < 300; ++i) {
      json step = {{"step", i}, {"grad_norm", 0.5}, {"loss", 2.0},
                   {"batch_ids", {2 * i, 2 * i + 1}}};
      if (i == 250) step["grad_norm"] = "NaN";
      out << step.dump() << "\n";
      if (i == 100) {
        out << json{{"event", {{"step", 100}, {"kind", "CHECKPOINT_SAVED"},
                               {"detail", "ckpt-100"}}}}.dump()
            << "\n";
      }
    }
    return path;
  }

  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
};

TEST_F(ClosedLoopIntegrationTest, ProposedApprovedDeliveredAppliedAndKept) {
  CommandResult replay = Ctl("a.token", {"replay", WriteLog()});
  ASSERT_EQ(replay.exit_code, 0) << replay.err;

  json list;
  ASSERT_TRUE(Eventually([&] {
    list = Directives();
    return list.size() == 1;
  })) << list.dump();
  const json& d = list[0];
  EXPECT_EQ(d["state"], "PROPOSED");
  EXPECT_EQ(d["action"], "rollback");
  EXPECT_EQ(d["alert"], "NonFiniteUpdate@250");
  EXPECT_EQ(d["rollback"]["to_step"], 100);
  EXPECT_EQ(d["rollback"]["checkpoint"], "ckpt-100");
  EXPECT_EQ(d["rollback"]["skip_batch_ids"], json::array({500, 501}));
  const std::string id = d["id"];
  EXPECT_EQ(id, std::string(kRun) + "#1");
  // The alert names the directive and the command that approves it.
  CommandResult alerts = Ctl("a.token", {"alerts", "--run", kRun, "--json"});
  EXPECT_THAT(alerts.out, HasSubstr("trainwatchctl approve " + id));

  // Another team's token may not decide team-a's directives.
  CommandResult denied = Ctl("b.token", {"approve", id});
  EXPECT_NE(denied.exit_code, 0);
  EXPECT_THAT(denied.err, HasSubstr("PERMISSION_DENIED"));
  EXPECT_EQ(Directives()[0]["state"], "PROPOSED");

  CommandResult approved = Ctl("a.token", {"approve", id, "--note", "checked the plan"});
  ASSERT_EQ(approved.exit_code, 0) << approved.err;
  const size_t transitions = Directives()[0]["transitions"].size();
  CommandResult again = Ctl("a.token", {"approve", id});
  ASSERT_EQ(again.exit_code, 0) << again.err;  // a duplicate approval is a no-op
  json after = Directives()[0];
  EXPECT_EQ(after["state"], "APPROVED");
  EXPECT_EQ(after["transitions"].size(), transitions);
  EXPECT_THAT(after["approved_by"].get<std::string>(), HasSubstr("(token line 1)"));

  // A trainer's stream receives it and applies it.
  ClientOptions options;
  options.address = server_->grpc_address();
  options.security.auth_token = kTeamA;
  options.run_id = kRun;
  options.world_size = 1;
  options.flush_interval = std::chrono::milliseconds(5);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  uint64_t step = 300;
  std::vector<Directive> due;
  ASSERT_TRUE(Eventually([&] {
    (*client)->Record({.step = step, .grad_norm = 0.5});
    due = (*client)->DueDirectives(step);
    ++step;
    return !due.empty();
  })) << "no directive reached the client";
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].id, id);
  EXPECT_EQ(due[0].action, Directive::Action::kRollback);
  EXPECT_EQ(due[0].rollback_to_step, 100u);
  EXPECT_TRUE((*client)->AckDirective(id, DirectiveState::kApplied));
  EXPECT_FALSE((*client)->AckDirective(id, DirectiveState::kApplied));  // once
  ASSERT_TRUE((*client)->Flush(std::chrono::seconds(30)).ok());
  ASSERT_TRUE(Eventually([&] { return Directives()[0]["state"] == "APPLIED"; }))
      << Directives().dump();
  EXPECT_TRUE((*client)->DueDirectives(step + 100).empty());
  const std::string metrics = HttpGet(server_->metrics_url());
  EXPECT_EQ(MetricValue(metrics,
                        "trainwatch_directives_total{action=\"rollback\",state=\"APPLIED\"}"),
            1);
  ASSERT_TRUE((*client)->Close().ok());

  // The record survives a restart.
  ASSERT_EQ(server_->Terminate(), 0);
  Start();
  json kept = Directives();
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept[0]["state"], "APPLIED");
  EXPECT_EQ(kept[0]["applied_ranks"], json::array({0}));
  EXPECT_GE(kept[0]["transitions"].size(), 5u);  // PROPOSED .. APPLIED
}

}  // namespace
}  // namespace trainwatch::testing
