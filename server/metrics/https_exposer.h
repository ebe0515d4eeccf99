// /metrics over HTTPS (--web-config-file with tls_server_config). Not
// prometheus-cpp's exposer: its civetweb (Debian's 1.15) loads OpenSSL at run
// time and calls SSL_get_peer_certificate on every TLS connection, a function
// OpenSSL 3 no longer exports, so its TLS crashes on the first scrape. This
// is a deliberately small HTTP/1.1 server for one purpose: a GET of /metrics,
// one request per connection (Connection: close), answered with the text
// exposition, 401 without valid basic-auth credentials, 404 elsewhere.
#ifndef TRAINWATCH_SERVER_METRICS_HTTPS_EXPOSER_H_
#define TRAINWATCH_SERVER_METRICS_HTTPS_EXPOSER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "metrics/web_config.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace trainwatch {

// Thread-safe. One accept thread; each connection is served on its own
// thread, at most kMaxConnections at once (more are closed at once), each
// read and write bounded by a 10 s timeout.
class HttpsExposer {
 public:
  // Listens on `listen` (host:port; port 0 picks one) with the certificate,
  // key and client-CA settings of `web`. `body` renders the exposition;
  // `auth`, when not null, must accept the request's basic-auth credentials
  // (borrowed: it outlives the exposer).
  static absl::StatusOr<std::unique_ptr<HttpsExposer>> Start(
      const std::string& listen, const WebConfig& web,
      std::function<std::string()> body, BasicAuthChecker* auth);
  ~HttpsExposer();  // stops accepting and waits for open connections
  HttpsExposer(const HttpsExposer&) = delete;
  HttpsExposer& operator=(const HttpsExposer&) = delete;

  int port() const { return port_; }

 private:
  static constexpr int kMaxConnections = 16;

  HttpsExposer(SSL_CTX* ctx, int listen_fd, int wake_fd, int port,
               std::function<std::string()> body, BasicAuthChecker* auth);
  void AcceptLoop();
  void Serve(int fd);
  // The status line, headers and body for one request's head.
  std::string Respond(const std::string& head);

  SSL_CTX* const ctx_;
  const int listen_fd_;
  const int wake_fd_;  // an eventfd: written once to stop the accept loop
  const int port_;
  const std::function<std::string()> body_;
  BasicAuthChecker* const auth_;
  std::thread accept_thread_;

  absl::Mutex mu_;
  int open_connections_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_METRICS_HTTPS_EXPOSER_H_
