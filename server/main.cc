// trainwatch-server: parses flags, starts the server, waits for SIGTERM or
// SIGINT, drains and exits 0.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "alerting/notifier.h"
#include "config/config.h"
#include "server.h"

namespace {

constexpr const char* kUsage = R"(usage: trainwatch-server [flags]

  --listen ADDR            gRPC address (default 127.0.0.1:50051; port 0 = any free port)
  --metrics-listen ADDR    Prometheus /metrics address (default 127.0.0.1:9464)
  --web-config-file FILE   TLS and basic auth for /metrics, in the Prometheus
                           exporters' web config format (tls_server_config,
                           basic_auth_users; docs/fleet.md)
  --db PATH                SQLite database (default ./trainwatch.db)
  --synchronous MODE       SQLite synchronous: NORMAL (default) or FULL
  --rank-records MODE      what is stored of ranks other than a run's lead:
                           digest (default: step, time, norms, step time, data
                           wait, to 5 significant digits) or full (every field)
  --rank-retention-steps N keep those ranks' records for the last N steps of
                           each (default 0: as long as the run)
  --engine-threads N       health-engine threads (default 2)
  --max-active-runs N      runs that have not finished, at most (default 10000)
  --run-idle-timeout SECONDS
                           a run with no step this long leaves the active runs
                           (its history stays; it can come back; default 3600)
  --retention-days N       delete runs whose last record is N days old, with
                           their records, alerts and spikes, giving the space
                           back (default 0: keep everything)
  --config FILE            YAML detector thresholds (see deploy/trainwatch.yaml)
  --alertmanager-url URL   send alerts to Alertmanager (POST URL/api/v2/alerts)
  --alertmanager-resend-interval SECONDS
                           re-send firing alerts this often (default 60)
  --webhook-url URL        POST each alert fire and resolve as JSON to URL
  --keepalive-time SECONDS    ping a connection quiet this long (default 30)
  --keepalive-timeout SECONDS drop it (ending its streams) when the ping is not
                           answered this fast (default 10): a dead or stopped
                           trainer's stream ends; an idle live one stays
  --auth-token-file FILE   require bearer tokens: lines "TOKEN SCOPE[,SCOPE...]",
                           scopes read, write:PREFIX, write:*, runs:N
                           (docs/security.md)
  --tls-cert FILE          serve gRPC over TLS with this PEM certificate chain
  --tls-key FILE           ... and this PEM private key (both or neither)
  --tls-client-ca FILE     also require client certificates signed by these
                           PEM CAs (mutual TLS; needs --tls-cert/--tls-key)
  --help                   this text
)";

[[noreturn]] void UsageError(const std::string& message) {
  fprintf(stderr, "trainwatch-server: %s\n\n%s", message.c_str(), kUsage);
  exit(2);
}

size_t ParseCount(const std::string& flag, const std::string& value) {
  size_t n = 0;
  if (!absl::SimpleAtoi(value, &n) || n == 0) {
    UsageError(flag + " wants a positive integer, got \"" + value + "\"");
  }
  return n;
}

std::chrono::milliseconds ParseSeconds(const std::string& flag,
                                       const std::string& value) {
  double seconds = 0;
  if (!absl::SimpleAtod(value, &seconds) || !(seconds >= 0.001) ||
      seconds > 86400) {
    UsageError(flag + " wants seconds in [0.001, 86400], got \"" + value +
               "\"");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

}  // namespace

int main(int argc, char** argv) {
  trainwatch::ServerOptions options;
  std::string config_path;
  const std::map<std::string, std::string*> string_flags = {
      {"--listen", &options.grpc.listen},
      {"--metrics-listen", &options.metrics.listen},
      {"--web-config-file", &options.metrics.web_config_file},
      {"--db", &options.store.db},
      {"--synchronous", &options.store.synchronous},
      {"--config", &config_path},
      {"--alertmanager-url", &options.alerts.alertmanager_url},
      {"--webhook-url", &options.alerts.webhook_url},
      {"--auth-token-file", &options.grpc.auth_token_file},
      {"--tls-cert", &options.grpc.tls.cert_file},
      {"--tls-key", &options.grpc.tls.key_file},
      {"--tls-client-ca", &options.grpc.tls.client_ca_file},
  };
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      fputs(kUsage, stdout);
      return 0;
    }
    std::string value;
    size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      UsageError(arg + " needs a value");
    }
    if (auto it = string_flags.find(arg); it != string_flags.end()) {
      *it->second = value;
    } else if (arg == "--engine-threads") {
      options.engine.threads = ParseCount(arg, value);
    } else if (arg == "--max-active-runs") {
      options.engine.max_active_runs = ParseCount(arg, value);
    } else if (arg == "--alertmanager-resend-interval") {
      double seconds = 0;
      if (!absl::SimpleAtod(value, &seconds) || !(seconds >= 0.001) ||
          seconds > 86400) {
        UsageError(arg + " wants seconds in [0.001, 86400], got \"" + value + "\"");
      }
      options.alerts.resend_interval =
          std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
    } else if (arg == "--rank-records") {
      if (value == "digest") {
        options.store.rank_records = trainwatch::StoreOptions::RankRecords::kDigest;
      } else if (value == "full") {
        options.store.rank_records = trainwatch::StoreOptions::RankRecords::kFull;
      } else {
        UsageError("--rank-records must be digest or full, got \"" + value + "\"");
      }
    } else if (arg == "--rank-retention-steps") {
      if (!absl::SimpleAtoi(value, &options.store.rank_retention_steps)) {
        UsageError(arg + " wants a step count (0 = as long as the run), got \"" +
                   value + "\"");
      }
    } else if (arg == "--retention-days") {
      if (!absl::SimpleAtoi(value, &options.engine.retention_days)) {
        UsageError(arg + " wants a number of days (0 = keep everything), got \"" +
                   value + "\"");
      }
    } else if (arg == "--run-idle-timeout") {
      options.engine.run_idle_timeout = ParseSeconds(arg, value);
    } else if (arg == "--keepalive-time") {
      options.grpc.keepalive_time = ParseSeconds(arg, value);
    } else if (arg == "--keepalive-timeout") {
      options.grpc.keepalive_timeout = ParseSeconds(arg, value);
    } else {
      UsageError("unknown flag " + arg);
    }
  }
  if (options.grpc.tls.cert_file.empty() != options.grpc.tls.key_file.empty()) {
    UsageError("--tls-cert and --tls-key go together: give both or neither");
  }
  if (!options.grpc.tls.client_ca_file.empty() && options.grpc.tls.cert_file.empty()) {
    UsageError("--tls-client-ca needs --tls-cert and --tls-key");
  }
  if (options.store.synchronous != "NORMAL" && options.store.synchronous != "FULL") {
    UsageError("--synchronous must be NORMAL or FULL");
  }
  for (const auto& [flag, url] :
       {std::pair{"--alertmanager-url", &options.alerts.alertmanager_url},
        std::pair{"--webhook-url", &options.alerts.webhook_url}}) {
    if (url->empty()) continue;
    if (absl::Status s = trainwatch::Notifier::CheckUrl(flag, *url); !s.ok()) {
      UsageError(std::string(s.message()));
    }
  }
  if (!config_path.empty()) {
    absl::StatusOr<trainwatch::HealthConfig> health =
        trainwatch::LoadHealthConfig(config_path);
    if (!health.ok()) {
      fprintf(stderr, "trainwatch-server: --config %s\n",
              std::string(health.status().message()).c_str());
      return 2;
    }
    options.engine.health = *std::move(health);
  }

  // Block the stop signals in every thread; main waits for them below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  absl::StatusOr<std::unique_ptr<trainwatch::Server>> server =
      trainwatch::Server::BuildAndStart(options);
  if (!server.ok()) {
    fprintf(stderr, "trainwatch-server: %s\n",
            std::string(server.status().message()).c_str());
    return 1;
  }
  std::string host = options.grpc.listen.substr(0, options.grpc.listen.rfind(':'));
  printf("trainwatch-server: gRPC on %s:%d, /metrics on %s://%s/metrics, db %s\n",
         host.c_str(), (*server)->grpc_port(), (*server)->metrics_scheme(),
         (*server)->metrics_address().c_str(), options.store.db.c_str());
  const char* tls = options.grpc.tls.cert_file.empty()          ? "off (plaintext)"
                    : options.grpc.tls.client_ca_file.empty() ? "on"
                                                         : "on, client certificates required";
  printf("trainwatch-server: TLS %s; bearer tokens %s\n", tls,
         options.grpc.auth_token_file.empty() ? "off (any caller may read and write)"
                                         : "required");
  if (options.grpc.tls.cert_file.empty() && options.grpc.auth_token_file.empty() &&
      host != "127.0.0.1" && host != "localhost" && host != "[::1]") {
    fprintf(stderr,
            "trainwatch-server: warning: gRPC on %s without TLS or tokens: "
            "anyone who can reach it can write and read runs\n",
            host.c_str());
  }
  printf("point a trainer at %s:%d, e.g. trainwatch.Client(\"%s:%d\", run=\"my-run\")\n",
         host.c_str(), (*server)->grpc_port(), host.c_str(),
         (*server)->grpc_port());
  fflush(stdout);

  int sig = 0;
  sigwait(&stop_signals, &sig);
  printf("trainwatch-server: %s received, draining\n",
         sig == SIGTERM ? "SIGTERM" : "SIGINT");
  fflush(stdout);
  const auto t0 = std::chrono::steady_clock::now();
  (*server)->ShutdownForExit(std::chrono::seconds(10));
  printf("trainwatch-server: stopped in %.2f s\n",
         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
             .count());
  fflush(stdout);
  fflush(stderr);
  // Everything is committed, the database closed and the last alert sent:
  // what is left is freeing each run's windows and series one by one, which
  // took ~2.4 s of malloc bookkeeping with 10,000 runs (systemd and
  // Kubernetes kill a server that outlives its grace period). The process
  // ends here instead.
  std::_Exit(0);
}
