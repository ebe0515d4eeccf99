#include "metrics/http_exposer.h"

#include <arpa/inet.h>
#include <gnutls/gnutls.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace trainwatch {
namespace {

using Clock = std::chrono::steady_clock;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot read"));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
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
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-listen ", listen, ": ", gai_strerror(rc)));
  }
  std::string error = "no address";
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 256) != 0) {
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

std::string AddressOf(const sockaddr* a) {
  char buf[INET6_ADDRSTRLEN] = "";
  if (a == nullptr) return "";
  if (a->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a)->sin_addr, buf,
              sizeof(buf));
  } else if (a->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr, buf,
              sizeof(buf));
  }
  return buf;
}

// One open connection, for the whole-request deadline.
struct Conn {
  int fd = -1;
  Clock::time_point since;  // its first byte, or the end of its last request
  bool cut = false;
};

// Failed basic-auth attempts per client address.
class FailureLimiter {
 public:
  FailureLimiter(unsigned max_failures, std::chrono::milliseconds window)
      : max_(max_failures), window_(window) {}

  bool Blocked(const std::string& address) {
    absl::MutexLock lock(&mu_);
    auto it = by_address_.find(address);
    return it != by_address_.end() && Clock::now() < it->second.blocked_until;
  }
  void Failed(const std::string& address) {
    const Clock::time_point now = Clock::now();
    absl::MutexLock lock(&mu_);
    if (by_address_.size() > 100'000) by_address_.clear();  // a bound, not LRU
    Entry& e = by_address_[address];
    if (now - e.window_start > window_) {
      e.window_start = now;
      e.failures = 0;
    }
    if (++e.failures >= max_) e.blocked_until = now + window_;
  }

 private:
  struct Entry {
    Clock::time_point window_start;
    unsigned failures = 0;
    Clock::time_point blocked_until;
  };
  const unsigned max_;
  const std::chrono::milliseconds window_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> by_address_ ABSL_GUARDED_BY(mu_);
};

MHD_Result Send(MHD_Connection* c, unsigned status, absl::string_view body,
                const char* content_type = "text/plain; charset=utf-8",
                std::initializer_list<std::pair<const char*, const char*>> headers = {}) {
  MHD_Response* r = MHD_create_response_from_buffer(
      body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  if (r == nullptr) return MHD_NO;
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  for (const auto& [k, v] : headers) MHD_add_response_header(r, k, v);
  const MHD_Result ok = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ok;
}

}  // namespace

struct HttpExposer::Impl {
  explicit Impl(HttpExposerOptions o)
      : options(std::move(o)), failures(options.max_failures, options.failure_window) {}

  HttpExposerOptions options;
  std::string cert, key, trust;  // PEM, alive as long as the daemon
  int listen_fd = -1;
  int port = 0;
  MHD_Daemon* daemon = nullptr;
  FailureLimiter failures;

  absl::Mutex mu;
  absl::flat_hash_map<MHD_Connection*, Conn> conns ABSL_GUARDED_BY(mu);
  std::atomic<bool> stop{false};
  std::thread watchdog;

  ~Impl() {
    stop = true;
    if (watchdog.joinable()) watchdog.join();
    if (daemon != nullptr) MHD_stop_daemon(daemon);
    if (listen_fd >= 0) close(listen_fd);
  }

  // Cuts connections past the whole-request deadline: shutting the socket
  // down makes libmicrohttpd's event loop see the end and close it.
  void Watch() {
    while (!stop) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const Clock::time_point now = Clock::now();
      absl::MutexLock lock(&mu);
      for (auto& [c, conn] : conns) {
        if (!conn.cut && now - conn.since > options.request_deadline) {
          shutdown(conn.fd, SHUT_RDWR);
          conn.cut = true;
        }
      }
    }
  }

  static void OnConnection(void* cls, MHD_Connection* c, void** socket_context,
                           MHD_ConnectionNotificationCode code) {
    auto* self = static_cast<Impl*>(cls);
    absl::MutexLock lock(&self->mu);
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
      const MHD_ConnectionInfo* info =
          MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
      if (info != nullptr) {
        self->conns[c] = Conn{.fd = info->connect_fd, .since = Clock::now()};
      }
    } else {
      // Before libmicrohttpd closes the socket: the watchdog never shuts
      // down a descriptor that was reused.
      self->conns.erase(c);
    }
  }

  static void OnCompleted(void* cls, MHD_Connection* c, void** con_cls,
                          MHD_RequestTerminationCode) {
    auto* self = static_cast<Impl*>(cls);
    absl::MutexLock lock(&self->mu);
    auto it = self->conns.find(c);
    if (it != self->conns.end()) it->second.since = Clock::now();  // keep-alive
  }

  // The client certificate, as client_auth_type asks.
  bool ClientCertOk(MHD_Connection* c) const {
    const std::string& type = options.web.client_auth_type;
    if (!options.web.tls() || type == "NoClientCert") return true;
    const MHD_ConnectionInfo* info =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    if (info == nullptr || info->tls_session == nullptr) return false;
    auto session = static_cast<gnutls_session_t>(info->tls_session);
    unsigned int listed = 0;
    if (gnutls_certificate_get_peers(session, &listed) == nullptr || listed == 0) {
      return type == "VerifyClientCertIfGiven";
    }
    unsigned int status = 0;
    return gnutls_certificate_verify_peers2(session, &status) == GNUTLS_E_SUCCESS &&
           status == 0;
  }

  MHD_Result Handle(MHD_Connection* c, const char* url, const char* method,
                    void** con_cls) {
    if (*con_cls == nullptr) {  // the head is in; the (empty) body next
      *con_cls = this;
      return MHD_YES;
    }
    if (!ClientCertOk(c)) return MHD_NO;  // closes the connection
    if (std::strcmp(method, "GET") != 0 && std::strcmp(method, "HEAD") != 0) {
      return Send(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET /metrics\n",
                  "text/plain; charset=utf-8", {{MHD_HTTP_HEADER_ALLOW, "GET"}});
    }
    if (std::strcmp(url, "/metrics") != 0) {
      return Send(c, MHD_HTTP_NOT_FOUND, "see /metrics\n");
    }
    if (options.auth != nullptr) {
      const MHD_ConnectionInfo* info =
          MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
      const std::string address = AddressOf(info != nullptr ? info->client_addr : nullptr);
      const std::optional<Credentials> creds = CredentialsOf(c);
      // Credentials verified before pass at the cost of a hash, even from an
      // address that is flooding: Prometheus on the same host still scrapes.
      const bool known = creds.has_value() && options.auth->Verified(creds->user, creds->password);
      if (!known && failures.Blocked(address)) {
        return Send(c, MHD_HTTP_TOO_MANY_REQUESTS,
                    "too many failed logins from this address; retry later\n",
                    "text/plain; charset=utf-8", {{"Retry-After", "10"}});
      }
      if (!known && (!creds.has_value() ||
                     !options.auth->Check(creds->user, creds->password))) {
        failures.Failed(address);
        return Send(c, MHD_HTTP_UNAUTHORIZED, "401 Unauthorized\n",
                    "text/plain; charset=utf-8",
                    {{MHD_HTTP_HEADER_WWW_AUTHENTICATE,
                      "Basic realm=\"trainwatch\", charset=\"UTF-8\""}});
      }
    }
    return Send(c, MHD_HTTP_OK, options.body(),
                "text/plain; version=0.0.4; charset=utf-8");
  }

  struct Credentials {
    std::string user, password;
  };
  // RFC 7617 basic auth: the scheme in any case; user:password in base64;
  // a NUL byte anywhere is refused (crypt_r would stop at it).
  static std::optional<Credentials> CredentialsOf(MHD_Connection* c) {
    const char* header =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (header == nullptr) return std::nullopt;
    absl::string_view value = absl::StripAsciiWhitespace(header);
    const size_t space = value.find(' ');
    if (space == absl::string_view::npos ||
        !absl::EqualsIgnoreCase(value.substr(0, space), "basic")) {
      return std::nullopt;
    }
    std::string decoded;
    if (!absl::Base64Unescape(absl::StripAsciiWhitespace(value.substr(space + 1)),
                              &decoded) ||
        decoded.find('\0') != std::string::npos) {
      return std::nullopt;
    }
    const size_t sep = decoded.find(':');
    if (sep == std::string::npos) return std::nullopt;
    return Credentials{decoded.substr(0, sep), decoded.substr(sep + 1)};
  }

  static MHD_Result OnRequest(void* cls, MHD_Connection* c, const char* url,
                              const char* method, const char* version,
                              const char* upload_data, size_t* upload_data_size,
                              void** con_cls) {
    auto* self = static_cast<Impl*>(cls);
    if (*con_cls != nullptr && *upload_data_size != 0) {
      *upload_data_size = 0;  // a body is not read, only drained
      return MHD_YES;
    }
    return self->Handle(c, url, method, con_cls);
  }
};

absl::StatusOr<std::unique_ptr<HttpExposer>> HttpExposer::Start(
    HttpExposerOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  const HttpExposerOptions& o = impl->options;
  absl::StatusOr<int> fd = Listen(o.listen, &impl->port);
  if (!fd.ok()) return fd.status();
  impl->listen_fd = *fd;
  unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
  if (o.web.tls()) {
    for (auto [path, out] : {std::pair{o.web.cert_file, &impl->cert},
                             std::pair{o.web.key_file, &impl->key},
                             std::pair{o.web.client_ca_file, &impl->trust}}) {
      if (path.empty()) continue;
      absl::StatusOr<std::string> text = ReadFile(path);
      if (!text.ok()) return text.status();
      *out = *std::move(text);
    }
    flags |= MHD_USE_TLS;
  }
  std::vector<MHD_OptionItem> opts = {
      {MHD_OPTION_LISTEN_SOCKET, impl->listen_fd, nullptr},
      {MHD_OPTION_THREAD_POOL_SIZE, o.threads, nullptr},
      {MHD_OPTION_CONNECTION_LIMIT, o.max_connections, nullptr},
      {MHD_OPTION_PER_IP_CONNECTION_LIMIT, o.max_connections_per_address, nullptr},
      {MHD_OPTION_CONNECTION_TIMEOUT, o.idle_timeout_seconds, nullptr},
      // The head must fit the connection's buffer; past it, 431.
      {MHD_OPTION_CONNECTION_MEMORY_LIMIT, static_cast<intptr_t>(o.max_request_bytes),
       nullptr},
      {MHD_OPTION_NOTIFY_CONNECTION, reinterpret_cast<intptr_t>(&Impl::OnConnection),
       impl.get()},
      {MHD_OPTION_NOTIFY_COMPLETED, reinterpret_cast<intptr_t>(&Impl::OnCompleted),
       impl.get()},
  };
  if (o.web.tls()) {
    opts.push_back({MHD_OPTION_HTTPS_MEM_CERT, 0, const_cast<char*>(impl->cert.c_str())});
    opts.push_back({MHD_OPTION_HTTPS_MEM_KEY, 0, const_cast<char*>(impl->key.c_str())});
    if (!impl->trust.empty()) {
      opts.push_back({MHD_OPTION_HTTPS_MEM_TRUST, 0, const_cast<char*>(impl->trust.c_str())});
    }
  }
  opts.push_back({MHD_OPTION_END, 0, nullptr});
  impl->daemon = MHD_start_daemon(flags, 0, nullptr, nullptr, &Impl::OnRequest,
                                  impl.get(), MHD_OPTION_ARRAY, opts.data(),
                                  MHD_OPTION_END);
  if (impl->daemon == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve /metrics on ", o.listen,
        o.web.tls() ? ": libmicrohttpd refused the TLS settings (certificate, key "
                      "or client CA)"
                    : ": libmicrohttpd did not start"));
  }
  Impl* raw = impl.get();
  impl->watchdog = std::thread([raw] { raw->Watch(); });
  return std::unique_ptr<HttpExposer>(new HttpExposer(std::move(impl)));
}

HttpExposer::HttpExposer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpExposer::~HttpExposer() = default;
int HttpExposer::port() const { return impl_->port; }

}  // namespace trainwatch
