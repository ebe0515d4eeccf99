#include "auth/auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/validate.h"

namespace trainwatch {
namespace {

constexpr size_t kMinTokenChars = 16;
constexpr size_t kMaxTokenChars = 256;
constexpr absl::string_view kBearer = "Bearer ";

using Digest = std::array<unsigned char, 32>;

Digest Sha256(absl::string_view text) {
  Digest d;
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(),
         d.data());
  return d;
}

bool IsTokenChar(char c) { return c > ' ' && c < 0x7f && c != '#'; }

absl::Status ParseScopes(absl::string_view field, TokenScope* scope) {
  for (absl::string_view s : absl::StrSplit(field, ',')) {
    if (s == "read" || s == "read:*") {
      scope->read_prefixes.push_back("");
    } else if (absl::ConsumePrefix(&s, "read:")) {
      if (absl::Status v = ValidateRunId(std::string_view(s.data(), s.size())); !v.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "read:PREFIX wants a run-id prefix (or *): ", v.message()));
      }
      scope->read_prefixes.push_back(std::string(s));
    } else if (absl::ConsumePrefix(&s, "write:")) {
      if (s == "*") {
        scope->write_prefixes.push_back("");
      } else if (absl::Status v = ValidateRunId(std::string_view(s.data(), s.size()));
                 !v.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "write:PREFIX wants a run-id prefix (or *): ", v.message()));
      } else {
        scope->write_prefixes.push_back(std::string(s));
      }
    } else if (absl::ConsumePrefix(&s, "runs:")) {
      uint32_t n = 0;
      if (!absl::SimpleAtoi(s, &n) || n == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "runs:N wants a whole number of runs >= 1, got \"", s, "\""));
      }
      scope->max_active_runs = n;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown scope \"", s,
          "\"; scopes are read, read:PREFIX, write:PREFIX, write:*, runs:N"));
    }
  }
  return absl::OkStatus();
}

absl::Status LineError(absl::string_view source, int line,
                       absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat(source, ":", line, ": ", message));
}

absl::Status Unauthenticated(absl::string_view why) {
  return absl::UnauthenticatedError(absl::StrCat(
      why, "; send metadata \"authorization: Bearer TOKEN\" with a token from "
           "the server's --auth-token-file"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Authorizer>> Authorizer::Parse(
    absl::string_view text, absl::string_view source) {
  std::unique_ptr<Authorizer> auth(new Authorizer());
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    if (fields.size() != 2) {
      return LineError(source, line_number,
                       absl::StrCat("want TOKEN SCOPE[,SCOPE...], got ",
                                    fields.size(), " fields"));
    }
    absl::string_view token = fields[0];
    if (token.size() < kMinTokenChars || token.size() > kMaxTokenChars) {
      return LineError(
          source, line_number,
          absl::StrCat("the token is ", token.size(), " characters; use ",
                       kMinTokenChars, " to ", kMaxTokenChars,
                       " (e.g. openssl rand -hex 32)"));
    }
    for (char c : token) {
      if (!IsTokenChar(c)) {
        return LineError(source, line_number,
                         "the token has a character that is not printable "
                         "ASCII (or is #)");
      }
    }
    Entry entry{.digest = Sha256(token), .scope = {.line = line_number}};
    if (absl::Status s = ParseScopes(fields[1], &entry.scope); !s.ok()) {
      return LineError(source, line_number, s.message());
    }
    for (const Entry& e : auth->entries_) {
      if (e.digest == entry.digest) {
        return LineError(source, line_number,
                         absl::StrCat("the token of line ", e.scope.line,
                                      " again; give each token one line"));
      }
    }
    auth->entries_.push_back(std::move(entry));
  }
  if (auth->entries_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": no tokens; every call would be refused (format: TOKEN "
                "SCOPE[,SCOPE...] per line)"));
  }
  return auth;
}

absl::StatusOr<std::unique_ptr<Authorizer>> Authorizer::Load(
    const std::string& path, std::string* warning) {
  warning->clear();
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot read: ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat(path, ": read failed"));
  }
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO))) {
    *warning = absl::StrCat(path, " is accessible to group or others (mode ",
                            absl::StrFormat("%04o", st.st_mode & 07777),
                            "); chmod 600 it");
  }
  return Parse(text.str(), path);
}

absl::StatusOr<const TokenScope*> Authorizer::Authenticate(
    std::optional<absl::string_view> authorization) const {
  if (!authorization.has_value()) {
    return Unauthenticated("no bearer token");
  }
  absl::string_view token = *authorization;
  if (!absl::ConsumePrefix(&token, kBearer)) {
    return Unauthenticated(
        "the authorization metadata is not \"Bearer TOKEN\"");
  }
  // Compare the digest with every entry's, without stopping at a match, so
  // the time taken does not depend on which token matched or where a wrong
  // one differs.
  const Digest digest = Sha256(token);
  const TokenScope* found = nullptr;
  for (const Entry& e : entries_) {
    const bool equal =
        CRYPTO_memcmp(e.digest.data(), digest.data(), digest.size()) == 0;
    if (equal) found = &e.scope;
  }
  if (found == nullptr) return Unauthenticated("unknown bearer token");
  return found;
}

absl::StatusOr<const TokenScope*> Authorizer::AuthorizeRead(
    std::optional<absl::string_view> authorization) const {
  absl::StatusOr<const TokenScope*> scope = Authenticate(authorization);
  if (scope.ok() && (*scope)->read_prefixes.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "this token (line ", (*scope)->line,
        " of the token file) may not query: it lacks the read scope"));
  }
  return scope;
}

absl::StatusOr<const TokenScope*> Authorizer::AuthorizeReport(
    std::optional<absl::string_view> authorization) const {
  absl::StatusOr<const TokenScope*> scope = Authenticate(authorization);
  if (scope.ok() && (*scope)->write_prefixes.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "this token (line ", (*scope)->line,
        " of the token file) may not report runs: it has no write scope"));
  }
  return scope;
}

namespace {

bool UnderAny(const std::vector<std::string>& prefixes, absl::string_view run_id) {
  for (const std::string& prefix : prefixes) {
    if (absl::StartsWith(run_id, prefix)) return true;
  }
  return false;
}

std::string Quoted(const std::vector<std::string>& prefixes) {
  std::vector<std::string> quoted;
  for (const std::string& prefix : prefixes) quoted.push_back(absl::StrCat("\"", prefix, "\""));
  return absl::StrJoin(quoted, ", ");
}

}  // namespace

bool Authorizer::MayReadRun(const TokenScope* scope, absl::string_view run_id) {
  return scope == nullptr || UnderAny(scope->read_prefixes, run_id);
}

absl::Status Authorizer::CheckReadRun(const TokenScope* scope, absl::string_view run_id) {
  if (MayReadRun(scope, run_id)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "run ", run_id, ": this token (line ", scope->line,
      " of the token file) may read only runs under ", Quoted(scope->read_prefixes)));
}

absl::Status Authorizer::CheckReadAll(const TokenScope* scope) {
  if (scope == nullptr) return absl::OkStatus();
  for (const std::string& prefix : scope->read_prefixes) {
    if (prefix.empty()) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "this token (line ", scope->line,
      " of the token file) may read only runs under ", Quoted(scope->read_prefixes),
      "; a backup copies the whole database, every tenant's runs: it needs the read "
      "scope (or read:*)"));
}

absl::Status Authorizer::CheckWriteRun(const TokenScope& scope,
                                       absl::string_view run_id) {
  if (UnderAny(scope.write_prefixes, run_id)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "run ", run_id, ": this token (line ", scope.line,
      " of the token file) may write only runs under ", Quoted(scope.write_prefixes)));
}

}  // namespace trainwatch
