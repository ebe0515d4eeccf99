#include "server.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "alerting/http_sender.h"
#include "alerting/notifier.h"
#include "auth/auth.h"
#include "auth/call_token.h"
#include "closedloop/closed_loop.h"
#include "engine/engine.h"
#include "ingest/ingest.h"
#include "metrics/metrics.h"
#include "query/query.h"
#include "store/store.h"
#include "trainwatch/v1/trainwatch.grpc.pb.h"

namespace trainwatch {
namespace {

// Report is a raw (serialized) callback method: Ingest parses each message
// itself so that one protobuf cannot parse gets a clear INVALID_ARGUMENT.
using ServiceBase = v1::TrainingHealth::WithRawCallbackMethod_Report<
    v1::TrainingHealth::Service>;

}  // namespace

// The gRPC service: thin adapters over Ingest (callback API, never blocks)
// and Query (sync API: reads may wait on disk, on gRPC's sync thread pool).
// With auth on, queries need a token with the read scope; Ingest checks the
// Report streams' tokens itself.
class Server::Service final : public ServiceBase {
 public:
  Service(Ingest* ingest, const Query* query, const Authorizer* authorizer)
      : ingest_(ingest), query_(query), authorizer_(authorizer) {}

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Report(
      grpc::CallbackServerContext* context) override {
    return ingest_->NewReport(context);
  }

  grpc::Status ListRuns(grpc::ServerContext* context,
                        const v1::ListRunsRequest* request,
                        v1::ListRunsResponse* response) override {
    absl::StatusOr<const TokenScope*> scope = ReadScope(*context);
    if (!scope.ok()) return ToGrpcStatus(scope.status());
    absl::StatusOr<v1::ListRunsResponse> r = query_->ListRuns(*request);
    if (!r.ok()) return ToGrpcStatus(r.status());
    // A read:PREFIX token lists only its runs.
    KeepReadable(*scope, *r->mutable_runs(), &v1::RunSummary::run_id);
    *response = std::move(*r);
    return grpc::Status::OK;
  }

  grpc::Status GetRunHealth(grpc::ServerContext* context,
                            const v1::GetRunHealthRequest* request,
                            v1::GetRunHealthResponse* response) override {
    if (grpc::Status s = CheckReadRun(*context, request->run_id()); !s.ok()) return s;
    absl::StatusOr<v1::GetRunHealthResponse> r = query_->GetRunHealth(*request);
    if (!r.ok()) return ToGrpcStatus(r.status());
    *response = std::move(*r);
    return grpc::Status::OK;
  }

  grpc::Status ListAlerts(grpc::ServerContext* context,
                          const v1::ListAlertsRequest* request,
                          v1::ListAlertsResponse* response) override {
    absl::StatusOr<const TokenScope*> scope = ReadScope(*context);
    if (!scope.ok()) return ToGrpcStatus(scope.status());
    if (!request->run_id().empty()) {
      if (absl::Status s = Authorizer::CheckReadRun(*scope, request->run_id()); !s.ok()) {
        return ToGrpcStatus(s);
      }
    }
    absl::StatusOr<v1::ListAlertsResponse> r = query_->ListAlerts(*request);
    if (!r.ok()) return ToGrpcStatus(r.status());
    KeepReadable(*scope, *r->mutable_alerts(), &v1::Alert::run);
    *response = std::move(*r);
    return grpc::Status::OK;
  }

  grpc::Status QuerySteps(grpc::ServerContext* context,
                          const v1::QueryStepsRequest* request,
                          grpc::ServerWriter<v1::StepRecords>* writer) override {
    if (grpc::Status s = CheckReadRun(*context, request->run_id()); !s.ok()) return s;
    return ToGrpcStatus(query_->QuerySteps(*request, [&](const v1::StepRecords& c) {
      return !context->IsCancelled() && writer->Write(c);
    }));
  }

  // A token with write scope for the run.
  grpc::Status DeleteRun(grpc::ServerContext* context,
                         const v1::DeleteRunRequest* request,
                         v1::DeleteRunResponse* response) override {
    if (authorizer_ != nullptr) {
      absl::StatusOr<const TokenScope*> scope =
          authorizer_->AuthorizeReport(AuthorizationOf(*context));
      if (!scope.ok()) return ToGrpcStatus(scope.status());
      if (absl::Status s = Authorizer::CheckWriteRun(**scope, request->run_id()); !s.ok()) {
        return ToGrpcStatus(s);
      }
    }
    absl::StatusOr<v1::DeleteRunResponse> r = query_->DeleteRun(*request);
    if (!r.ok()) return ToGrpcStatus(r.status());
    *response = std::move(*r);
    return grpc::Status::OK;
  }

  // A copy of everything: the read scope for every run (a read:PREFIX
  // token's backup would hold other tenants' runs).
  grpc::Status Backup(grpc::ServerContext* context, const v1::BackupRequest* request,
                      grpc::ServerWriter<v1::BackupChunk>* writer) override {
    absl::StatusOr<const TokenScope*> scope = ReadScope(*context);
    if (!scope.ok()) return ToGrpcStatus(scope.status());
    if (absl::Status s = Authorizer::CheckReadAll(*scope); !s.ok()) return ToGrpcStatus(s);
    return ToGrpcStatus(query_->Backup([&](const v1::BackupChunk& c) {
      return !context->IsCancelled() && writer->Write(c);
    }));
  }

  grpc::Status ListDirectives(grpc::ServerContext* context,
                              const v1::ListDirectivesRequest* request,
                              v1::ListDirectivesResponse* response) override {
    if (grpc::Status s = CheckReadRun(*context, request->run_id()); !s.ok()) return s;
    return Reply(query_->ListDirectives(*request), response);
  }

  // Decisions need write scope for the directive's run: a token for
  // team-a/ cannot approve team-b/'s.
  grpc::Status ApproveDirective(grpc::ServerContext* context,
                                const v1::DecideDirectiveRequest* request,
                                v1::DirectiveRecord* response) override {
    return Decide(*context, *request, /*approve=*/true, response);
  }
  grpc::Status RejectDirective(grpc::ServerContext* context,
                               const v1::DecideDirectiveRequest* request,
                               v1::DirectiveRecord* response) override {
    return Decide(*context, *request, /*approve=*/false, response);
  }

  grpc::Status HoldRun(grpc::ServerContext* context, const v1::HoldRunRequest* request,
                       v1::HoldRunResponse* response) override {
    absl::StatusOr<std::string> who = WriterOf(*context, request->run_id(), request->by());
    if (!who.ok()) return ToGrpcStatus(who.status());
    return Reply(query_->HoldRun(*request, *who), response);
  }

  // Reference runs: setting them needs write scope for the run; showing
  // and comparing, read scope for the run and for every baseline.
  grpc::Status SetBaselines(grpc::ServerContext* context, const v1::SetBaselinesRequest* request,
                            v1::BaselinesResponse* response) override {
    absl::StatusOr<std::string> who = WriterOf(*context, request->run_id(), "");
    if (!who.ok()) return ToGrpcStatus(who.status());
    for (const v1::BaselineRef& ref : request->baselines()) {
      if (grpc::Status s = CheckReadRun(*context, ref.run()); !s.ok()) return s;
    }
    return Reply(query_->SetBaselines(*request), response);
  }
  grpc::Status GetBaselines(grpc::ServerContext* context, const v1::GetBaselinesRequest* request,
                            v1::BaselinesResponse* response) override {
    if (grpc::Status s = CheckReadRun(*context, request->run_id()); !s.ok()) return s;
    return Reply(query_->GetBaselines(*request), response);
  }
  grpc::Status CompareRuns(grpc::ServerContext* context, const v1::CompareRunsRequest* request,
                           v1::CompareRunsResponse* response) override {
    if (grpc::Status s = CheckReadRun(*context, request->run_id()); !s.ok()) return s;
    absl::StatusOr<v1::CompareRunsResponse> r = query_->CompareRuns(*request);
    if (!r.ok()) return ToGrpcStatus(r.status());
    for (const v1::BaselineRef& ref : r->refs()) {
      if (grpc::Status s = CheckReadRun(*context, ref.run()); !s.ok()) return s;
    }
    *response = std::move(*r);
    return grpc::Status::OK;
  }

 private:
  template <typename T>
  static grpc::Status Reply(absl::StatusOr<T> r, T* response) {
    if (!r.ok()) return ToGrpcStatus(r.status());
    *response = std::move(*r);
    return grpc::Status::OK;
  }

  grpc::Status Decide(const grpc::ServerContextBase& context,
                      const v1::DecideDirectiveRequest& request, bool approve,
                      v1::DirectiveRecord* response) {
    absl::StatusOr<std::pair<std::string, uint64_t>> id = ClosedLoop::ParseId(request.id());
    if (!id.ok()) return ToGrpcStatus(id.status());
    absl::StatusOr<std::string> who = WriterOf(context, id->first, request.by());
    if (!who.ok()) return ToGrpcStatus(who.status());
    return Reply(query_->DecideDirective(request, approve, *who), response);
  }

  // Who decides for `run_id` (the name the caller gives, and the token's
  // line when auth is on), or why the call may not: write scope for the run.
  absl::StatusOr<std::string> WriterOf(const grpc::ServerContextBase& context,
                                       const std::string& run_id,
                                       const std::string& by) const {
    std::string who = by.empty() ? "trainwatchctl" : by.substr(0, 64);
    if (authorizer_ == nullptr) return who;
    absl::StatusOr<const TokenScope*> scope =
        authorizer_->AuthorizeReport(AuthorizationOf(context));
    if (!scope.ok()) return scope.status();
    if (absl::Status s = Authorizer::CheckWriteRun(**scope, run_id); !s.ok()) return s;
    return absl::StrCat(who, " (token line ", (*scope)->line, ")");
  }

  // Takes out of `items` those whose run (`run_of`) `scope` may not read.
  template <typename Item>
  static void KeepReadable(const TokenScope* scope, google::protobuf::RepeatedPtrField<Item>& items,
                           const std::string& (Item::*run_of)() const) {
    items.erase(std::remove_if(items.begin(), items.end(),
                               [&](const Item& item) {
                                 return !Authorizer::MayReadRun(scope, (item.*run_of)());
                               }),
                items.end());
  }

  // The call's read scope: null with auth off (every run).
  absl::StatusOr<const TokenScope*> ReadScope(const grpc::ServerContextBase& context) const {
    if (authorizer_ == nullptr) return nullptr;
    return authorizer_->AuthorizeRead(AuthorizationOf(context));
  }

  grpc::Status CheckReadRun(const grpc::ServerContextBase& context,
                            const std::string& run_id) const {
    absl::StatusOr<const TokenScope*> scope = ReadScope(context);
    if (!scope.ok()) return ToGrpcStatus(scope.status());
    return ToGrpcStatus(Authorizer::CheckReadRun(*scope, run_id));
  }

  Ingest* const ingest_;
  const Query* const query_;
  const Authorizer* const authorizer_;  // null: auth off
};

namespace {

// TLS credentials from options.grpc.tls, or insecure ones without a certificate.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ListenCredentials(
    const TlsFiles& files) {
  if (files.cert_file.empty()) return grpc::InsecureServerCredentials();
  std::string warning;
  absl::StatusOr<TlsPem> pem = LoadTlsFiles(files, &warning);
  if (!pem.ok()) return pem.status();
  if (!warning.empty()) {
    fprintf(stderr, "trainwatch-server: warning: %s\n", warning.c_str());
  }
  grpc::SslServerCredentialsOptions ssl(
      pem->client_ca.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = pem->client_ca;
  ssl.pem_key_cert_pairs.push_back({pem->private_key, pem->cert_chain});
  return grpc::SslServerCredentials(ssl);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::BuildAndStart(
    ServerOptions options) {
  std::unique_ptr<Server> server(new Server());
  // The security files first: a wrong one fails before anything is opened.
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      ListenCredentials(options.grpc.tls);
  if (!credentials.ok()) return credentials.status();
  if (absl::Status s = server->LoadAuthorizer(options.grpc); !s.ok()) return s;
  if (absl::Status s = server->StartMetrics(options.metrics); !s.ok()) return s;
  if (absl::Status s = server->OpenStore(options.store); !s.ok()) return s;
  if (absl::Status s = server->StartNotifier(options.alerts); !s.ok()) return s;
  if (absl::Status s = server->StartEngineAndServices(options); !s.ok()) return s;
  if (absl::Status s = server->StartGrpc(options, *credentials); !s.ok()) return s;
  return server;
}

absl::Status Server::LoadAuthorizer(const ServerOptions::GrpcPart& part) {
  if (!part.auth_token_file.empty()) {
    std::string warning;
    absl::StatusOr<std::unique_ptr<Authorizer>> authorizer =
        Authorizer::Load(part.auth_token_file, &warning);
    if (!authorizer.ok()) {
      return absl::Status(authorizer.status().code(),
                          absl::StrCat("--auth-token-file ",
                                       authorizer.status().message()));
    }
    if (!warning.empty()) {
      fprintf(stderr, "trainwatch-server: warning: --auth-token-file %s\n",
              warning.c_str());
    }
    authorizer_ = *std::move(authorizer);
  }
  return absl::OkStatus();
}

absl::Status Server::StartMetrics(const ServerOptions::MetricsPart& part) {
  WebConfig web;
  if (!part.web_config_file.empty()) {
    absl::StatusOr<WebConfig> loaded = LoadWebConfig(part.web_config_file);
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(),
                          absl::StrCat("--web-config-file ",
                                       loaded.status().message()));
    }
    web = *std::move(loaded);
  }
  metrics_tls_ = web.tls();
  absl::StatusOr<std::unique_ptr<Metrics>> metrics =
      Metrics::Create(part.listen, web);
  if (!metrics.ok()) return metrics.status();
  metrics_ = std::move(*metrics);
  return absl::OkStatus();
}

absl::Status Server::OpenStore(const ServerOptions::StorePart& part) {
  Metrics* m = metrics_.get();
  StoreOptions store_options;
  store_options.path = part.db;
  store_options.synchronous = part.synchronous;
  store_options.rank_records = part.rank_records;
  store_options.rank_retention_steps = part.rank_retention_steps;
  store_options.on_commit = [m](double seconds, size_t, size_t depth) {
    m->store_commit_seconds.Observe(seconds);
    m->store_queue_depth.Set(static_cast<double>(depth));
  };
  store_options.on_error = [m](const absl::Status& s) {
    m->store_errors.Increment();
    fprintf(stderr, "trainwatch-server: store transaction failed: %s\n",
            std::string(s.message()).c_str());
  };
  store_options.on_fault = [m](const StoreFault& f) {
    bool cleared = f.phase == StoreFault::Phase::kCleared;
    if (!cleared) m->store_errors.Increment();  // one per failed attempt
    m->store_failing.Set(cleared || f.phase == StoreFault::Phase::kGaveUp ? 0 : 1);
    m->store_queue_depth.Set(static_cast<double>(f.waiting_ops));
    if (f.log) {
      fprintf(stderr, "trainwatch-server: %s\n", DescribeStoreFault(f).c_str());
    }
  };
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(store_options);
  if (!store.ok()) {
    return absl::Status(store.status().code(),
                        absl::StrCat("--db ", part.db, ": ",
                                     store.status().message()));
  }
  store_ = std::move(*store);
  return absl::OkStatus();
}

absl::Status Server::StartNotifier(const ServerOptions::AlertsPart& part) {
  Metrics* m = metrics_.get();
  if (!part.alertmanager_url.empty() || !part.webhook_url.empty()) {
    NotifierOptions notifier_options;
    notifier_options.alertmanager_url = part.alertmanager_url;
    notifier_options.webhook_url = part.webhook_url;
    notifier_options.resend_interval = part.resend_interval;
    absl::StatusOr<std::unique_ptr<Notifier>> notifier = Notifier::Create(
        notifier_options, Clock::Real(),
        NewCurlSender(std::chrono::seconds(10)),
        NotifierFamilies{.sent = &m->notifications_sent_total,
                         .failures = &m->notification_failures_total,
                         .dropped = &m->notifications_dropped_total});
    if (!notifier.ok()) return notifier.status();
    notifier_ = std::move(*notifier);
  }
  return absl::OkStatus();
}

absl::Status Server::StartEngineAndServices(const ServerOptions& options) {
  Metrics* m = metrics_.get();
  closed_loop_ = std::make_unique<ClosedLoop>(options.engine.health.closed_loop, store_.get(), m,
                                              Clock::Real());
  if (absl::Status s = closed_loop_->Load(); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(
      options.engine, store_.get(), m, Clock::Real(), notifier_.get(), closed_loop_.get());
  if (!engine.ok()) return engine.status();
  engine_ = std::move(*engine);

  IngestOptions ingest_options;
  ingest_options.limits = options.limits;
  // One notion of a live trainer's batch: what the engine runs first is
  // what ingest never holds back.
  ingest_options.small_batch_records = options.engine.prompt_batch_records;
  ingest_options.authorizer = authorizer_.get();
  ingest_options.closed_loop = closed_loop_.get();
  ingest_ = std::make_unique<Ingest>(ingest_options, engine_.get(), m);
  // The database's directory by default: SQLite needs it writable anyway.
  std::string backup_dir = options.store.backup_dir;
  if (backup_dir.empty()) backup_dir = std::filesystem::path(options.store.db).parent_path();
  if (backup_dir.empty()) backup_dir = ".";
  query_ = std::make_unique<Query>(store_.get(), engine_.get(), backup_dir, closed_loop_.get());
  // A backup's staging file outlives a killed server: removed here.
  absl::StatusOr<int> stale = query_->RemoveStaleBackups();
  if (!stale.ok()) return stale.status();
  if (*stale > 0) {
    std::fprintf(stderr, "trainwatch-server: removed %d backup staging file(s) a stopped server left in %s\n",
                 *stale, backup_dir.c_str());
  }
  service_ = std::make_unique<Service>(ingest_.get(), query_.get(), authorizer_.get());
  return absl::OkStatus();
}

absl::Status Server::StartGrpc(const ServerOptions& options,
                               const std::shared_ptr<grpc::ServerCredentials>& credentials) {
  Metrics* m = metrics_.get();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.grpc.listen, credentials, &grpc_port_);
  builder.RegisterService(service_.get());
  // Notice dead trainers (a half-open connection holds a stream open).
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                             static_cast<int>(options.grpc.keepalive_time.count()));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                             static_cast<int>(options.grpc.keepalive_timeout.count()));
  // Keep pinging however long a connection is idle, so that a trainer that
  // dies after a quiet spell is noticed too. gRPC 1.51's keepalive pings
  // flow without it (bad_input_test), but its documented default is 2 pings
  // without data.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.SetMaxReceiveMessageSize(options.grpc.max_receive_message_bytes);
  grpc_server_ = builder.BuildAndStart();
  if (grpc_server_ == nullptr || grpc_port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on --listen ", options.grpc.listen,
                     " (address in use or not valid?)"));
  }
  if (!options.metrics.listen.empty()) {
    // Resolve port 0 to the port the exposer bound.
    std::string host = options.metrics.listen.substr(
        0, options.metrics.listen.rfind(':'));
    metrics_address_ = absl::StrCat(host, ":", m->ListeningPort());
  }
  return absl::OkStatus();
}

Server::~Server() { Shutdown(std::chrono::seconds(10)); }

void Server::ShutdownForExit(std::chrono::milliseconds drain_timeout) {
  Shutdown(drain_timeout);
  if (store_ != nullptr) store_->CloseDatabase();
}

void Server::Shutdown(std::chrono::milliseconds drain_timeout) {
  if (shut_down_) return;
  shut_down_ = true;
  // 1. Streams ack what they submitted and end; new ones are refused.
  if (ingest_ != nullptr && !ingest_->Drain(drain_timeout)) {
    fprintf(stderr,
            "trainwatch-server: streams still open after the drain timeout\n");
  }
  // 2. Commit what is queued (a failing store gives up after its
  // close_timeout and fails the rest). Before the gRPC shutdown: that waits
  // for every stream to finish, and a stream finishes once its ops have a
  // result.
  if (store_ != nullptr) store_->Close();
  // 3. Stop the gRPC server (cancels anything left), then run the engine
  // work the last commits produced.
  if (grpc_server_ != nullptr) {
    grpc_server_->Shutdown(std::chrono::system_clock::now() +
                           std::chrono::seconds(2));
  }
  if (engine_ != nullptr) engine_->Stop();
  // 4. The engine has sent its last transition: deliver what is waiting
  // (one attempt, bounded), then stop.
  if (notifier_ != nullptr) notifier_->Stop();
}

}  // namespace trainwatch
