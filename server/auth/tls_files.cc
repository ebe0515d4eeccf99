#include "auth/tls_files.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/strings/str_cat.h"

namespace trainwatch {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyFree>;

absl::StatusOr<std::string> ReadFile(absl::string_view flag,
                                     const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(flag, " ", path, ": cannot read: ",
                                            std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// OpenSSL's reason for the last failure, and clears its error queue.
std::string OpenSslError() {
  unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no PEM data found";
  char buf[256];
  ERR_error_string_n(code, buf, sizeof(buf));
  return buf;
}

BioPtr MemBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// Every certificate in `pem`, or an error naming the file.
absl::StatusOr<std::vector<X509Ptr>> ParseCertificates(
    absl::string_view flag, const std::string& path, const std::string& pem) {
  BioPtr bio = MemBio(pem);
  std::vector<X509Ptr> certs;
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    certs.emplace_back(x);
  }
  ERR_clear_error();  // the read that ended the loop
  if (certs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, " ", path, ": no PEM certificate (-----BEGIN CERTIFICATE-----)"));
  }
  return certs;
}

}  // namespace

absl::StatusOr<TlsPem> LoadTlsFiles(const TlsFiles& files,
                                    std::string* warning) {
  warning->clear();
  TlsPem pem;
  absl::StatusOr<std::string> text = ReadFile("--tls-cert", files.cert_file);
  if (!text.ok()) return text.status();
  pem.cert_chain = *std::move(text);
  text = ReadFile("--tls-key", files.key_file);
  if (!text.ok()) return text.status();
  pem.private_key = *std::move(text);
  if (!files.client_ca_file.empty()) {
    text = ReadFile("--tls-client-ca", files.client_ca_file);
    if (!text.ok()) return text.status();
    pem.client_ca = *std::move(text);
  }

  absl::StatusOr<std::vector<X509Ptr>> chain =
      ParseCertificates("--tls-cert", files.cert_file, pem.cert_chain);
  if (!chain.ok()) return chain.status();
  BioPtr key_bio = MemBio(pem.private_key);
  KeyPtr key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-key ", files.key_file,
                     ": not an unencrypted PEM private key: ", OpenSslError()));
  }
  X509* leaf = (*chain)[0].get();
  if (X509_check_private_key(leaf, key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-key ", files.key_file,
                     " is not the key of the certificate in --tls-cert ",
                     files.cert_file));
  }
  if (!files.client_ca_file.empty()) {
    absl::StatusOr<std::vector<X509Ptr>> ca = ParseCertificates(
        "--tls-client-ca", files.client_ca_file, pem.client_ca);
    if (!ca.ok()) return ca.status();
  }

  if (X509_cmp_current_time(X509_get0_notAfter(leaf)) < 0) {
    *warning = absl::StrCat("the certificate in --tls-cert ", files.cert_file,
                            " has expired; clients will refuse it");
  } else if (X509_cmp_current_time(X509_get0_notBefore(leaf)) > 0) {
    *warning = absl::StrCat("the certificate in --tls-cert ", files.cert_file,
                            " is not valid yet; clients will refuse it");
  }
  struct stat st;
  if (stat(files.key_file.c_str(), &st) == 0 &&
      (st.st_mode & S_IRWXO)) {
    absl::StrAppend(warning, warning->empty() ? "" : "; ", "--tls-key ",
                    files.key_file, " is readable by others; chmod o-rwx it");
  }
  return pem;
}

}  // namespace trainwatch
