// Alert delivery end to end, against the real Alertmanager (Debian package
// prometheus-alertmanager) and a webhook receiver served by this test: a
// replayed spike reaches Alertmanager's API with its labels and annotations,
// keeps being re-sent after a server restart, resolves, and Alertmanager
// notifies the receiver of both; --webhook-url gets both transitions
// directly. Prints the delivery latencies docs/alerting.md quotes.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "gtest/gtest.h"
#include "eventually.h"
#include "harness.h"

namespace trainwatch::testing {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr char kAlertmanager[] = "/usr/bin/prometheus-alertmanager";
constexpr uint64_t kSpikeStep = 3000;
constexpr auto kTimeout = std::chrono::seconds(30);

double Ms(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// Eventually, polling every 5 ms (the latencies printed include it) until
// kTimeout.
template <typename F>
bool Poll(F ready) {
  return Eventually(ready, kTimeout, std::chrono::milliseconds(5));
}

// Seconds since the epoch of an RFC 3339 UTC time as Alertmanager writes it
// (Go trims trailing zeros of the fraction, so strings do not compare).
double ParseTime(const std::string& t) {
  std::tm tm{};
  double sec = 0;
  if (sscanf(t.c_str(), "%d-%d-%dT%d:%d:%lf", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
             &tm.tm_hour, &tm.tm_min, &sec) != 6) {
    ADD_FAILURE() << "not an RFC 3339 time: " << t;
    return 0;
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return static_cast<double>(timegm(&tm)) + sec;
}

// A one-request-per-connection HTTP server on 127.0.0.1:0 that records every
// POST body with its arrival time and answers 200.
class Receiver {
 public:
  struct Request {
    std::string path;
    json body;
    Clock::time_point at;
  };

  Receiver() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    listen(fd_, 16);
    thread_ = std::thread([this] { Serve(); });
  }
  ~Receiver() {
    stop_ = true;
    thread_.join();
    close(fd_);
  }

  std::string url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }
  std::vector<Request> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  // The first request to `path` whose body satisfies `match`, waiting for it.
  std::optional<Request> WaitFor(const std::string& path,
                                 const std::function<bool(const json&)>& match) {
    std::optional<Request> found;
    Poll([&] {
      for (const Request& r : requests()) {
        if (r.path == path && match(r.body)) {
          found = r;
          return true;
        }
      }
      return false;
    });
    return found;
  }

 private:
  void Serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      int c = accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      Handle(c);
      close(c);
    }
  }
  void Handle(int c) {
    std::string data;
    char buf[65536];
    size_t header_end = std::string::npos, length = 0;
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (Clock::now() < deadline) {
      pollfd p{c, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      ssize_t n = read(c, buf, sizeof(buf));
      if (n <= 0) break;
      data.append(buf, n);
      if (header_end == std::string::npos) {
        header_end = data.find("\r\n\r\n");
        if (header_end == std::string::npos) continue;
        std::string headers = data.substr(0, header_end);
        for (char& ch : headers) ch = static_cast<char>(std::tolower(ch));
        size_t cl = headers.find("content-length:");
        if (cl != std::string::npos) length = std::stoul(headers.substr(cl + 15));
      }
      if (data.size() >= header_end + 4 + length) break;
    }
    if (header_end == std::string::npos) return;
    Request r;
    r.at = Clock::now();
    size_t sp1 = data.find(' '), sp2 = data.find(' ', sp1 + 1);
    r.path = data.substr(sp1 + 1, sp2 - sp1 - 1);
    r.body = json::parse(data.substr(header_end + 4, length), nullptr, false);
    {
      std::lock_guard<std::mutex> lock(mu_);
      requests_.push_back(std::move(r));
    }
    const char kOk[] = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    (void)!write(c, kOk, sizeof(kOk) - 1);
  }

  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<Request> requests_;
};

// The real Alertmanager on a free loopback port, clustering off, routing
// everything to `webhook` with short group timers.
class AlertmanagerProcess {
 public:
  AlertmanagerProcess(const TempDir& dir, const std::string& webhook) {
    port_ = FreePort();
    std::ofstream(dir.File("am.yml"))
        << "route:\n"
           "  receiver: test\n"
           "  group_by: [alertname, run]\n"
           "  group_wait: 100ms\n"
           "  group_interval: 1s\n"
           "  repeat_interval: 1h\n"
           "receivers:\n"
           "  - name: test\n"
           "    webhook_configs:\n"
           "      - url: " << webhook << "\n"
           "        send_resolved: true\n";
    std::filesystem::create_directories(dir.File("am-data"));
    std::vector<std::string> args = {
        kAlertmanager, "--config.file=" + dir.File("am.yml"),
        "--storage.path=" + dir.File("am-data"),
        "--web.listen-address=127.0.0.1:" + std::to_string(port_),
        "--cluster.listen-address=", "--log.level=warn"};
    log_ = dir.File("am.log");
    pid_ = fork();
    if (pid_ == 0) {
      FILE* f = fopen(log_.c_str(), "w");
      dup2(fileno(f), 1);
      dup2(fileno(f), 2);
      std::vector<char*> cargs;
      for (auto& a : args) cargs.push_back(a.data());
      cargs.push_back(nullptr);
      execv(cargs[0], cargs.data());
      _exit(127);
    }
    ready_ = Poll([&] { return HttpGet(url() + "/-/ready").find("OK") != std::string::npos; });
    if (!ready_) {
      std::ifstream in(log_);
      std::stringstream ss;
      ss << in.rdbuf();
      ADD_FAILURE() << "Alertmanager did not become ready; its log:\n" << ss.str();
    }
  }
  ~AlertmanagerProcess() {
    kill(pid_, SIGTERM);
    int status;
    waitpid(pid_, &status, 0);
  }
  bool ready() const { return ready_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  // Alertmanager's GET /api/v2/alerts (active, silenced, inhibited and
  // unprocessed alerts) for one run.
  json Alerts(const std::string& run) const {
    return json::parse(
        HttpGet(url() + "/api/v2/alerts?filter=run%3D%22" + run + "%22"), nullptr,
        false);
  }

 private:
  int port_ = 0;
  pid_t pid_ = -1;
  bool ready_ = false;
  std::string log_;
};

// A healthy bf16 run with labels: steps 0..2999 in `healthy`, then the
// spike alone in `spike`, so the spike's delivery can be timed by itself.
void WriteSpikeLogs(const std::string& healthy, const std::string& spike,
                    const std::string& run) {
  const std::string start =
      json{{"run_start",
            {{"run_id", run}, {"precision", "BF16"}, {"max_norm", 1.0},
             {"warmup_steps", 200},
             {"labels", {{"model", "llama-7b"}, {"owner", "ana"}}}}}}
          .dump();
  std::ofstream out(healthy);
  out << start << "\n";
  std::mt19937_64 rng(7);
  std::normal_distribution<double> noise(0.0, 0.2);
  for (uint64_t i = 0; i < kSpikeStep; ++i) {
    out << json{{"step", i}, {"grad_norm", 0.35 * std::exp(noise(rng))},
                {"batch_ids", {7 * i, 7 * i + 1}}}
               .dump()
        << "\n";
  }
  std::ofstream(spike) << start << "\n"
                       << json{{"step", kSpikeStep}, {"grad_norm", 12.0},
                               {"batch_ids", {7 * kSpikeStep, 7 * kSpikeStep + 1}}}
                              .dump()
                       << "\n";
}

// 199 healthy steps after the spike: the alert resolves at kSpikeStep + 100.
void WriteHealthyTail(const std::string& path) {
  std::ofstream out(path);
  for (uint64_t i = kSpikeStep + 1; i < kSpikeStep + 200; ++i) {
    out << json{{"step", i}, {"grad_norm", 0.35}}.dump() << "\n";
  }
}

void Replay(const ServerProcess& server, std::vector<std::string> args) {
  std::vector<std::string> argv = {BinDir() + "/trainwatchctl", "--server",
                                   server.grpc_address(), "replay"};
  argv.insert(argv.end(), args.begin(), args.end());
  CommandResult r = RunCommand(argv);
  ASSERT_EQ(r.exit_code, 0) << r.err;
}

const json* FindAlert(const json& alerts, const std::string& alertname) {
  if (!alerts.is_array()) return nullptr;
  for (const json& a : alerts) {
    if (a["labels"].value("alertname", "") == alertname) return &a;
  }
  return nullptr;
}

// Whether an Alertmanager webhook body carries the run's spike in `status`.
bool AmNotifies(const json& body, const std::string& run, const std::string& status) {
  if (!body.is_object() || !body.contains("alerts")) return false;
  for (const json& a : body["alerts"]) {
    if (a["labels"].value("run", "") == run &&
        a["labels"].value("alertname", "") == "GradNormSpike" &&
        a.value("status", "") == status) {
      return true;
    }
  }
  return false;
}

TEST(AlertmanagerIntegration, SpikeFiresInAlertmanagerSurvivesARestartAndResolves) {
  ASSERT_TRUE(std::filesystem::exists(kAlertmanager))
      << kAlertmanager << " is missing: install the Debian package "
      << "prometheus-alertmanager (deploy/install.sh does)";
  TempDir dir;
  Receiver receiver;
  AlertmanagerProcess am(dir, receiver.url("/am"));
  ASSERT_TRUE(am.ready());
  const std::vector<std::string> flags = {"--alertmanager-url", am.url(),
                                          "--alertmanager-resend-interval", "2"};
  auto server = std::make_unique<ServerProcess>(dir.File("tw.db"), 0, flags);
  const int port = server->grpc_port();
  const std::string run = "am-run";
  WriteSpikeLogs(dir.File("healthy.jsonl"), dir.File("spike.jsonl"), run);
  Replay(*server, {dir.File("healthy.jsonl")});

  const auto sent = Clock::now();  // trainwatchctl starts and sends the spike
  Replay(*server, {dir.File("spike.jsonl")});
  const auto acked = Clock::now();
  json alerts;
  ASSERT_TRUE(Poll([&] {
    alerts = am.Alerts(run);
    return FindAlert(alerts, "GradNormSpike") != nullptr;
  })) << "the spike never reached Alertmanager: " << alerts.dump();
  const auto visible = Clock::now();
  const json& a = *FindAlert(alerts, "GradNormSpike");
  EXPECT_EQ(a["labels"], (json{{"alertname", "GradNormSpike"}, {"run", run},
                               {"severity", "info"}, {"model", "llama-7b"},
                               {"owner", "ana"}}));
  EXPECT_EQ(a["annotations"]["started_step"], "3000");
  EXPECT_EQ(a["annotations"]["batch_ids"], "21000,21001");
  EXPECT_NE(a["annotations"]["description"].get<std::string>().find("12"),
            std::string::npos);
  EXPECT_FALSE(a["annotations"]["summary"].get<std::string>().empty());
  EXPECT_FALSE(a["annotations"]["likely_cause"].get<std::string>().empty());
  EXPECT_FALSE(a["annotations"]["fix"].get<std::string>().empty());
  // Firing: endsAt is about now + 4 x the 2 s resend interval.
  EXPECT_GT(ParseTime(a["endsAt"].get<std::string>()),
            ParseTime(a["startsAt"].get<std::string>()) + 4);

  std::optional<Receiver::Request> fired = receiver.WaitFor(
      "/am", [&](const json& b) { return AmNotifies(b, run, "firing"); });
  ASSERT_TRUE(fired.has_value()) << "Alertmanager never notified the firing alert";
  printf("[latency] spike replay start -> ack (trainwatchctl exits): %.1f ms\n",
         Ms(acked - sent));
  printf("[latency] spike replay start -> alert in Alertmanager's API: %.1f ms "
         "(%.1f ms after the ack; includes the 5 ms poll)\n",
         Ms(visible - sent), Ms(visible - acked));
  printf("[latency] spike replay start -> Alertmanager's webhook (group_wait 100ms): "
         "%.1f ms\n", Ms(fired->at - sent));

  // A restart: the alert restored from the database is re-sent (endsAt
  // moves on again), so Alertmanager does not time it out.
  server->Kill();
  // A resend the killed server had on the wire still lands in Alertmanager:
  // let it, so that only the restarted server can move endsAt past
  // ends_before (Alertmanager says nothing of requests in flight).
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const json before = am.Alerts(run);
  ASSERT_NE(FindAlert(before, "GradNormSpike"), nullptr) << before.dump();
  const double ends_before =
      ParseTime((*FindAlert(before, "GradNormSpike"))["endsAt"].get<std::string>());
  server = std::make_unique<ServerProcess>(dir.File("tw.db"), port, flags);
  EXPECT_TRUE(Poll([&] {
    const json now = am.Alerts(run);
    const json* again = FindAlert(now, "GradNormSpike");
    return again != nullptr &&
           ParseTime((*again)["endsAt"].get<std::string>()) > ends_before;
  })) << "the restarted server did not re-send the firing alert";

  // 199 healthy steps: the alert resolves (at step 3100); Alertmanager's
  // API stops listing it and the receiver hears of the resolve.
  WriteHealthyTail(dir.File("tail.jsonl"));
  Replay(*server, {"--run", run, "--max-norm", "1", "--warmup-steps", "200",
                   dir.File("tail.jsonl")});
  const auto resolved_acked = Clock::now();
  EXPECT_TRUE(Poll([&] { return FindAlert(am.Alerts(run), "GradNormSpike") == nullptr; }))
      << am.Alerts(run).dump();
  const auto gone = Clock::now();
  std::optional<Receiver::Request> resolved = receiver.WaitFor(
      "/am", [&](const json& b) { return AmNotifies(b, run, "resolved"); });
  ASSERT_TRUE(resolved.has_value()) << "Alertmanager never notified the resolve";
  printf("[latency] resolving replay ack -> gone from Alertmanager's active alerts: "
         "%.1f ms; -> Alertmanager's resolved webhook: %.1f ms\n",
         Ms(gone - resolved_acked), Ms(resolved->at - resolved_acked));

  std::string metrics = HttpGet(server->metrics_url());
  EXPECT_GE(MetricValue(metrics, "trainwatch_notifications_sent_total{receiver=\"alertmanager\"}"), 1);
  EXPECT_EQ(MetricValue(metrics, "trainwatch_notifications_dropped_total{receiver=\"alertmanager\"}"), 0);
}

TEST(AlertmanagerIntegration, WebhookGetsTheFireAndTheResolveDirectly) {
  TempDir dir;
  Receiver receiver;
  ServerProcess server(dir.File("tw.db"), 0, {"--webhook-url", receiver.url("/tw")});
  const std::string run = "hook-run";
  WriteSpikeLogs(dir.File("healthy.jsonl"), dir.File("spike.jsonl"), run);
  Replay(server, {dir.File("healthy.jsonl")});
  const auto sent = Clock::now();
  Replay(server, {dir.File("spike.jsonl")});
  std::optional<Receiver::Request> fired = receiver.WaitFor(
      "/tw", [](const json& b) { return b.value("status", "") == "firing"; });
  ASSERT_TRUE(fired.has_value()) << "no firing webhook";
  printf("[latency] spike replay start -> direct webhook (firing): %.1f ms\n",
         Ms(fired->at - sent));
  const json& f = fired->body;
  EXPECT_EQ(f["alertname"], "GradNormSpike");
  EXPECT_EQ(f["run"], run);
  EXPECT_EQ(f["severity"], "info");  // recorded, not paged (docs/detectors.md)
  EXPECT_EQ(f["labels"], (json{{"model", "llama-7b"}, {"owner", "ana"}}));
  EXPECT_EQ(f["started_step"], kSpikeStep);
  EXPECT_EQ(f["peak_value"], 12.0);
  EXPECT_EQ(f["batch_ids"], (json{7 * kSpikeStep, 7 * kSpikeStep + 1}));
  EXPECT_TRUE(f["resolved_at"].is_null());
  EXPECT_FALSE(f["fix"].get<std::string>().empty());

  WriteHealthyTail(dir.File("tail.jsonl"));
  Replay(server, {"--run", run, "--max-norm", "1", "--warmup-steps", "200",
                  dir.File("tail.jsonl")});
  std::optional<Receiver::Request> resolved = receiver.WaitFor(
      "/tw", [](const json& b) { return b.value("status", "") == "resolved"; });
  ASSERT_TRUE(resolved.has_value()) << "no resolved webhook";
  EXPECT_EQ(resolved->body["resolved_step"], kSpikeStep + 100);
  EXPECT_TRUE(resolved->body["resolved_at"].is_string());
  EXPECT_EQ(receiver.requests().size(), 2u);

  std::string metrics = HttpGet(server.metrics_url());
  EXPECT_EQ(MetricValue(metrics, "trainwatch_notifications_sent_total{receiver=\"webhook\"}"), 2);
  EXPECT_EQ(MetricValue(metrics, "trainwatch_notification_failures_total{receiver=\"webhook\"}"), 0);
  EXPECT_EQ(MetricValue(metrics, "trainwatch_notifications_dropped_total{receiver=\"webhook\"}"), 0);
}

}  // namespace
}  // namespace trainwatch::testing
