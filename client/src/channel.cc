#include "trainwatch/channel.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace trainwatch {
namespace {

// The PEM text of `path`; `what` names the file in errors.
absl::StatusOr<std::string> ReadPem(absl::string_view what,
                                    const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(what, " ", path, ": cannot read: ",
                                            std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (!absl::StrContains(text.str(), "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, ": no PEM data (-----BEGIN ...)"));
  }
  return text.str();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> NewChannelCredentials(
    const ConnectionSecurity& security) {
  for (char c : security.auth_token) {
    if (c <= ' ' || c >= 0x7f) {
      return absl::InvalidArgumentError(
          "the auth token has a space or a character that is not printable "
          "ASCII (a stray newline from the token file?)");
    }
  }
  if (!security.tls_on()) return grpc::InsecureChannelCredentials();
  if (security.tls_cert_file.empty() != security.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "a TLS client certificate and its key go together: give both or "
        "neither");
  }
  grpc::SslCredentialsOptions ssl;
  if (!security.tls_ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadPem("TLS CA file", security.tls_ca_file);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
  }
  if (!security.tls_cert_file.empty()) {
    absl::StatusOr<std::string> cert =
        ReadPem("TLS client certificate", security.tls_cert_file);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key =
        ReadPem("TLS client key", security.tls_key_file);
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *std::move(cert);
    ssl.pem_private_key = *std::move(key);
  }
  return grpc::SslCredentials(ssl);
}

void AddAuthToken(const ConnectionSecurity& security,
                  grpc::ClientContext* context) {
  if (security.auth_token.empty()) return;
  context->AddMetadata("authorization",
                       absl::StrCat("Bearer ", security.auth_token));
}

void AddRunHeader(const std::string& run_id, grpc::ClientContext* context) {
  // A value gRPC would refuse as metadata is not a valid run id either: the
  // server refuses its RunStart, which says why better than a failed call.
  if (run_id.empty()) return;
  for (char c : run_id) {
    if (c < ' ' || c >= 0x7f) return;
  }
  context->AddMetadata(kRunHeader, run_id);
}

}  // namespace trainwatch
