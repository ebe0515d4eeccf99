// A fleet on loopback with real parts (docs/fleet.md): three
// trainwatch-servers behind the shipped nginx configuration
// (deploy/fleet/render.sh, Debian's nginx), a real Alertmanager, and 12 runs
// x 2 ranks of real C++ clients streaming through the proxy. One server is
// SIGKILLed mid-stream and restarted on its port and database. Checked: every
// run is whole on one server (the one the proxy routes its header to), every
// acknowledged step is stored exactly once, the other servers' runs keep
// being acknowledged during the outage while the killed server's runs are
// not rerouted, `trainwatchctl --server A,B,C runs` lists every run, an alert
// fired on each server reaches Alertmanager, and a stream from an independent
// gRPC client (Python grpcio, metadata set by hand) lands on its run's server.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "eventually.h"
#include "harness.h"
#include "stored_data.h"
#include "trainwatch/channel.h"
#include "trainwatch/client.h"
#include "trainwatch/v1/trainwatch.grpc.pb.h"

namespace trainwatch::testing {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr char kNginx[] = "/usr/sbin/nginx";
constexpr char kAlertmanager[] = "/usr/bin/prometheus-alertmanager";
constexpr int kServers = 3;
constexpr int kRuns = 12;
constexpr uint32_t kRanks = 2;
constexpr uint64_t kSteps = 1500;       // per client, 0..kSteps-1
constexpr uint64_t kKillAtStep = 500;   // the driver's step when one dies
constexpr auto kOutage = std::chrono::milliseconds(1500);

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool Accepts(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok =
      connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

template <typename F>
bool Poll(F ready, std::chrono::seconds timeout = std::chrono::seconds(30)) {
  return Eventually(ready, timeout, std::chrono::milliseconds(20));
}

pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) {
  pid_t pid = fork();
  if (pid == 0) {
    FILE* f = fopen(log.c_str(), "w");
    dup2(fileno(f), 1);
    dup2(fileno(f), 2);
    std::vector<char*> cargs;
    for (const auto& a : argv) cargs.push_back(const_cast<char*>(a.c_str()));
    cargs.push_back(nullptr);
    execv(cargs[0], cargs.data());
    _exit(127);
  }
  return pid;
}

void Stop(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGTERM);
  int status;
  waitpid(pid, &status, 0);
}

// nginx with the configuration deploy/fleet/render.sh writes, as an
// unprivileged-port foreground process whose files stay in `dir`.
class NginxProcess {
 public:
  NginxProcess(const TempDir& dir, const std::vector<std::string>& servers)
      : prefix_(dir.File("nginx")) {
    std::filesystem::create_directories(prefix_);
    port_ = FreePort();
    std::vector<std::string> render = {
        std::string(TW_FLEET_DIR) + "/render.sh", "--standalone", prefix_,
        "--listen", "127.0.0.1:" + std::to_string(port_), "--access-log",
        prefix_ + "/access.log"};
    render.insert(render.end(), servers.begin(), servers.end());
    CommandResult r = RunCommand(render);
    if (r.exit_code != 0) {
      ADD_FAILURE() << "render.sh: " << r.err;
      return;
    }
    std::ofstream(prefix_ + "/nginx.conf") << r.out;
    pid_ = Spawn({kNginx, "-c", prefix_ + "/nginx.conf", "-p", prefix_, "-e",
                  prefix_ + "/error.log", "-g", "daemon off;"},
                 prefix_ + "/stdout.log");
    if (!Poll([&] { return Accepts(port_); })) {
      ADD_FAILURE() << "nginx did not listen; its log:\n"
                    << ReadFile(prefix_ + "/error.log")
                    << ReadFile(prefix_ + "/stdout.log");
    }
  }
  ~NginxProcess() { Stop(pid_); }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  // run header -> every upstream the proxy sent that run's calls to, from
  // the access log (a call is logged when it ends).
  std::map<std::string, std::set<std::string>> Routes() const {
    std::map<std::string, std::set<std::string>> routes;
    std::istringstream in(ReadFile(prefix_ + "/access.log"));
    std::regex re(R"(run=(\S+) upstream=(\S+))");
    std::string line;
    while (std::getline(in, line)) {
      std::smatch m;
      if (std::regex_search(line, m, re)) routes[m[1]].insert(m[2]);
    }
    return routes;
  }

  std::string ErrorLog() const { return ReadFile(prefix_ + "/error.log"); }

 private:
  std::string prefix_;
  int port_ = 0;
  pid_t pid_ = -1;
};

// The real Alertmanager on a free port, routing to a receiver that does
// nothing: the test reads its API.
class AlertmanagerProcess {
 public:
  explicit AlertmanagerProcess(const TempDir& dir) {
    port_ = FreePort();
    std::ofstream(dir.File("am.yml")) << "route:\n"
                                         "  receiver: none\n"
                                         "receivers:\n"
                                         "  - name: none\n";
    std::filesystem::create_directories(dir.File("am-data"));
    pid_ = Spawn({kAlertmanager, "--config.file=" + dir.File("am.yml"),
                  "--storage.path=" + dir.File("am-data"),
                  "--web.listen-address=127.0.0.1:" + std::to_string(port_),
                  "--cluster.listen-address=", "--log.level=warn"},
                 dir.File("am.log"));
    EXPECT_TRUE(Poll([&] {
      return HttpGet(url() + "/-/ready").find("OK") != std::string::npos;
    })) << ReadFile(dir.File("am.log"));
  }
  ~AlertmanagerProcess() { Stop(pid_); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  // Whether Alertmanager holds `alertname` for `run`.
  bool Has(const std::string& run, const std::string& alertname) const {
    json alerts = json::parse(
        HttpGet(url() + "/api/v2/alerts?filter=run%3D%22" + run + "%22"),
        nullptr, false);
    if (!alerts.is_array()) return false;
    for (const json& a : alerts) {
      if (a["labels"].value("alertname", "") == alertname) return true;
    }
    return false;
  }

 private:
  int port_ = 0;
  pid_t pid_ = -1;
};

std::string RunName(int i) {
  char name[32];
  std::snprintf(name, sizeof(name), "fleet-run-%02d", i);
  return name;
}

double NormAt(uint64_t step) { return 0.4 + 0.1 * std::sin(0.05 * step); }

// Where each stream's records are stored: (run, rank) -> {server index ->
// records}.
std::map<RunRank, std::map<int, int64_t>> StoredBy(
    const std::vector<std::string>& dbs) {
  std::map<RunRank, std::map<int, int64_t>> where;
  for (int s = 0; s < static_cast<int>(dbs.size()); ++s) {
    for (const auto& [stream, count] : CountStoredRecords(dbs[s])) {
      where[stream][s] = count;
    }
  }
  return where;
}

TEST(Fleet, RunsStayWholeOnOneServerThroughTheProxyAcrossAServerRestart) {
  ASSERT_TRUE(std::filesystem::exists(kNginx))
      << kNginx << " is missing: install Debian's nginx (deploy/install.sh does)";
  ASSERT_TRUE(std::filesystem::exists(kAlertmanager))
      << kAlertmanager << " is missing: install prometheus-alertmanager";
  TempDir dir;
  AlertmanagerProcess am(dir);

  std::vector<std::string> dbs, addresses;
  std::vector<std::unique_ptr<ServerProcess>> servers;
  const std::vector<std::string> server_args = {"--alertmanager-url", am.url()};
  for (int s = 0; s < kServers; ++s) {
    dbs.push_back(dir.File("server" + std::to_string(s) + ".db"));
    servers.push_back(std::make_unique<ServerProcess>(dbs[s], 0, server_args));
    addresses.push_back(servers[s]->grpc_address());
  }
  NginxProcess nginx(dir, addresses);
  if (::testing::Test::HasFailure()) return;
  const std::string all_servers = addresses[0] + "," + addresses[1] + "," +
                                  addresses[2];

  // Consistent hashing spreads run ids over every server: 300 queries about
  // 300 runs, each routed by its header.
  {
    auto stub = v1::TrainingHealth::NewStub(grpc::CreateChannel(
        nginx.address(), grpc::InsecureChannelCredentials()));
    for (int i = 0; i < 300; ++i) {
      grpc::ClientContext context;
      AddRunHeader("probe-" + std::to_string(i), &context);
      v1::GetRunHealthRequest request;
      request.set_run_id("probe-" + std::to_string(i));
      v1::GetRunHealthResponse response;
      grpc::Status status = stub->GetRunHealth(&context, request, &response);
      ASSERT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND)
          << status.error_message();
    }
    std::map<std::string, int> share;
    ASSERT_TRUE(Poll([&] { return nginx.Routes().size() >= 300; }));
    for (const auto& [run, upstreams] : nginx.Routes()) {
      ASSERT_EQ(upstreams.size(), 1u) << run;
      ++share[*upstreams.begin()];
    }
    std::printf("300 run ids over the servers:");
    for (const std::string& address : addresses) {
      std::printf(" %s %d", address.c_str(), share[address]);
      EXPECT_GE(share[address], 45) << address << " gets too few runs";
    }
    std::printf("\n");
  }

  // 12 runs x 2 ranks of real clients, all through the proxy.
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kRuns; ++i) {
    for (uint32_t rank = 0; rank < kRanks; ++rank) {
      ClientOptions options;
      options.address = nginx.address();
      options.run_id = RunName(i);
      options.rank = rank;
      options.world_size = kRanks;
      options.max_norm = 1.0;
      options.initial_backoff = std::chrono::milliseconds(20);
      options.max_backoff = std::chrono::milliseconds(200);
      absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
      ASSERT_TRUE(client.ok()) << client.status();
      clients.push_back(*std::move(client));
    }
  }
  auto run_of = [](size_t c) { return RunName(static_cast<int>(c / kRanks)); };

  // One thread records every client's steps in lock step, ~1 step per 2 ms.
  std::atomic<uint64_t> driver_step{0};
  std::thread driver([&] {
    for (uint64_t step = 0; step < kSteps; ++step) {
      for (auto& client : clients) {
        EXPECT_TRUE(client->Record({.step = step, .grad_norm = NormAt(step)}));
      }
      driver_step.store(step + 1);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });

  // Which server holds which run, from the databases once every stream has
  // stored something.
  ASSERT_TRUE(Poll([&] {
    return driver_step.load() >= kKillAtStep &&
           StoredBy(dbs).size() == static_cast<size_t>(kRuns * kRanks);
  })) << "not every stream stored records; nginx: " << nginx.ErrorLog();
  std::map<std::string, int> home;  // run -> server index
  std::map<int, int> runs_on;       // server index -> runs
  for (const auto& [stream, by_server] : StoredBy(dbs)) {
    ASSERT_EQ(by_server.size(), 1u) << stream.first << " rank " << stream.second
                                    << " is on several servers";
    const int s = by_server.begin()->first;
    if (home.count(stream.first)) {
      EXPECT_EQ(home[stream.first], s) << stream.first << ": ranks split";
    } else {
      home[stream.first] = s;
      ++runs_on[s];
    }
  }
  std::printf("12 runs over the servers:");
  for (int s = 0; s < kServers; ++s) std::printf(" %d", runs_on[s]);
  std::printf("\n");
  EXPECT_GE(runs_on.size(), 2u) << "every run hashed to one server";

  // SIGKILL the server holding the most runs, mid-stream.
  int victim = 0;
  for (const auto& [s, n] : runs_on) {
    if (n > runs_on[victim]) victim = s;
  }
  const int victim_port = servers[victim]->grpc_port();
  servers[victim]->Kill();
  std::vector<uint64_t> acked_at_kill;
  for (auto& client : clients) acked_at_kill.push_back(client->Stats().acked);
  const uint64_t step_at_kill = driver_step.load();
  std::this_thread::sleep_for(kOutage);
  for (size_t c = 0; c < clients.size(); ++c) {
    const uint64_t acked = clients[c]->Stats().acked;
    if (home[run_of(c)] == victim) {
      // Not rerouted to another server: nothing is acknowledged while its
      // server is down.
      EXPECT_EQ(acked, acked_at_kill[c]) << run_of(c) << " was rerouted";
    } else {
      EXPECT_GT(acked, acked_at_kill[c])
          << run_of(c) << " paused while another server was down";
    }
  }
  EXPECT_LT(step_at_kill, driver_step.load()) << "the driver stalled";
  servers[victim] =
      std::make_unique<ServerProcess>(dbs[victim], victim_port, server_args);
  ASSERT_EQ(servers[victim]->grpc_port(), victim_port);
  driver.join();

  // One NaN step applied on one run per server: NonFiniteUpdate fires there.
  std::map<int, std::string> alert_run;  // server index -> run
  for (const auto& [run, s] : home) alert_run.emplace(s, run);
  for (const auto& [s, run] : alert_run) {
    for (size_t c = 0; c < clients.size(); c += kRanks) {
      if (run_of(c) == run) {
        clients[c]->Record({.step = kSteps, .grad_norm = std::nan("")});
      }
    }
  }
  for (size_t c = 0; c < clients.size(); ++c) {
    ASSERT_TRUE(clients[c]->Flush(std::chrono::seconds(60)).ok())
        << run_of(c) << ": " << clients[c]->Stats().acked << " acked";
  }

  // Every acknowledged step stored exactly once, every run whole on its
  // server, and the proxy's log (a stream is logged when it ends) agrees on
  // where each run went.
  std::vector<ClientStats> stats_at_end;
  for (auto& client : clients) {
    stats_at_end.push_back(client->Stats());
    EXPECT_TRUE(client->Close().ok());
  }
  const auto stored = StoredBy(dbs);
  const auto routes = nginx.Routes();
  for (size_t c = 0; c < clients.size(); ++c) {
    const ClientStats& stats = stats_at_end[c];
    EXPECT_EQ(stats.acked, stats.recorded) << run_of(c);
    EXPECT_EQ(stats.dropped, 0u) << run_of(c);
    const RunRank stream{run_of(c), static_cast<uint32_t>(c % kRanks)};
    const auto it = stored.find(stream);
    ASSERT_NE(it, stored.end()) << stream.first;
    ASSERT_EQ(it->second.size(), 1u) << stream.first << " is on several servers";
    EXPECT_EQ(it->second.begin()->first, home[stream.first]);
    EXPECT_EQ(static_cast<uint64_t>(it->second.begin()->second),
              stats.recorded)
        << stream.first << " rank " << stream.second;
  }
  for (int s = 0; s < kServers; ++s) {
    EXPECT_EQ(CountOverlappingChunks(dbs[s]), 0) << "server " << s;
    for (const auto& [stream, records] : ReadStoredRecords(dbs[s])) {
      std::set<uint64_t> steps;
      for (const v1::StepRecord& r : records) steps.insert(r.step());
      EXPECT_EQ(steps.size(), records.size()) << stream.first << " doubled";
      EXPECT_EQ(*steps.rbegin() + 1, steps.size()) << stream.first << " gaps";
    }
  }
  for (const auto& [run, s] : home) {
    const auto route = routes.find(run);
    ASSERT_NE(route, routes.end()) << run << " is not in the proxy's log";
    EXPECT_EQ(route->second, std::set<std::string>{addresses[s]}) << run;
  }

  // Fan-out listing across the servers lists all 12 runs.
  CommandResult runs = RunCommand(
      {BinDir() + "/trainwatchctl", "--server", all_servers, "runs", "--json"});
  ASSERT_EQ(runs.exit_code, 0) << runs.err;
  std::set<std::string> listed;
  for (const json& run : json::parse(runs.out)) {
    listed.insert(run["run_id"].get<std::string>());
    EXPECT_EQ(run["server"], addresses[home[run["run_id"].get<std::string>()]]);
  }
  EXPECT_EQ(listed.size(), static_cast<size_t>(kRuns));

  // Run-scoped queries through the proxy reach the run's server.
  for (const auto& [run, s] : home) {
    CommandResult health = RunCommand({BinDir() + "/trainwatchctl", "--server",
                                       nginx.address(), "health", "--run", run,
                                       "--json"});
    EXPECT_EQ(health.exit_code, 0) << run << ": " << health.err;
  }

  // An alert fired on each server reaches Alertmanager.
  for (const auto& [s, run] : alert_run) {
    EXPECT_TRUE(Poll([&] { return am.Has(run, "NonFiniteUpdate"); }))
        << "NonFiniteUpdate of " << run << " (server " << s
        << ") never reached Alertmanager";
  }

  // An independent gRPC client, generated from the proto, with the header
  // set by hand: its rank lands on the server of the run's other rank.
  {
    ClientOptions options;
    options.address = nginx.address();
    options.run_id = "independent-run";
    options.world_size = 2;
    absl::StatusOr<std::unique_ptr<Client>> ours = Client::Create(options);
    ASSERT_TRUE(ours.ok());
    for (uint64_t step = 0; step < 100; ++step) {
      (*ours)->Record({.step = step, .grad_norm = 0.5});
    }
    ASSERT_TRUE((*ours)->Close(std::chrono::seconds(30)).ok());

    const std::string pb2 = dir.File("pb2");
    std::filesystem::create_directories(pb2 + "/trainwatch/v1");
    std::ofstream(pb2 + "/trainwatch/__init__.py");
    std::ofstream(pb2 + "/trainwatch/v1/__init__.py");
    CommandResult protoc =
        RunCommand({"protoc", "-I", TW_PROTO_DIR, "--python_out=" + pb2,
                    "trainwatch/v1/trainwatch.proto"});
    ASSERT_EQ(protoc.exit_code, 0) << protoc.err;
    CommandResult theirs = RunCommand(
        {"/usr/bin/python3", std::string(TW_TEST_DIR) + "/fleet_grpc_client.py",
         pb2, nginx.address(), "independent-run", "1", "2", "250"});
    ASSERT_EQ(theirs.exit_code, 0) << theirs.out << theirs.err;
    const auto where = StoredBy(dbs);
    const auto rank0 = where.find({"independent-run", 0});
    const auto rank1 = where.find({"independent-run", 1});
    ASSERT_NE(rank0, where.end());
    ASSERT_NE(rank1, where.end());
    EXPECT_EQ(rank0->second, (std::map<int, int64_t>{
                                 {rank0->second.begin()->first, 100}}));
    EXPECT_EQ(rank1->second, (std::map<int, int64_t>{
                                 {rank0->second.begin()->first, 250}}))
        << "the independent client's stream landed on another server";
  }
}

}  // namespace
}  // namespace trainwatch::testing
