// --web-config-file (metrics/web_config.h): what the exporters' format
// accepts and how each mistake is reported, and bcrypt checks with libcrypt.
#include "metrics/web_config.h"

#include <crypt.h>

#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainwatch {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Write(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

// A bcrypt hash of `password` at the lowest cost, from libcrypt.
std::string Bcrypt(const std::string& password) {
  char salt[CRYPT_GENSALT_OUTPUT_SIZE];
  EXPECT_NE(crypt_gensalt_rn("$2b$", 4, nullptr, 0, salt, sizeof(salt)),
            nullptr);
  crypt_data data{};
  return crypt_r(password.c_str(), salt, &data);
}

TEST(WebConfig, ReadsBasicAuthUsers) {
  const std::string hash = Bcrypt("pw");
  absl::StatusOr<WebConfig> config = LoadWebConfig(
      Write("users.yml", "basic_auth_users:\n  prometheus: " + hash + "\n"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->tls());
  EXPECT_EQ(config->basic_auth_users.at("prometheus"), hash);
}

TEST(WebConfig, EmptyFileMeansPlainHttp) {
  absl::StatusOr<WebConfig> config = LoadWebConfig(Write("empty.yml", ""));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->tls());
  EXPECT_TRUE(config->basic_auth_users.empty());
}

TEST(WebConfig, ErrorsNameTheFileAndWhatIsWrong) {
  struct Case {
    std::string text;
    std::string message;
  };
  const Case cases[] = {
      {"basic_auth_users:\n  prometheus: hunter2\n",
       "basic_auth_users.prometheus: want a bcrypt hash"},
      {"basic_auth_users: [a, b]\n", "basic_auth_users: want a mapping"},
      {"web_server_config: {}\n", "web_server_config: not supported"},
      {"tls_server_config:\n  cert_file: /x.pem\n",
       "cert_file and key_file go together"},
      {"tls_server_config:\n  cipher_suites: [A]\n",
       "tls_server_config.cipher_suites: want a string"},
      {"tls_server_config:\n  min_version: TLS13\n",
       "tls_server_config.min_version: not supported"},
      {"tls_server_config:\n  cert_file: /nonexistent.pem\n  key_file: "
       "/nonexistent.key\n",
       "tls_server_config.cert_file: cannot read /nonexistent.pem"},
      {"tls_server_config:\n  client_ca_file: /ca.pem\n",
       "client certificates need cert_file and key_file"},
      {"[1, 2]\n", "want a mapping at the top level"},
      {"a: [\n", "not valid YAML"},
  };
  int i = 0;
  for (const Case& c : cases) {
    const std::string path = Write("bad" + std::to_string(i++) + ".yml", c.text);
    absl::StatusOr<WebConfig> config = LoadWebConfig(path);
    ASSERT_FALSE(config.ok()) << c.text;
    EXPECT_THAT(std::string(config.status().message()), StartsWith(path + ": ")) << c.text;
    EXPECT_THAT(std::string(config.status().message()), HasSubstr(c.message)) << c.text;
  }
  absl::StatusOr<WebConfig> missing = LoadWebConfig("/nonexistent/web.yml");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()),
              StartsWith("/nonexistent/web.yml: cannot read"));
}

TEST(BasicAuthChecker, AcceptsTheRightPasswordOnly) {
  BasicAuthChecker checker({{"prometheus", Bcrypt("right")}});
  EXPECT_TRUE(checker.Check("prometheus", "right"));
  EXPECT_TRUE(checker.Check("prometheus", "right"));  // cached
  EXPECT_FALSE(checker.Check("prometheus", "wrong"));
  EXPECT_FALSE(checker.Check("prometheus", ""));
  EXPECT_FALSE(checker.Check("other", "right"));
  // A success for one user is not one for another with the same password.
  BasicAuthChecker two({{"a", Bcrypt("pw")}, {"b", Bcrypt("other")}});
  EXPECT_TRUE(two.Check("a", "pw"));
  EXPECT_FALSE(two.Check("b", "pw"));
}

TEST(IsBcryptHash, Shapes) {
  EXPECT_TRUE(IsBcryptHash(Bcrypt("x")));
  EXPECT_TRUE(IsBcryptHash(
      "$2y$10$yy.eK1Kdt.MGumGlT2bFDuyDKMndUxcRdCqmuBmUtBT7/Q7MeqF42"));
  EXPECT_FALSE(IsBcryptHash("$1$abc$def"));
  EXPECT_FALSE(IsBcryptHash(
      "$2y$99$yy.eK1Kdt.MGumGlT2bFDuyDKMndUxcRdCqmuBmUtBT7/Q7MeqF42"));
  EXPECT_FALSE(IsBcryptHash("plain"));
}

}  // namespace
}  // namespace trainwatch
