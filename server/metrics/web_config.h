// TLS and basic auth for /metrics (--web-config-file), in the format of the
// Prometheus exporters' web configuration file (exporter-toolkit, as
// node_exporter's --web.config.file reads it), so that a fleet's Prometheus
// scrapes its servers across machines the way it scrapes any exporter:
//
//   tls_server_config:
//     cert_file: /etc/trainwatch/metrics.pem   # PEM certificate (chain)
//     key_file: /etc/trainwatch/metrics.key    # its PEM private key
//     client_ca_file: /etc/trainwatch/ca.pem   # optional: client CAs
//     client_auth_type: RequireAndVerifyClientCert  # or VerifyClientCertIfGiven,
//                                                   # NoClientCert (default)
//   basic_auth_users:
//     prometheus: $2y$10$...                   # bcrypt hash (htpasswd -nBC 10)
//
// Either section may be absent. Keys of the toolkit this server does not
// implement (min_version, cipher_suites, http_server_config, ...) are refused
// by name rather than silently ignored.
#ifndef TRAINWATCH_SERVER_METRICS_WEB_CONFIG_H_
#define TRAINWATCH_SERVER_METRICS_WEB_CONFIG_H_

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace trainwatch {

struct WebConfig {
  // TLS is on when cert_file is set (key_file must be too).
  std::string cert_file;
  std::string key_file;
  // PEM CAs that client certificates must chain to; "" = none asked for.
  std::string client_ca_file;
  // "NoClientCert", "VerifyClientCertIfGiven" or "RequireAndVerifyClientCert".
  std::string client_auth_type = "NoClientCert";
  // user -> bcrypt hash ($2a$, $2b$ or $2y$); empty = no basic auth.
  std::map<std::string, std::string> basic_auth_users;

  bool tls() const { return !cert_file.empty(); }
};

// Reads and checks the file: YAML syntax, known keys, readable PEM files
// (a key that is not a private key, a certificate file without one), bcrypt
// hashes. Every error starts "FILE: " and says what is wrong where.
absl::StatusOr<WebConfig> LoadWebConfig(const std::string& path);

// Checks basic-auth credentials against bcrypt hashes with libcrypt's
// crypt_r. bcrypt is slow on purpose (tens of ms at cost 10), and Prometheus
// sends the same credentials on every scrape, so a check is remembered by
// the SHA-256 of user, a separator and password (the password itself is not
// kept): a success for good, a failure among the last kMaxRejected, so that
// the same wrong password sent again costs a hash, not a bcrypt.
//
// Thread-safe: Check() may be called from any thread (the exposer's).
class BasicAuthChecker {
 public:
  explicit BasicAuthChecker(std::map<std::string, std::string> users)
      : users_(std::move(users)) {}
  BasicAuthChecker(const BasicAuthChecker&) = delete;
  BasicAuthChecker& operator=(const BasicAuthChecker&) = delete;

  bool Check(const std::string& user, const std::string& password);
  // Whether these credentials were verified before (a hash, no bcrypt).
  bool Verified(const std::string& user, const std::string& password);

  static constexpr size_t kMaxRejected = 4096;

 private:
  const std::map<std::string, std::string> users_;
  absl::Mutex mu_;
  absl::flat_hash_set<std::string> verified_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> rejected_ ABSL_GUARDED_BY(mu_);
};

// Whether `hash` is a bcrypt hash crypt_r understands ("$2b$10$" + 53
// characters).
bool IsBcryptHash(const std::string& hash);

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_METRICS_WEB_CONFIG_H_
