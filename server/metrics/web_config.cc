#include "metrics/web_config.h"

#include <crypt.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainwatch {
namespace {

constexpr char kAuthTypes[][32] = {"NoClientCert", "VerifyClientCertIfGiven",
                                   "RequireAndVerifyClientCert"};

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};

// "" when `path` holds at least one PEM certificate (or, with `key`, a
// private key), else what is wrong.
std::string CheckPem(const std::string& path, bool key) {
  std::unique_ptr<FILE, FileCloser> f(std::fopen(path.c_str(), "r"));
  if (f == nullptr) return absl::StrCat("cannot read ", path, ": ", std::strerror(errno));
  if (key) {
    EVP_PKEY* pkey = PEM_read_PrivateKey(f.get(), nullptr, nullptr, nullptr);
    if (pkey == nullptr) return absl::StrCat(path, " holds no PEM private key");
    EVP_PKEY_free(pkey);
    return "";
  }
  X509* cert = PEM_read_X509(f.get(), nullptr, nullptr, nullptr);
  if (cert == nullptr) return absl::StrCat(path, " holds no PEM certificate");
  X509_free(cert);
  return "";
}

std::string Sha256(const std::string& text) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(text.data(), text.size(), digest, &size, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<const char*>(digest), size);
}

}  // namespace

bool IsBcryptHash(const std::string& hash) {
  // $2b$NN$ + 22 characters of salt + 31 of hash.
  if (hash.size() != 60 || hash[0] != '$' || hash[1] != '2' || hash[3] != '$' ||
      hash[6] != '$') {
    return false;
  }
  if (hash[2] != 'a' && hash[2] != 'b' && hash[2] != 'y') return false;
  for (size_t i = 7; i < hash.size(); ++i) {
    const char c = hash[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '.' || c == '/')) {
      return false;
    }
  }
  const int cost = (hash[4] - '0') * 10 + (hash[5] - '0');
  return hash[4] >= '0' && hash[4] <= '9' && hash[5] >= '0' &&
         hash[5] <= '9' && cost >= 4 && cost <= 31;
}

absl::StatusOr<WebConfig> LoadWebConfig(const std::string& path) {
  auto error = [&path](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", parts...));
  };
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot read: ", std::strerror(errno)));
  } catch (const YAML::Exception& e) {
    return error("not valid YAML: ", e.what());
  }
  WebConfig config;
  if (root.IsNull()) return config;  // an empty file: plain HTTP, no auth
  if (!root.IsMap()) return error("want a mapping at the top level");
  for (const auto& entry : root) {
    const std::string key = entry.first.as<std::string>();
    const YAML::Node& value = entry.second;
    if (key == "tls_server_config") {
      if (value.IsNull()) continue;
      if (!value.IsMap()) return error("tls_server_config: want a mapping");
      for (const auto& tls : value) {
        const std::string name = tls.first.as<std::string>();
        if (!tls.second.IsScalar()) {
          return error("tls_server_config.", name, ": want a string");
        }
        const std::string text = tls.second.as<std::string>();
        if (name == "cert_file") {
          config.cert_file = text;
        } else if (name == "key_file") {
          config.key_file = text;
        } else if (name == "client_ca_file") {
          config.client_ca_file = text;
        } else if (name == "client_auth_type") {
          config.client_auth_type = text;
        } else {
          return error("tls_server_config.", name,
                       ": not supported by trainwatch-server (it reads "
                       "cert_file, key_file, client_ca_file, "
                       "client_auth_type)");
        }
      }
    } else if (key == "basic_auth_users") {
      if (value.IsNull()) continue;
      if (!value.IsMap()) return error("basic_auth_users: want a mapping");
      for (const auto& user : value) {
        const std::string name = user.first.as<std::string>();
        const std::string hash =
            user.second.IsScalar() ? user.second.as<std::string>() : "";
        if (name.empty() || name.find(':') != std::string::npos) {
          return error("basic_auth_users: user \"", name,
                       "\": empty or has a ':'");
        }
        if (!IsBcryptHash(hash)) {
          return error("basic_auth_users.", name,
                       ": want a bcrypt hash ($2y$10$ and 53 characters, as "
                       "`htpasswd -nbBC 10 USER PASSWORD` prints after the "
                       "colon), not a plain password");
        }
        config.basic_auth_users[name] = hash;
      }
    } else {
      return error(key,
                   ": not supported by trainwatch-server (it reads "
                   "tls_server_config and basic_auth_users)");
    }
  }

  if (config.cert_file.empty() != config.key_file.empty()) {
    return error("tls_server_config: cert_file and key_file go together");
  }
  if (!config.tls() && (!config.client_ca_file.empty() ||
                        config.client_auth_type != "NoClientCert")) {
    return error("tls_server_config: client certificates need cert_file and "
                 "key_file");
  }
  bool known_type = false;
  for (const char* type : kAuthTypes) known_type |= config.client_auth_type == type;
  if (!known_type) {
    return error("tls_server_config.client_auth_type: \"",
                 config.client_auth_type, "\" is not one of ",
                 absl::StrJoin(kAuthTypes, ", ",
                               [](std::string* out, const char* s) {
                                 out->append(s);
                               }));
  }
  if (config.client_auth_type != "NoClientCert" &&
      config.client_ca_file.empty()) {
    return error("tls_server_config.client_auth_type ",
                 config.client_auth_type, " needs client_ca_file");
  }
  if (config.tls()) {
    for (const auto& [field, file, key] :
         {std::tuple{"cert_file", config.cert_file, false},
          std::tuple{"key_file", config.key_file, true},
          std::tuple{"client_ca_file", config.client_ca_file, false}}) {
      if (file.empty()) continue;
      if (std::string what = CheckPem(file, key); !what.empty()) {
        return error("tls_server_config.", field, ": ", what);
      }
    }
  }
  return config;
}

bool BasicAuthChecker::Verified(const std::string& user,
                                const std::string& password) {
  const std::string key = Sha256(absl::StrCat(user, ":", password));
  absl::MutexLock lock(&mu_);
  return verified_.contains(key);
}

bool BasicAuthChecker::Check(const std::string& user,
                             const std::string& password) {
  auto it = users_.find(user);
  if (it == users_.end()) return false;
  // The separator keeps ("a", "b:c") and ("a:b", "c") apart; user names
  // cannot hold it.
  const std::string key = Sha256(absl::StrCat(user, ":", password));
  {
    absl::MutexLock lock(&mu_);
    if (verified_.contains(key)) return true;
    if (rejected_.contains(key)) return false;
  }
  // crypt_r stops at a NUL: "secret\0anything" would pass as "secret".
  if (password.find('\0') != std::string::npos) return false;
  crypt_data data;
  std::memset(&data, 0, sizeof(data));
  const char* hashed = crypt_r(password.c_str(), it->second.c_str(), &data);
  // crypt_r returns a string starting "*" on failure, never the hash.
  if (hashed == nullptr || std::strlen(hashed) != it->second.size() ||
      CRYPTO_memcmp(hashed, it->second.data(), it->second.size()) != 0) {
    absl::MutexLock lock(&mu_);
    if (rejected_.size() >= kMaxRejected) rejected_.clear();
    rejected_.insert(key);
    return false;
  }
  absl::MutexLock lock(&mu_);
  verified_.insert(key);
  return true;
}

}  // namespace trainwatch
