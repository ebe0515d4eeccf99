// Bearer-token authorization (--auth-token-file, docs/security.md).
//
// The token file has one token per line, `TOKEN SCOPE[,SCOPE...]`:
//   read           ListRuns, GetRunHealth, ListAlerts, QuerySteps, Backup
//   read:PREFIX    the same for run ids that start with PREFIX (ListRuns
//                  and ListAlerts list only those; Backup, a copy of the
//                  whole database, needs read or read:*)
//   read:*         = read
//   write:PREFIX   Report for run ids that start with PREFIX
//   write:*        Report for any run
//   runs:N         at most N active runs opened with this token at once
// `#` starts a comment (tokens cannot contain it); blank lines are ignored.
// A token is 16..256 printable ASCII characters without spaces or `#`.
//
// A call without a token, or with one that is not in the file, is
// UNAUTHENTICATED; a known token used outside its scopes is PERMISSION_DENIED.
// Tokens are kept only as SHA-256 digests and compared in constant time; no
// message or log line ever contains one.
//
// Thread-safety: immutable after construction; any thread may call any
// const method.
#ifndef TRAINWATCH_SERVER_AUTH_AUTH_H_
#define TRAINWATCH_SERVER_AUTH_AUTH_H_

#include <array>
#include <memory>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainwatch {

// What one token may do.
struct TokenScope {
  // ListRuns, GetRunHealth, ListAlerts, QuerySteps for run ids starting
  // with one of these; "" (read, read:*) = any run, and Backup.
  std::vector<std::string> read_prefixes;
  // Report for run ids starting with one of these; "" (write:*) = any run.
  std::vector<std::string> write_prefixes;
  // runs:N: at most N of the runs this token opened are active at once
  // (beside the server's --max-active-runs); none: no bound of its own.
  std::optional<uint32_t> max_active_runs;
  // Line of the token file, to tell tokens apart without naming them.
  int line = 0;
};

class Authorizer {
 public:
  // Parses the token file format above; errors name `source:LINE`.
  static absl::StatusOr<std::unique_ptr<Authorizer>> Parse(
      absl::string_view text, absl::string_view source);

  // Reads and parses `path`. `*warning` is set (else cleared) when the file
  // is readable by group or others, which the caller should log.
  static absl::StatusOr<std::unique_ptr<Authorizer>> Load(
      const std::string& path, std::string* warning);

  Authorizer(const Authorizer&) = delete;
  Authorizer& operator=(const Authorizer&) = delete;

  // The scope of the token in an `authorization` metadata value
  // ("Bearer TOKEN"; nullopt when the call has none), or UNAUTHENTICATED.
  absl::StatusOr<const TokenScope*> Authenticate(
      std::optional<absl::string_view> authorization) const;

  // Authenticate, then the scope a query needs (read).
  absl::StatusOr<const TokenScope*> AuthorizeRead(
      std::optional<absl::string_view> authorization) const;

  // Authenticate, then some write scope (checked when a Report stream opens,
  // before its RunStart is read; CheckWriteRun checks the run later).
  absl::StatusOr<const TokenScope*> AuthorizeReport(
      std::optional<absl::string_view> authorization) const;

  // PERMISSION_DENIED unless `scope` may write `run_id`.
  static absl::Status CheckWriteRun(const TokenScope& scope,
                                    absl::string_view run_id);

  // Whether `scope` may read `run_id` (null: auth is off, every run).
  static bool MayReadRun(const TokenScope* scope, absl::string_view run_id);
  // PERMISSION_DENIED unless `scope` may read `run_id`.
  static absl::Status CheckReadRun(const TokenScope* scope, absl::string_view run_id);
  // PERMISSION_DENIED unless `scope` reads every run (Backup copies them all).
  static absl::Status CheckReadAll(const TokenScope* scope);

  size_t size() const { return entries_.size(); }

 private:
  using Digest = std::array<unsigned char, 32>;
  struct Entry {
    Digest digest;
    TokenScope scope;
  };
  Authorizer() = default;

  std::vector<Entry> entries_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_AUTH_AUTH_H_
