// Security end to end (docs/security.md): the real trainwatch-server with
// TLS, mutual TLS and bearer tokens, driven by trainwatchctl and the C++
// client, with certificates made by the openssl CLI at test time: a CA, a
// server certificate for IP:127.0.0.1 and DNS:localhost, a client certificate
// from the same CA, and a second, unrelated CA with a client certificate.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "eventually.h"
#include "harness.h"
#include "server.h"
#include "trainwatch/client.h"

namespace trainwatch::testing {
namespace {

using ::trainwatch::ServerOptions;

using ::testing::HasSubstr;
using ::testing::Not;
using json = nlohmann::json;

// Tokens of the test's token file (16+ characters, as the format requires).
constexpr char kWriteA[] = "write-team-a-0123456789";
constexpr char kRead[] = "read-only-0123456789abc";
constexpr char kAdmin[] = "admin-0123456789abcdefg";

std::string CtlPath() { return BinDir() + "/trainwatchctl"; }

void Shell(const std::string& cmd) {
  ASSERT_EQ(std::system((cmd + " 2>/dev/null").c_str()), 0) << cmd;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The certificates and token file, made once for the whole suite.
class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pki_ = new TempDir();
    const std::string d = pki_->path();
    const std::string ec =
        "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    for (const char* ca : {"ca", "other-ca"}) {
      Shell("cd " + d + " && openssl req -x509 " + ec + " -keyout " + ca +
          ".key -out " + ca + ".pem -days 2 -subj /CN=" + ca);
    }
    std::ofstream(d + "/server.ext")
        << "subjectAltName=IP:127.0.0.1,DNS:localhost\n";
    // name, signing CA, extensions
    for (auto [name, ca, ext] :
         {std::tuple{"server", "ca", " -extfile server.ext"},
          std::tuple{"client", "ca", ""},
          std::tuple{"stranger", "other-ca", ""}}) {
      Shell(std::string("cd ") + d + " && openssl req " + ec + " -keyout " +
          name + ".key -out " + name + ".csr -subj /CN=" + name +
          " && openssl x509 -req -in " + name + ".csr -CA " + ca +
          ".pem -CAkey " + ca + ".key -CAcreateserial -days 2 -out " + name +
          ".pem" + ext);
    }
    std::ofstream(d + "/tokens")
        << "# trainwatch test tokens\n"
        << kWriteA << " write:team-a/\n"
        << kRead << " read   # dashboards\n"
        << kAdmin << " read,write:*\n";
    chmod((d + "/tokens").c_str(), 0600);
    for (auto [file, token] : {std::pair{"write-a.token", kWriteA},
                               std::pair{"read.token", kRead},
                               std::pair{"admin.token", kAdmin},
                               std::pair{"wrong.token",
                                         "wrong-0123456789abcdefg"}}) {
      std::ofstream(d + "/" + file) << token << "\n";
    }
  }
  static void TearDownTestSuite() {
    delete pki_;
    pki_ = nullptr;
  }

  static std::string Pki(const std::string& name) { return pki_->File(name); }

  std::vector<std::string> TlsServerArgs() {
    return {"--tls-cert", Pki("server.pem"), "--tls-key", Pki("server.key")};
  }

  // A step log of `steps` steps for `run`.
  std::string WriteLog(const std::string& run, int steps) {
    std::string path = dir_.File(run.substr(run.rfind('/') + 1) + ".jsonl");
    std::ofstream out(path);
    out << json{{"run_start", {{"run_id", run}, {"max_norm", 1.0}}}}.dump()
        << "\n";
    for (int i = 0; i < steps; ++i) {
      out << json{{"step", i}, {"grad_norm", 0.5 + 0.01 * i}}.dump() << "\n";
    }
    return path;
  }

  // trainwatchctl against `server` with `flags` before the command.
  CommandResult Ctl(const ServerProcess& server,
                    std::vector<std::string> flags,
                    std::vector<std::string> command) {
    std::vector<std::string> argv = {CtlPath(), "--server",
                                     server.grpc_address(), "--timeout", "10"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), command.begin(), command.end());
    return RunCommand(argv);
  }

  // Steps stored for `run`, read back through the server with `flags`.
  size_t StoredSteps(const ServerProcess& server,
                     std::vector<std::string> flags, const std::string& run) {
    CommandResult r = Ctl(server, flags, {"steps", "--run", run, "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    if (r.exit_code != 0) return 0;
    return json::parse(r.out).size();
  }

  static TempDir* pki_;
  TempDir dir_;
};

TempDir* SecurityTest::pki_ = nullptr;

TEST_F(SecurityTest, TlsReplayIsStored) {
  ServerProcess server(dir_.File("db"), 0, TlsServerArgs());
  const std::vector<std::string> tls = {"--tls-ca", Pki("ca.pem")};
  CommandResult r = Ctl(server, tls, {"replay", WriteLog("tls-run", 25)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("25 acked"));
  EXPECT_EQ(StoredSteps(server, tls, "tls-run"), 25u);
  EXPECT_THAT(ReadFile(server.log_path()), HasSubstr("TLS on;"));
}

TEST_F(SecurityTest, PlaintextClientAtTlsServerFailsClearly) {
  ServerProcess server(dir_.File("db"), 0, TlsServerArgs());
  CommandResult r = Ctl(server, {}, {"runs"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("runs: UNAVAILABLE"));
  EXPECT_THAT(r.err, HasSubstr("does it serve TLS"));
  // A trainer's replay is not acknowledged, and says so within its timeout.
  r = RunCommand({CtlPath(), "--server", server.grpc_address(),
                  "--timeout", "2", "replay", WriteLog("plain", 3)});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("0 of 3 steps acknowledged"));
  // The server still serves TLS clients.
  EXPECT_EQ(Ctl(server, {"--tls-ca", Pki("ca.pem")}, {"runs"}).exit_code, 0);
}

TEST_F(SecurityTest, ServerCertificateFromAnotherCaIsRefused) {
  ServerProcess server(dir_.File("db"), 0, TlsServerArgs());
  CommandResult r = Ctl(server, {"--tls-ca", Pki("other-ca.pem")}, {"runs"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("UNAVAILABLE"));
  EXPECT_EQ(Ctl(server, {"--tls-ca", Pki("ca.pem")}, {"runs"}).exit_code, 0);
}

TEST_F(SecurityTest, MutualTlsNeedsAClientCertificateFromTheClientCa) {
  std::vector<std::string> args = TlsServerArgs();
  args.insert(args.end(), {"--tls-client-ca", Pki("ca.pem")});
  ServerProcess server(dir_.File("db"), 0, args);
  EXPECT_THAT(ReadFile(server.log_path()),
              HasSubstr("TLS on, client certificates required"));

  CommandResult r = Ctl(server, {"--tls-ca", Pki("ca.pem")}, {"runs"});
  EXPECT_EQ(r.exit_code, 1) << "no client certificate";
  EXPECT_THAT(r.err, HasSubstr("UNAVAILABLE"));

  r = Ctl(server,
          {"--tls-ca", Pki("ca.pem"), "--tls-cert", Pki("stranger.pem"),
           "--tls-key", Pki("stranger.key")},
          {"runs"});
  EXPECT_EQ(r.exit_code, 1) << "client certificate from another CA";
  EXPECT_THAT(r.err, HasSubstr("UNAVAILABLE"));

  const std::vector<std::string> good = {
      "--tls-ca", Pki("ca.pem"), "--tls-cert", Pki("client.pem"), "--tls-key",
      Pki("client.key")};
  r = Ctl(server, good, {"replay", WriteLog("mtls-run", 7)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(StoredSteps(server, good, "mtls-run"), 7u);
}

TEST_F(SecurityTest, TokensAreCheckedAndScoped) {
  ServerProcess server(dir_.File("db"), 0,
                       {"--auth-token-file", Pki("tokens")});
  const std::string log = ReadFile(server.log_path());
  EXPECT_THAT(log, HasSubstr("bearer tokens required"));
  EXPECT_THAT(log, Not(HasSubstr("chmod 600")));  // the file is 0600
  EXPECT_THAT(log, Not(HasSubstr(kWriteA)));
  const std::vector<std::string> writer = {"--token-file", Pki("write-a.token")};
  const std::vector<std::string> reader = {"--token-file", Pki("read.token")};
  const std::vector<std::string> wrong = {"--token-file", Pki("wrong.token")};
  auto still_serving = [&] {
    CommandResult r = Ctl(server, reader, {"runs"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
  };

  // A write token writes runs under its prefix.
  CommandResult r = Ctl(server, writer, {"replay", WriteLog("team-a/good", 12)});
  ASSERT_EQ(r.exit_code, 0) << r.err;

  // Missing and wrong tokens: UNAUTHENTICATED, for writes and for queries.
  for (const auto& flags : {std::vector<std::string>{}, wrong}) {
    r = Ctl(server, flags, {"replay", WriteLog("team-a/refused", 5)});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_THAT(r.err, HasSubstr("UNAUTHENTICATED"));
    EXPECT_THAT(r.err, HasSubstr("0 of 5 steps acknowledged"));
    still_serving();
    r = Ctl(server, flags, {"runs"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_THAT(r.err, HasSubstr("runs: UNAUTHENTICATED"));
    EXPECT_THAT(r.err, Not(HasSubstr("wrong-0123456789abcdefg")));
    still_serving();
  }

  // A write token outside its prefix: PERMISSION_DENIED naming the run.
  r = Ctl(server, writer, {"replay", WriteLog("team-b/theirs", 5)});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("PERMISSION_DENIED: run team-b/theirs: this "
                               "token (line 2 of the token file) may write "
                               "only runs under \"team-a/\""));
  still_serving();

  // A read token lists and queries, but may not report.
  EXPECT_EQ(StoredSteps(server, reader, "team-a/good"), 12u);
  for (const char* cmd : {"health", "alerts"}) {
    r = Ctl(server, reader, {cmd, "--run", "team-a/good"});
    EXPECT_EQ(r.exit_code, 0) << cmd << ": " << r.err;
  }
  r = Ctl(server, reader, {"replay", WriteLog("team-a/by-reader", 5)});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("PERMISSION_DENIED"));
  EXPECT_THAT(r.err, HasSubstr("no write scope"));

  // A write-only token may not query.
  for (const std::vector<std::string>& cmd :
       std::vector<std::vector<std::string>>{
           {"runs"},
           {"steps", "--run", "team-a/good"},
           {"health", "--run", "team-a/good"},
           {"alerts"}}) {
    r = Ctl(server, writer, cmd);
    EXPECT_EQ(r.exit_code, 1) << cmd[0];
    EXPECT_THAT(r.err, HasSubstr("PERMISSION_DENIED"));
    EXPECT_THAT(r.err, HasSubstr("lacks the read scope"));
  }

  // Nothing refused was stored; everything accepted was.
  r = Ctl(server, reader, {"runs", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> runs;
  for (const json& run : json::parse(r.out)) runs.push_back(run["run_id"]);
  EXPECT_THAT(runs, ::testing::ElementsAre("team-a/good"));

  // Refused streams are counted by reason.
  const std::string metrics = HttpGet(server.metrics_url());
  EXPECT_GE(MetricValue(metrics,
                        R"(trainwatch_ingest_rejected_total{reason="unauthenticated"})"),
            2);
  EXPECT_GE(MetricValue(metrics,
                        R"(trainwatch_ingest_rejected_total{reason="permission_denied"})"),
            2);

  // The token also comes from $TRAINWATCH_TOKEN.
  setenv("TRAINWATCH_TOKEN", kAdmin, 1);
  r = Ctl(server, {}, {"replay", WriteLog("anywhere/admin", 3)});
  unsetenv("TRAINWATCH_TOKEN");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// Teams sharing a server: a read:team-a/ token lists only team-a's runs and
// alerts, is refused another team's steps and health (naming its prefix),
// and may not take a backup (a copy of every tenant's data); the full read
// scope sees everything.
TEST_F(SecurityTest, AReadPrefixTokenReadsOnlyItsTeamsRuns) {
  std::ofstream(dir_.File("team-tokens"))
      << kAdmin << " read,write:*\n"
      << kRead << " read:team-a/\n";
  chmod(dir_.File("team-tokens").c_str(), 0600);
  ServerProcess server(dir_.File("db"), 0, {"--auth-token-file", dir_.File("team-tokens")});
  const std::vector<std::string> admin = {"--token-file", Pki("admin.token")};
  const std::vector<std::string> team_a = {"--token-file", Pki("read.token")};
  for (const char* run : {"team-a/one", "team-a/two", "team-b/secret"}) {
    CommandResult w = Ctl(server, admin, {"replay", WriteLog(run, 20)});
    ASSERT_EQ(w.exit_code, 0) << w.err;
  }
  const auto listed = [&](const std::vector<std::string>& flags) {
    CommandResult r = Ctl(server, flags, {"runs", "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::vector<std::string> runs;
    for (const json& run : json::parse(r.out)) runs.push_back(run["run_id"]);
    return runs;
  };
  EXPECT_THAT(listed(team_a), ::testing::UnorderedElementsAre("team-a/one", "team-a/two"));
  EXPECT_THAT(listed(admin), ::testing::UnorderedElementsAre("team-a/one", "team-a/two",
                                                            "team-b/secret"));
  EXPECT_EQ(StoredSteps(server, team_a, "team-a/one"), 20u);
  for (const std::vector<std::string>& cmd : std::vector<std::vector<std::string>>{
           {"steps", "--run", "team-b/secret"},
           {"health", "--run", "team-b/secret"},
           {"alerts", "--run", "team-b/secret"}}) {
    CommandResult r = Ctl(server, team_a, cmd);
    EXPECT_EQ(r.exit_code, 1) << cmd[0];
    EXPECT_THAT(r.err, HasSubstr("PERMISSION_DENIED: run team-b/secret: this token (line 2 "
                                 "of the token file) may read only runs under \"team-a/\""))
        << cmd[0];
  }
  CommandResult alerts = Ctl(server, team_a, {"alerts", "--json"});
  EXPECT_EQ(alerts.exit_code, 0) << alerts.err;
  EXPECT_THAT(alerts.out, Not(HasSubstr("team-b")));
  CommandResult backup = Ctl(server, team_a, {"backup", "--out", dir_.File("copy.db")});
  EXPECT_EQ(backup.exit_code, 1);
  EXPECT_THAT(backup.err, HasSubstr("a backup copies the whole database"));
  EXPECT_FALSE(std::filesystem::exists(dir_.File("copy.db")));
  backup = Ctl(server, admin, {"backup", "--out", dir_.File("copy.db")});
  EXPECT_EQ(backup.exit_code, 0) << backup.err;
}

// a write:team-a/ token opened runs that sent only a RunStart and
// held the server's places for ever. A runs:N token opens N active runs,
// the next is RESOURCE_EXHAUSTED naming the quota, other tenants are not
// affected, and runs idle for --run-idle-timeout leave the active set.
TEST_F(SecurityTest, ARunsQuotaBoundsATokensActiveRunsUntilTheyGoIdle) {
  std::ofstream(dir_.File("quota-tokens"))
      << kWriteA << " write:team-a/,runs:5\n"
      << kAdmin << " read,write:*\n";
  chmod(dir_.File("quota-tokens").c_str(), 0600);
  ServerProcess server(dir_.File("db"), 0,
                       {"--auth-token-file", dir_.File("quota-tokens"),
                        "--run-idle-timeout", "8"});
  const std::vector<std::string> team_a = {"--token-file", Pki("write-a.token")};
  // A one-shot command over the quota gives up at once (it does not wait
  // for its --timeout), the server's reason in its last line.
  const std::vector<std::string> team_a_briefly = {
      "--token-file", Pki("write-a.token"), "--timeout", "120"};
  const std::vector<std::string> admin = {"--token-file", Pki("admin.token")};
  for (int i = 1; i <= 5; ++i) {
    CommandResult r = Ctl(server, team_a,
                          {"replay", WriteLog("team-a/r" + std::to_string(i), 2)});
    ASSERT_EQ(r.exit_code, 0) << i << ": " << r.err;
  }
  const auto refused_at = std::chrono::steady_clock::now();
  CommandResult r = Ctl(server, team_a_briefly, {"replay", WriteLog("team-a/r6", 2)});
  EXPECT_LT(std::chrono::steady_clock::now() - refused_at, std::chrono::seconds(15));
  EXPECT_NE(r.exit_code, 0);
  std::string last_line = r.err.substr(0, r.err.find_last_not_of('\n') + 1);
  last_line = last_line.substr(last_line.find_last_of('\n') + 1);
  EXPECT_THAT(last_line, HasSubstr("RESOURCE_EXHAUSTED"));
  EXPECT_THAT(last_line, HasSubstr("its runs:5 quota"));
  // A run already active may still report; another tenant still opens runs.
  EXPECT_EQ(Ctl(server, team_a, {"replay", WriteLog("team-a/r1", 3)}).exit_code, 0);
  r = Ctl(server, admin, {"replay", WriteLog("team-b/x", 2)});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // Idle for 8 s, team A's runs leave the active set: r6 gets in.
  EXPECT_TRUE(Eventually(
      [&] {
        return Ctl(server, team_a_briefly, {"replay", WriteLog("team-a/r6", 2)})
                   .exit_code == 0;
      },
      std::chrono::seconds(40), std::chrono::milliseconds(500)))
      << "team A's idle runs still count against its quota";
  EXPECT_EQ(StoredSteps(server, admin, "team-a/r6"), 2u);
}

TEST_F(SecurityTest, TokensOverTls) {
  std::vector<std::string> args = TlsServerArgs();
  args.insert(args.end(), {"--auth-token-file", Pki("tokens")});
  ServerProcess server(dir_.File("db"), 0, args);
  const std::vector<std::string> admin = {"--tls-ca", Pki("ca.pem"),
                                          "--token-file", Pki("admin.token")};
  CommandResult r = Ctl(server, admin, {"replay", WriteLog("x/both", 4)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(StoredSteps(server, admin, "x/both"), 4u);
  r = Ctl(server, {"--tls-ca", Pki("ca.pem")}, {"runs"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("UNAUTHENTICATED"));
}

// Redirects this process's stderr to a file while alive.
class CaptureStderr {
 public:
  explicit CaptureStderr(const std::string& path) {
    fflush(stderr);
    saved_ = dup(2);
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    close(fd);
  }
  ~CaptureStderr() {
    fflush(stderr);
    dup2(saved_, 2);
    close(saved_);
  }

 private:
  int saved_;
};

// The C++ client under a refusal: Record() keeps returning at once and drops
// (counted) once the buffer is full, the refusal is logged once however often
// the client retries, Refusal() says why, and Flush() returns the refusal
// rather than waiting for its timeout.
TEST_F(SecurityTest, ClientSurfacesARefusalWithoutBlocking) {
  ServerProcess server(dir_.File("db"), 0,
                       {"--auth-token-file", Pki("tokens")});
  ClientOptions options;
  options.address = server.grpc_address();
  options.run_id = "team-b/refused";
  options.security.auth_token = kWriteA;
  options.capacity = 64;
  options.initial_backoff = std::chrono::milliseconds(10);
  options.max_backoff = std::chrono::milliseconds(100);
  const std::string log = dir_.File("client.stderr");
  absl::Status refusal;
  ClientStats stats;
  {
    CaptureStderr capture(log);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
    ASSERT_TRUE(client.ok()) << client.status();
    for (uint64_t i = 0; i < 1000; ++i) {
      (*client)->Record({.step = i, .grad_norm = 0.5});
    }
    // Until refused, then a few more retries.
    EXPECT_TRUE(Eventually([&] { return !(*client)->Refusal().ok(); }))
        << "the client was never refused";
    const uint64_t reconnects = (*client)->Stats().reconnects;
    EXPECT_TRUE(Eventually(
        [&] { return (*client)->Stats().reconnects >= reconnects + 3; }))
        << "the client stopped retrying: " << (*client)->Stats().reconnects;
    refusal = (*client)->Refusal();
    absl::Status flushed = (*client)->Flush(std::chrono::seconds(60));
    EXPECT_EQ(flushed.code(), absl::StatusCode::kPermissionDenied) << flushed;
    EXPECT_THAT(std::string(flushed.message()),
                HasSubstr("the server refuses the stream"));
    stats = (*client)->Stats();
    EXPECT_EQ((*client)->Close(std::chrono::seconds(60)).code(),
              absl::StatusCode::kPermissionDenied);
  }
  EXPECT_EQ(refusal.code(), absl::StatusCode::kPermissionDenied) << refusal;
  EXPECT_THAT(std::string(refusal.message()), HasSubstr("run team-b/refused"));
  EXPECT_EQ(stats.acked, 0u);
  EXPECT_EQ(stats.recorded + stats.dropped, 1000u);
  EXPECT_GE(stats.dropped, 1000u - 64u);
  EXPECT_GE(stats.reconnects, 3u);
  const std::string text = ReadFile(log);
  size_t lines = 0;
  for (size_t at = 0; (at = text.find("server refused the stream", at)) !=
                      std::string::npos;
       ++at) {
    ++lines;
  }
  EXPECT_EQ(lines, 1u) << text;
  EXPECT_THAT(text, HasSubstr("PERMISSION_DENIED"));
}

TEST_F(SecurityTest, StartupErrorsNameTheFile) {
  const std::string server = BinDir() + "/trainwatch-server";
  const std::vector<std::string> base = {server, "--listen", "127.0.0.1:0",
                                         "--metrics-listen", "127.0.0.1:0",
                                         "--db", dir_.File("db")};
  std::ofstream(dir_.File("bad-tokens")) << "# no scope\nabcdefghijklmnopq\n";
  struct Case {
    std::vector<std::string> args;
    int exit_code;
    std::string error;
  };
  for (const Case& c : std::vector<Case>{
           {{"--tls-cert", Pki("server.pem")}, 2,
            "--tls-cert and --tls-key go together"},
           {{"--tls-key", Pki("server.key")}, 2,
            "--tls-cert and --tls-key go together"},
           {{"--tls-client-ca", Pki("ca.pem")}, 2,
            "--tls-client-ca needs --tls-cert and --tls-key"},
           {{"--tls-cert", dir_.File("none.pem"), "--tls-key", Pki("server.key")},
            1, "--tls-cert " + dir_.File("none.pem") + ": cannot read"},
           {{"--tls-cert", Pki("server.pem"), "--tls-key", Pki("client.key")},
            1, "--tls-key " + Pki("client.key") + " is not the key of the "
               "certificate in --tls-cert " + Pki("server.pem")},
           {{"--tls-cert", Pki("server.pem"), "--tls-key", Pki("server.key"),
             "--tls-client-ca", Pki("tokens")},
            1, "--tls-client-ca " + Pki("tokens") + ": no PEM certificate"},
           {{"--auth-token-file", dir_.File("none")}, 1,
            "--auth-token-file " + dir_.File("none") + ": cannot read"},
           {{"--auth-token-file", dir_.File("bad-tokens")}, 1,
            "--auth-token-file " + dir_.File("bad-tokens") +
                ":2: want TOKEN SCOPE"},
       }) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    CommandResult r = RunCommand(argv);
    EXPECT_EQ(r.exit_code, c.exit_code) << c.error << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.error));
  }
}

TEST_F(SecurityTest, WarnsAboutATokenFileOthersCanRead) {
  std::ofstream(dir_.File("open-tokens")) << kAdmin << " read\n";
  chmod(dir_.File("open-tokens").c_str(), 0644);
  ServerProcess server(dir_.File("db"), 0,
                       {"--auth-token-file", dir_.File("open-tokens")});
  const std::string log = ReadFile(server.log_path());
  EXPECT_THAT(log, HasSubstr("warning: --auth-token-file " +
                             dir_.File("open-tokens") +
                             " is accessible to group or others (mode 0644)"));
  EXPECT_THAT(log, Not(HasSubstr(kAdmin)));
}

// The defaults bind loopback only: those main() starts from, and those its
// --help documents. (Starting the server on its real default ports is not
// possible here: they are fixed, and other tests and servers may hold them.)
TEST_F(SecurityTest, DefaultListenAddressesAreLoopback) {
  const ServerOptions defaults;
  EXPECT_EQ(defaults.grpc.listen, "127.0.0.1:50051");
  EXPECT_EQ(defaults.metrics.listen, "127.0.0.1:9464");
  EXPECT_EQ(defaults.grpc.auth_token_file, "");
  EXPECT_EQ(defaults.grpc.tls.cert_file, "");
  CommandResult r = RunCommand({BinDir() + "/trainwatch-server", "--help"});
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("--listen ADDR            gRPC address (default "
                               "127.0.0.1:50051"));
  EXPECT_THAT(r.out, HasSubstr("--metrics-listen ADDR    Prometheus /metrics "
                               "address (default 127.0.0.1:9464)"));
}

}  // namespace
}  // namespace trainwatch::testing
