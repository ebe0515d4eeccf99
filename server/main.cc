// trainwatch-server: parses flags, starts the server, waits for SIGTERM or
// SIGINT, drains and exits 0.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "config/config.h"
#include "health/catalog_print.h"
#include "server.h"
#include "server_flags.h"

namespace {

// --config: the detector thresholds, read once every flag is checked.
bool LoadConfig(const std::string& path, trainwatch::ServerOptions& options) {
  if (path.empty()) return true;
  absl::StatusOr<trainwatch::HealthConfig> health =
      trainwatch::LoadHealthConfig(path);
  if (!health.ok()) {
    fprintf(stderr, "trainwatch-server: --config %s\n",
            std::string(health.status().message()).c_str());
    return false;
  }
  options.engine.health = *std::move(health);
  return true;
}

// Where the server listens, whether it is secured, and how to point a
// trainer at it; a warning when it is reachable beyond loopback unsecured.
void PrintListening(const trainwatch::ServerOptions& options,
                    const trainwatch::Server& server) {
  std::string host =
      options.grpc.listen.substr(0, options.grpc.listen.rfind(':'));
  printf(
      "trainwatch-server: gRPC on %s:%d, /metrics on %s://%s/metrics, db %s\n",
      host.c_str(), server.grpc_port(), server.metrics_scheme(),
      server.metrics_address().c_str(), options.store.db.c_str());
  const char* tls = options.grpc.tls.cert_file.empty() ? "off (plaintext)"
                    : options.grpc.tls.client_ca_file.empty()
                        ? "on"
                        : "on, client certificates required";
  printf("trainwatch-server: TLS %s; bearer tokens %s\n", tls,
         options.grpc.auth_token_file.empty()
             ? "off (any caller may read and write)"
             : "required");
  if (options.grpc.tls.cert_file.empty() &&
      options.grpc.auth_token_file.empty() && host != "127.0.0.1" &&
      host != "localhost" && host != "[::1]") {
    fprintf(stderr,
            "trainwatch-server: warning: gRPC on %s without TLS or tokens: "
            "anyone who can reach it can write and read runs\n",
            host.c_str());
  }
  printf(
      "point a trainer at %s:%d, e.g. trainwatch.Client(\"%s:%d\", "
      "run=\"my-run\")\n",
      host.c_str(), server.grpc_port(), host.c_str(), server.grpc_port());
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<trainwatch::ServerFlags> flags = trainwatch::ParseServerFlags(
      std::vector<std::string>(argv + 1, argv + argc));
  if (!flags.ok()) {
    fprintf(stderr, "trainwatch-server: %s\n\n%s",
            std::string(flags.status().message()).c_str(),
            trainwatch::ServerUsage().c_str());
    return 2;
  }
  if (flags->help) {
    fputs(trainwatch::ServerUsage().c_str(), stdout);
    return 0;
  }
  if (!flags->print_catalog.empty()) {
    fputs(trainwatch::PrintCatalog(flags->print_catalog)->c_str(), stdout);
    return 0;
  }
  trainwatch::ServerOptions& options = flags->options;
  if (!LoadConfig(flags->config_path, options)) return 2;
  if (flags->closed_loop_mode.has_value()) {
    options.engine.health.closed_loop.mode = *flags->closed_loop_mode;
  }
  if (flags->print_config) {
    fputs(trainwatch::PrintHealthConfigAs(flags->print_config_what, options.engine.health)
              ->c_str(),
          stdout);
    return 0;
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
  PrintListening(options, **server);
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
