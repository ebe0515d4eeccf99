// The server's TLS files (--tls-cert, --tls-key, --tls-client-ca): read and
// checked at start-up so that a wrong file fails with a message naming it,
// rather than as a handshake error on every connection later.
#ifndef TRAINWATCH_SERVER_AUTH_TLS_FILES_H_
#define TRAINWATCH_SERVER_AUTH_TLS_FILES_H_

#include <string>

#include "absl/status/statusor.h"

namespace trainwatch {

struct TlsFiles {
  // PEM certificate chain (the server's certificate first) and its key.
  std::string cert_file;
  std::string key_file;
  // PEM CA certificates; set: clients must present a certificate they signed.
  std::string client_ca_file;
};

// The PEM text of the files.
struct TlsPem {
  std::string cert_chain;
  std::string private_key;
  std::string client_ca;  // "" without client_ca_file
};

// Reads the files and checks that the certificate and key parse and belong
// together, and that the client CA file holds at least one certificate.
// INVALID_ARGUMENT or NOT_FOUND naming the flag and the file otherwise.
// `*warning` is set (else cleared) when the certificate is expired or not yet
// valid, or the key file is accessible to others.
absl::StatusOr<TlsPem> LoadTlsFiles(const TlsFiles& files,
                                    std::string* warning);

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_AUTH_TLS_FILES_H_
