// The commands of trainwatchctl and what they share. main.cc parses the
// global flags and dispatches; each command parses its own flags and returns
// a status whose message is ready for the user (exit 1), or a UsageError
// (exit 2).
#ifndef TRAINWATCH_CLIENT_CLI_COMMANDS_H_
#define TRAINWATCH_CLIENT_CLI_COMMANDS_H_

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "cli/flags.h"
#include "grpcpp/grpcpp.h"
#include "trainwatch/client.h"
#include "trainwatch/v1/trainwatch.grpc.pb.h"

namespace trainwatch::cli {

struct GlobalOptions {
  // Server address, host:port: --server as given (a fleet's list stays
  // comma-separated here; NewStub wants one address, see fleet.h).
  std::string server = "127.0.0.1:50051";
  // --server split at commas: one address (a server, or a fleet's proxy), or
  // every server of a fleet.
  std::vector<std::string> servers = {"127.0.0.1:50051"};
  // The run a command is about (fleet.h ForRun); NewContext sends it as
  // x-trainwatch-run so that a fleet's proxy routes the call to its server.
  std::string run;
  // --timeout: the deadline of a query, or how long replay waits for acks.
  // Unset: each command's default.
  std::optional<std::chrono::milliseconds> timeout;
  // --token-file (or $TRAINWATCH_TOKEN), --tls, --tls-ca, --tls-cert,
  // --tls-key; the token is read by ResolveSecurity.
  ConnectionSecurity security;
  std::string token_file;
  // Built by ResolveSecurity; null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
};

// Flags every command accepts as well as its own, so that `--server` may also
// follow the command.
inline constexpr FlagSpec kGlobalFlags[] = {
    {"server", true},   {"timeout", true},  {"token-file", true},
    {"tls", false},     {"tls-ca", true},   {"tls-cert", true},
    {"tls-key", true},  {"help", false},    {"h", false}};

// Folds global flags given after the command into `global`.
absl::Status ApplyGlobalFlags(const ParsedArgs& args, GlobalOptions* global);

// Once every flag is in: reads the token (from --token-file, else from
// $TRAINWATCH_TOKEN) and builds the channel credentials from the TLS files.
// An error names the flag and file.
absl::Status ResolveSecurity(GlobalOptions* global);

// Command entry points; `args` are the arguments after the command name,
// already checked against the command's flags plus kGlobalFlags.
absl::Status RunReplay(const GlobalOptions& global, const ParsedArgs& args);
absl::Status RunRuns(const GlobalOptions& global, const ParsedArgs& args);
absl::Status RunSteps(const GlobalOptions& global, const ParsedArgs& args);
absl::Status RunHealth(const GlobalOptions& global, const ParsedArgs& args);
absl::Status RunAlerts(const GlobalOptions& global, const ParsedArgs& args);
absl::Status RunSpikes(const GlobalOptions& global, const ParsedArgs& args);
absl::Status RunPlan(const GlobalOptions& global, const ParsedArgs& args);
// import_cmd.cc and report_cmd.cc.
absl::Status RunImport(const GlobalOptions& global, const ParsedArgs& args);
absl::Status RunReport(const GlobalOptions& global, const ParsedArgs& args);
// lifecycle.cc.
absl::Status RunDeleteRun(const GlobalOptions& global, const ParsedArgs& args);
absl::Status RunBackup(const GlobalOptions& global, const ParsedArgs& args);
// directives_cmd.cc (docs/closed-loop.md).
absl::Status RunDirectives(const GlobalOptions& global, const ParsedArgs& args);
absl::Status RunApprove(const GlobalOptions& global, const ParsedArgs& args);
absl::Status RunReject(const GlobalOptions& global, const ParsedArgs& args);
absl::Status RunHold(const GlobalOptions& global, const ParsedArgs& args);
absl::Status RunRelease(const GlobalOptions& global, const ParsedArgs& args);
// Reference runs (baseline_cmd.cc, docs/baselines.md).
absl::Status RunBaseline(const GlobalOptions& global, const ParsedArgs& args);
absl::Status RunCompare(const GlobalOptions& global, const ParsedArgs& args);

// A stub on a channel to global.server with global.credentials (plaintext
// when null).
std::unique_ptr<v1::TrainingHealth::Stub> NewStub(const GlobalOptions& global);

// A context whose deadline is global.timeout, or `fallback` when unset, so
// that no call can hang forever on a stalled server; it carries the token
// and, when global.run is set, the run header.
std::unique_ptr<grpc::ClientContext> NewContext(
    const GlobalOptions& global, std::chrono::milliseconds fallback);

// "<command>: <CODE_NAME>: <message>", or, for UNIMPLEMENTED,
// "<command>: the server does not implement <rpc> yet".
absl::Status RpcError(absl::string_view command, absl::string_view rpc,
                      const grpc::Status& status);

// The value of a required string flag, or a usage error naming it.
absl::StatusOr<std::string> RequiredFlag(const ParsedArgs& args,
                                         absl::string_view name);

// A usage error naming the first positional argument, if there is one.
absl::Status NoArguments(const ParsedArgs& args);

// Writes all of `text` to stdout.
void WriteStdout(absl::string_view text);

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLIENT_CLI_COMMANDS_H_
