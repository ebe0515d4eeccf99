#include "metrics/https_exposer.h"

#include <netdb.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace trainwatch {
namespace {

constexpr size_t kMaxHead = 16 << 10;
constexpr int kIoTimeoutSeconds = 10;

std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  ERR_clear_error();
  return code == 0 ? "unknown error" : text;
}

absl::StatusOr<SSL_CTX*> NewContext(const WebConfig& web) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) return absl::InternalError(OpenSslError());
  auto fail = [ctx](const std::string& what) {
    std::string message = absl::StrCat(what, ": ", OpenSslError());
    SSL_CTX_free(ctx);
    return absl::InvalidArgumentError(message);
  };
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  if (SSL_CTX_use_certificate_chain_file(ctx, web.cert_file.c_str()) != 1) {
    return fail(absl::StrCat("tls_server_config.cert_file ", web.cert_file));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, web.key_file.c_str(),
                                  SSL_FILETYPE_PEM) != 1) {
    return fail(absl::StrCat("tls_server_config.key_file ", web.key_file));
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    return fail("tls_server_config: key_file is not the key of cert_file");
  }
  if (!web.client_ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(ctx, web.client_ca_file.c_str(),
                                      nullptr) != 1) {
      return fail(absl::StrCat("tls_server_config.client_ca_file ",
                               web.client_ca_file));
    }
    int mode = SSL_VERIFY_NONE;
    if (web.client_auth_type == "RequireAndVerifyClientCert") {
      mode = SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
    } else if (web.client_auth_type == "VerifyClientCertIfGiven") {
      mode = SSL_VERIFY_PEER;
    }
    SSL_CTX_set_verify(ctx, mode, nullptr);
  }
  return ctx;
}

// A listening socket on host:port; its port through *port.
absl::StatusOr<int> Listen(const std::string& listen, int* port) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-listen ", listen, ": want HOST:PORT"));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = listen.substr(colon + 1);
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(),
                           service.c_str(), &hints, &found);
      rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics-listen ", listen, ": ", gai_strerror(rc)));
  }
  std::string error = "no address";
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 64) != 0) {
      error = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve /metrics on ", listen, ": ", error));
  }
  sockaddr_storage bound{};
  socklen_t size = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &size);
  *port = ntohs(bound.ss_family == AF_INET6
                    ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                    : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return fd;
}

std::string Response(absl::string_view status, absl::string_view extra_headers,
                     absl::string_view content_type, absl::string_view body) {
  return absl::StrCat("HTTP/1.1 ", status, "\r\n", extra_headers,
                      "Content-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(),
                      "\r\nConnection: close\r\n\r\n", body);
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpsExposer>> HttpsExposer::Start(
    const std::string& listen, const WebConfig& web,
    std::function<std::string()> body, BasicAuthChecker* auth) {
  absl::StatusOr<SSL_CTX*> ctx = NewContext(web);
  if (!ctx.ok()) return ctx.status();
  int port = 0;
  absl::StatusOr<int> fd = Listen(listen, &port);
  if (!fd.ok()) {
    SSL_CTX_free(*ctx);
    return fd.status();
  }
  const int wake = eventfd(0, EFD_CLOEXEC);
  return std::unique_ptr<HttpsExposer>(
      new HttpsExposer(*ctx, *fd, wake, port, std::move(body), auth));
}

HttpsExposer::HttpsExposer(SSL_CTX* ctx, int listen_fd, int wake_fd, int port,
                           std::function<std::string()> body,
                           BasicAuthChecker* auth)
    : ctx_(ctx),
      listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      port_(port),
      body_(std::move(body)),
      auth_(auth) {
  accept_thread_ = std::thread([this] { AcceptLoop(); });
}

HttpsExposer::~HttpsExposer() {
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) < 0) {
    // Nothing else wakes the loop; it cannot fail on an eventfd below 2^64.
  }
  accept_thread_.join();
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* open) { return *open == 0; }, &open_connections_));
  }
  close(listen_fd_);
  close(wake_fd_);
  SSL_CTX_free(ctx_);
}

void HttpsExposer::AcceptLoop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    {
      absl::MutexLock lock(&mu_);
      if (open_connections_ >= kMaxConnections) {
        close(fd);
        continue;
      }
      ++open_connections_;
    }
    std::thread([this, fd] {
      Serve(fd);
      absl::MutexLock lock(&mu_);
      --open_connections_;
    }).detach();
  }
}

void HttpsExposer::Serve(int fd) {
  const timeval timeout{kIoTimeoutSeconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  SSL* ssl = SSL_new(ctx_);
  SSL_set_fd(ssl, fd);
  if (SSL_accept(ssl) == 1) {
    std::string head;
    char buffer[4096];
    while (head.size() < kMaxHead && !absl::StrContains(head, "\r\n\r\n")) {
      const int n = SSL_read(ssl, buffer, sizeof(buffer));
      if (n <= 0) break;
      head.append(buffer, n);
    }
    if (absl::StrContains(head, "\r\n\r\n")) {
      const std::string response = Respond(head);
      size_t sent = 0;
      while (sent < response.size()) {
        const int n = SSL_write(ssl, response.data() + sent,
                                static_cast<int>(response.size() - sent));
        if (n <= 0) break;
        sent += n;
      }
      SSL_shutdown(ssl);
    }
  }
  ERR_clear_error();
  SSL_free(ssl);
  close(fd);
}

std::string HttpsExposer::Respond(const std::string& head) {
  const absl::string_view header_block =
      absl::string_view(head).substr(0, head.find("\r\n\r\n"));
  std::vector<absl::string_view> lines = absl::StrSplit(header_block, "\r\n");
  std::vector<absl::string_view> request = absl::StrSplit(lines[0], ' ');
  if (request.size() != 3 || request[0] != "GET") {
    return Response("405 Method Not Allowed", "Allow: GET\r\n", "text/plain",
                    "only GET /metrics\n");
  }
  const absl::string_view path = request[1].substr(0, request[1].find('?'));
  if (path != "/metrics") {
    return Response("404 Not Found", "", "text/plain", "see /metrics\n");
  }
  if (auth_ != nullptr) {
    bool ok = false;
    for (size_t i = 1; i < lines.size() && !ok; ++i) {
      absl::string_view line = lines[i];
      const size_t colon = line.find(':');
      if (colon == absl::string_view::npos ||
          !absl::EqualsIgnoreCase(line.substr(0, colon), "authorization")) {
        continue;
      }
      absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
      std::string decoded;
      if (!absl::ConsumePrefix(&value, "Basic ") ||
          !absl::Base64Unescape(absl::StripAsciiWhitespace(value), &decoded)) {
        continue;
      }
      const size_t sep = decoded.find(':');
      if (sep == std::string::npos) continue;
      ok = auth_->Check(decoded.substr(0, sep), decoded.substr(sep + 1));
    }
    if (!ok) {
      return Response("401 Unauthorized",
                      "WWW-Authenticate: Basic realm=\"trainwatch\"\r\n",
                      "text/plain", "401 Unauthorized\n");
    }
  }
  return Response("200 OK", "", "text/plain; version=0.0.4; charset=utf-8",
                  body_());
}

}  // namespace trainwatch
