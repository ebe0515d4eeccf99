// /metrics over HTTP or HTTPS (--web-config-file: TLS, client certificates,
// basic auth), served by libmicrohttpd's epoll event loop, so that idle or
// slow connections, however many, cost a file descriptor and never keep a
// scrape from being answered (docs/security.md, "Exposed edges"):
//  - a deadline for the whole request (request_deadline, from the first byte
//    of a connection or the end of its previous request), besides
//    libmicrohttpd's idle timeout: a client sending a byte a second is cut;
//  - at most max_connections_per_address connections per client address,
//    and max_connections in all;
//  - a request head over max_request_bytes gets 431, a malformed one 400,
//    each with a status line;
//  - basic auth (RFC 7617: the scheme is case-insensitive; credentials with
//    a NUL byte are refused), with failed attempts limited per address: past
//    max_failures within failure_window, the address gets 429 without a
//    password check for failure_window, so a password flood costs little.
//
// Thread-safe: libmicrohttpd's threads call the handler; Start and the
// destructor run on the caller's thread.
#ifndef TRAINWATCH_SERVER_METRICS_HTTP_EXPOSER_H_
#define TRAINWATCH_SERVER_METRICS_HTTP_EXPOSER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "metrics/web_config.h"

namespace trainwatch {

struct HttpExposerOptions {
  // host:port; port 0 picks one.
  std::string listen;
  // TLS (cert_file set) and client certificates; basic auth is `auth`.
  WebConfig web;
  // Renders the exposition (called on libmicrohttpd's threads).
  std::function<std::string()> body;
  // When not null, requests need credentials it accepts. Borrowed: outlives
  // the exposer.
  BasicAuthChecker* auth = nullptr;
  std::chrono::milliseconds request_deadline{10'000};
  unsigned idle_timeout_seconds = 10;
  unsigned max_connections = 2048;
  unsigned max_connections_per_address = 256;
  size_t max_request_bytes = 16 * 1024;
  unsigned max_failures = 10;
  std::chrono::milliseconds failure_window{10'000};
  // Event-loop threads (each with its own epoll set).
  unsigned threads = 2;
};

class HttpExposer {
 public:
  static absl::StatusOr<std::unique_ptr<HttpExposer>> Start(HttpExposerOptions options);
  ~HttpExposer();  // stops serving; open connections are closed
  HttpExposer(const HttpExposer&) = delete;
  HttpExposer& operator=(const HttpExposer&) = delete;

  int port() const;

  struct Impl;

 private:
  explicit HttpExposer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_METRICS_HTTP_EXPOSER_H_
