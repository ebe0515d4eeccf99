// trainwatch-server: owns and wires every part (store, metrics, notifier,
// engine, ingest, query) and the gRPC server in front of them.
//
// Threads: BuildAndStart() and Shutdown() from the main thread.
#ifndef TRAINWATCH_SERVER_SERVER_H_
#define TRAINWATCH_SERVER_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "auth/tls_files.h"
#include "common/validate.h"
#include "engine/engine_options.h"
#include "store/store.h"

namespace trainwatch {

class Metrics;
class Engine;
class Ingest;
class Query;
class Notifier;
class Authorizer;
class ClosedLoop;

// The server's options, one part per component it builds (as TF Serving
// nests its parts' options); main.cc fills them from the flags.
struct ServerOptions {
  struct GrpcPart {
    // gRPC address; port 0 picks a free port (see grpc_port()).
    std::string listen = "127.0.0.1:50051";
    // HTTP/2 keepalive: a ping after this long without traffic on a
    // connection, and the connection dropped (its streams cancelled) when
    // the ping is not answered within keepalive_timeout. This is what ends
    // the stream of a dead or stopped trainer; a live idle trainer answers
    // pings and keeps its stream.
    std::chrono::milliseconds keepalive_time{30'000};
    std::chrono::milliseconds keepalive_timeout{10'000};
    // A gRPC message (one ReportRequest) larger than this is refused by
    // gRPC itself with RESOURCE_EXHAUSTED. 16 MiB holds a full batch of
    // 16384 ordinary records with room to spare.
    int max_receive_message_bytes = 16 * 1024 * 1024;
    // Bearer tokens and their scopes (auth/auth.h); "" = no auth: every
    // call may do everything.
    std::string auth_token_file;
    // TLS: on when tls.cert_file is set (then tls.key_file too);
    // tls.client_ca_file also requires client certificates (mTLS).
    TlsFiles tls;
  };
  struct MetricsPart {
    // /metrics address; port 0 picks a free port; "" serves no /metrics.
    std::string listen = "127.0.0.1:9464";
    // The exporters' web configuration file (TLS, basic auth;
    // metrics/web_config.h); "" = plain HTTP without auth.
    std::string web_config_file;
  };
  struct StorePart {
    // SQLite database file (the embedded default).
    std::string db = "trainwatch.db";
    // PRAGMA synchronous: NORMAL or FULL.
    std::string synchronous = "NORMAL";
    // Where Backup stages its copy; "" = the database's directory.
    std::string backup_dir;
    // What is kept of the ranks other than a run's lead, and for how many
    // steps (StoreOptions; docs/architecture.md, "What is kept per rank").
    StoreOptions::RankRecords rank_records = StoreOptions::RankRecords::kDigest;
    uint64_t rank_retention_steps = 0;
  };
  struct AlertsPart {
    // Alertmanager base URL (alerts are POSTed to URL/api/v2/alerts); "" = none.
    std::string alertmanager_url;
    // Plain JSON webhook, one POST per fire or resolve; "" = none.
    std::string webhook_url;
    // How often a firing alert is re-sent to Alertmanager (Prometheus' default).
    std::chrono::milliseconds resend_interval{60'000};
  };
  GrpcPart grpc;
  MetricsPart metrics;
  StorePart store;
  EngineOptions engine;  // its threads, bounds, retention and detector config
  AlertsPart alerts;
  ValidationLimits limits;  // of what ingest accepts
};

class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> BuildAndStart(
      ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int grpc_port() const { return grpc_port_; }
  // host:port of /metrics, "" when not served.
  std::string metrics_address() const { return metrics_address_; }
  // "https" when --web-config-file turns TLS on for /metrics, else "http".
  const char* metrics_scheme() const { return metrics_tls_ ? "https" : "http"; }

  // Drains: stops taking messages, commits and acks what arrived, ends every
  // stream with UNAVAILABLE, then stops the parts in dependency order.
  void Shutdown(std::chrono::milliseconds drain_timeout);
  // Shutdown(), then closes the database so the process may end without the
  // rest of the teardown (freeing each run's state), which is what `main`
  // does on SIGTERM. The server answers nothing afterwards.
  void ShutdownForExit(std::chrono::milliseconds drain_timeout);

 private:
  class Service;
  Server() = default;
  // BuildAndStart's steps, in order; each fails with what the flag names.
  absl::Status LoadAuthorizer(const ServerOptions::GrpcPart& part);
  absl::Status StartMetrics(const ServerOptions::MetricsPart& part);
  absl::Status OpenStore(const ServerOptions::StorePart& part);
  absl::Status StartNotifier(const ServerOptions::AlertsPart& part);
  absl::Status StartEngineAndServices(const ServerOptions& options);
  absl::Status StartGrpc(const ServerOptions& options,
                         const std::shared_ptr<grpc::ServerCredentials>& credentials);

  std::unique_ptr<Store> store_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<Notifier> notifier_;  // null without a receiver URL
  std::unique_ptr<Authorizer> authorizer_;  // null without --auth-token-file
  std::unique_ptr<ClosedLoop> closed_loop_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Ingest> ingest_;
  std::unique_ptr<Query> query_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  int grpc_port_ = 0;
  std::string metrics_address_;
  bool metrics_tls_ = false;
  bool shut_down_ = false;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_SERVER_H_
