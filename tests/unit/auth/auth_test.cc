// The token file format, token checks and scopes (server/auth), and the
// server's TLS file checks.
#include "auth/auth.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "auth/tls_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainwatch {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kWriter[] = "writer-token-0123456789";
constexpr char kReader[] = "reader-token-0123456789";
constexpr char kBoth[] = "both-token-0123456789ab";

std::string Bearer(const std::string& token) { return "Bearer " + token; }

std::unique_ptr<Authorizer> Standard() {
  absl::StatusOr<std::unique_ptr<Authorizer>> auth = Authorizer::Parse(
      std::string("# trainers of team a\n\n") + kWriter +
          " write:team-a/,write:shared/   # two prefixes\n" + kReader +
          "\tread\n" + kBoth + " read,write:*\n",
      "tokens");
  EXPECT_TRUE(auth.ok()) << auth.status();
  return auth.ok() ? *std::move(auth) : nullptr;
}

TEST(Authorizer, ParsesTokensScopesAndComments) {
  std::unique_ptr<Authorizer> auth = Standard();
  ASSERT_NE(auth, nullptr);
  EXPECT_EQ(auth->size(), 3u);
  absl::StatusOr<const TokenScope*> w = auth->Authenticate(Bearer(kWriter));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE((*w)->read_prefixes.empty());
  EXPECT_THAT((*w)->write_prefixes, ::testing::ElementsAre("team-a/", "shared/"));
  EXPECT_EQ((*w)->line, 3);
  absl::StatusOr<const TokenScope*> b = auth->Authenticate(Bearer(kBoth));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->read_prefixes, std::vector<std::string>{""});
  EXPECT_THAT((*b)->write_prefixes, ::testing::ElementsAre(""));
}

TEST(Authorizer, MissingMalformedAndUnknownTokensAreUnauthenticated) {
  std::unique_ptr<Authorizer> auth = Standard();
  ASSERT_NE(auth, nullptr);
  for (const std::optional<absl::string_view>& header :
       std::initializer_list<std::optional<absl::string_view>>{
           std::nullopt, "", kWriter /* no Bearer */, "Basic abc",
           "Bearer ", "Bearer writer-token-012345678" /* one short */,
           "Bearer writer-token-01234567890" /* one long */,
           "bearer writer-token-0123456789"}) {
    absl::StatusOr<const TokenScope*> s = auth->Authenticate(header);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kUnauthenticated)
        << header.value_or("(none)");
    // The message never echoes what was sent.
    if (header.has_value() && header->size() > 8) {
      EXPECT_THAT(std::string(s.status().message()),
                  Not(HasSubstr(std::string(header->substr(7)))));
    }
  }
}

TEST(Authorizer, ReadScopeGatesQueries) {
  std::unique_ptr<Authorizer> auth = Standard();
  ASSERT_NE(auth, nullptr);
  EXPECT_TRUE(auth->AuthorizeRead(Bearer(kReader)).ok());
  EXPECT_TRUE(auth->AuthorizeRead(Bearer(kBoth)).ok());
  absl::Status s = auth->AuthorizeRead(Bearer(kWriter)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(s.message()), HasSubstr("read scope"));
  EXPECT_EQ(auth->AuthorizeRead(std::nullopt).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(Authorizer, ReadPrefixesScopeReads) {
  absl::StatusOr<std::unique_ptr<Authorizer>> auth = Authorizer::Parse(
      std::string(kReader) + " read:team-a/,read:shared/\n" + kBoth + " read:*\n", "tokens");
  ASSERT_TRUE(auth.ok()) << auth.status();
  absl::StatusOr<const TokenScope*> team = (*auth)->AuthorizeRead(Bearer(kReader));
  ASSERT_TRUE(team.ok()) << team.status();
  EXPECT_TRUE(Authorizer::MayReadRun(*team, "team-a/r1"));
  EXPECT_TRUE(Authorizer::MayReadRun(*team, "shared/x"));
  EXPECT_FALSE(Authorizer::MayReadRun(*team, "team-b/r1"));
  EXPECT_FALSE(Authorizer::MayReadRun(*team, "team-a"));  // a plain prefix
  EXPECT_THAT(Authorizer::CheckReadRun(*team, "team-b/r1").message(),
              ::testing::HasSubstr("may read only runs under \"team-a/\", \"shared/\""));
  EXPECT_TRUE(absl::IsPermissionDenied(Authorizer::CheckReadAll(*team)));
  absl::StatusOr<const TokenScope*> all = (*auth)->AuthorizeRead(Bearer(kBoth));
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(Authorizer::CheckReadAll(*all).ok());
  EXPECT_TRUE(Authorizer::MayReadRun(nullptr, "anything"));  // auth off
  EXPECT_THAT(Authorizer::Parse(std::string(kReader) + " read:bad|prefix\n", "tokens")
                  .status().message(),
              ::testing::HasSubstr("read:PREFIX wants a run-id prefix"));
}

TEST(Authorizer, WriteScopeGatesReportAndRunPrefixes) {
  std::unique_ptr<Authorizer> auth = Standard();
  ASSERT_NE(auth, nullptr);
  EXPECT_EQ(auth->AuthorizeReport(Bearer(kReader)).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(auth->AuthorizeReport(Bearer("nope-nope-nope-nope")).status().code(),
            absl::StatusCode::kUnauthenticated);
  absl::StatusOr<const TokenScope*> w = auth->AuthorizeReport(Bearer(kWriter));
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(Authorizer::CheckWriteRun(**w, "team-a/run-1").ok());
  EXPECT_TRUE(Authorizer::CheckWriteRun(**w, "shared/x").ok());
  absl::Status s = Authorizer::CheckWriteRun(**w, "team-b/run-1");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(s.message()), HasSubstr("run team-b/run-1"));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("may write only runs under \"team-a/\", \"shared/\""));
  // A prefix is a prefix of the id, not a path component match.
  EXPECT_EQ(Authorizer::CheckWriteRun(**w, "team-a").code(),
            absl::StatusCode::kPermissionDenied);
  absl::StatusOr<const TokenScope*> b = auth->AuthorizeReport(Bearer(kBoth));
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(Authorizer::CheckWriteRun(**b, "anything/at:all").ok());
}

TEST(Authorizer, RunsScopeBoundsActiveRuns) {
  absl::StatusOr<std::unique_ptr<Authorizer>> auth = Authorizer::Parse(
      std::string(kWriter) + " write:team-a/,runs:5\n" + kReader + " read\n", "tokens");
  ASSERT_TRUE(auth.ok()) << auth.status();
  absl::StatusOr<const TokenScope*> w = (*auth)->Authenticate(Bearer(kWriter));
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->max_active_runs, 5u);
  absl::StatusOr<const TokenScope*> r = (*auth)->Authenticate(Bearer(kReader));
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE((*r)->max_active_runs.has_value());
}

TEST(Authorizer, FileErrorsNameFileAndLine) {
  struct Case {
    std::string text;
    std::string error;
  };
  const std::string ok_token = "0123456789abcdef";
  for (const Case& c : std::vector<Case>{
           {"", "tokens: no tokens"},
           {"# only a comment\n\n", "tokens: no tokens"},
           {"\n" + ok_token + "\n", "tokens:2: want TOKEN SCOPE"},
           {ok_token + " read write:a\n", "tokens:1: want TOKEN SCOPE"},
           {"short read\n", "tokens:1: the token is 5 characters"},
           {std::string(257, 'x') + " read\n", "tokens:1: the token is 257"},
           {ok_token + "\x01 read\n", "tokens:1: the token has a character"},
           {ok_token + " admin\n", "tokens:1: unknown scope \"admin\""},
           {ok_token + " read,\n", "tokens:1: unknown scope \"\""},
           {ok_token + " write:\n", "tokens:1: write:PREFIX wants"},
           {ok_token + " write:bad prefix\n", "tokens:1: want TOKEN SCOPE"},
           {ok_token + " write:a*b\n", "tokens:1: write:PREFIX wants"},
           {ok_token + " write:*,runs:0\n", "tokens:1: runs:N wants a whole number"},
           {ok_token + " write:*,runs:x\n", "tokens:1: runs:N wants a whole number"},
           {ok_token + " read\n" + ok_token + " write:*\n",
            "tokens:2: the token of line 1 again"},
       }) {
    absl::StatusOr<std::unique_ptr<Authorizer>> auth =
        Authorizer::Parse(c.text, "tokens");
    ASSERT_FALSE(auth.ok()) << c.text;
    EXPECT_EQ(auth.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(auth.status().message()), HasSubstr(c.error));
    EXPECT_THAT(std::string(auth.status().message()), Not(HasSubstr(ok_token)));
  }
}

TEST(Authorizer, ExampleTokenFileParses) {
  std::string warning;
  absl::StatusOr<std::unique_ptr<Authorizer>> auth =
      Authorizer::Load(TW_DEPLOY_DIR "/tokens.example", &warning);
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_EQ((*auth)->size(), 4u);
}

class TempFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "tw-auth-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text,
                    mode_t mode) {
    std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    chmod(path.c_str(), mode);
    return path;
  }
  std::string dir_;
};

using AuthorizerLoad = TempFiles;

TEST_F(AuthorizerLoad, WarnsWhenGroupOrOthersCanRead) {
  const std::string text = std::string(kWriter) + " write:*\n";
  std::string warning = "stale";
  absl::StatusOr<std::unique_ptr<Authorizer>> a =
      Authorizer::Load(Write("private", text, 0600), &warning);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(warning, "");
  a = Authorizer::Load(Write("open", text, 0644), &warning);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(warning, HasSubstr("mode 0644"));
  EXPECT_THAT(warning, HasSubstr("chmod 600"));
  a = Authorizer::Load(dir_ + "/missing", &warning);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(a.status().message()), HasSubstr(dir_ + "/missing"));
}

// Certificates made with the openssl CLI, as an operator would.
class TlsFilesTest : public TempFiles {
 protected:
  void SetUp() override {
    TempFiles::SetUp();
    for (const char* name : {"a", "b"}) {
      std::string cmd = "cd " + dir_ +
                        " && openssl req -x509 -newkey ec -pkeyopt "
                        "ec_paramgen_curve:prime256v1 -nodes -keyout " +
                        name + ".key -out " + name + ".pem -days 1 -subj /CN=" +
                        name + " 2>/dev/null";
      ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
  }
  std::string F(const std::string& name) { return dir_ + "/" + name; }
};

TEST_F(TlsFilesTest, LoadsAMatchingPairAndAClientCa) {
  std::string warning;
  absl::StatusOr<TlsPem> pem = LoadTlsFiles(
      {.cert_file = F("a.pem"), .key_file = F("a.key"), .client_ca_file = F("b.pem")},
      &warning);
  ASSERT_TRUE(pem.ok()) << pem.status();
  EXPECT_THAT(pem->cert_chain, HasSubstr("BEGIN CERTIFICATE"));
  EXPECT_THAT(pem->private_key, HasSubstr("PRIVATE KEY"));
  EXPECT_THAT(pem->client_ca, HasSubstr("BEGIN CERTIFICATE"));
}

TEST_F(TlsFilesTest, WrongFilesAreNamed) {
  std::string warning;
  struct Case {
    TlsFiles files;
    absl::StatusCode code;
    std::string error;
  };
  const std::string junk = Write("junk", "not pem\n", 0600);
  for (const Case& c : std::vector<Case>{
           {{F("missing.pem"), F("a.key")}, absl::StatusCode::kNotFound,
            "--tls-cert " + F("missing.pem") + ": cannot read"},
           {{F("a.pem"), F("missing.key")}, absl::StatusCode::kNotFound,
            "--tls-key " + F("missing.key") + ": cannot read"},
           {{junk, F("a.key")}, absl::StatusCode::kInvalidArgument,
            "--tls-cert " + junk + ": no PEM certificate"},
           {{F("a.pem"), junk}, absl::StatusCode::kInvalidArgument,
            "--tls-key " + junk + ": not an unencrypted PEM private key"},
           {{F("a.pem"), F("b.key")}, absl::StatusCode::kInvalidArgument,
            "--tls-key " + F("b.key") + " is not the key of the certificate in "
            "--tls-cert " + F("a.pem")},
           {{F("a.pem"), F("a.key"), junk}, absl::StatusCode::kInvalidArgument,
            "--tls-client-ca " + junk + ": no PEM certificate"},
       }) {
    absl::StatusOr<TlsPem> pem = LoadTlsFiles(c.files, &warning);
    ASSERT_FALSE(pem.ok()) << c.error;
    EXPECT_EQ(pem.status().code(), c.code) << pem.status();
    EXPECT_THAT(std::string(pem.status().message()), HasSubstr(c.error));
  }
}

TEST_F(TlsFilesTest, WarnsAboutAKeyOthersCanRead) {
  std::string warning;
  chmod(F("a.key").c_str(), 0604);
  ASSERT_TRUE(LoadTlsFiles({F("a.pem"), F("a.key")}, &warning).ok());
  EXPECT_THAT(warning, HasSubstr("readable by others"));
  chmod(F("a.key").c_str(), 0600);
  ASSERT_TRUE(LoadTlsFiles({F("a.pem"), F("a.key")}, &warning).ok());
  EXPECT_EQ(warning, "");
}

}  // namespace
}  // namespace trainwatch
