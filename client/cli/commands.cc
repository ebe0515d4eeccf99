#include "cli/commands.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "trainwatch/channel.h"

namespace trainwatch::cli {

absl::Status ApplyGlobalFlags(const ParsedArgs& args, GlobalOptions* global) {
  if (std::optional<std::string> server = args.Get("server")) {
    if (server->empty()) return UsageError("--server needs an address");
    std::vector<std::string> servers = absl::StrSplit(*server, ',');
    for (const std::string& one : servers) {
      if (one.empty()) {
        return UsageError(absl::StrCat("--server ", *server,
                                       ": an empty address in the list"));
      }
    }
    global->server = *server;
    global->servers = std::move(servers);
  }
  absl::StatusOr<std::optional<double>> seconds = args.GetDouble("timeout");
  if (!seconds.ok()) return seconds.status();
  if (seconds->has_value()) {
    // Also refuses NaN, which fails every comparison.
    if (!(**seconds > 0 && **seconds <= 1e6)) {
      return UsageError("--timeout wants seconds, more than 0");
    }
    global->timeout = std::chrono::milliseconds(
        static_cast<int64_t>(std::ceil(**seconds * 1000)));
  }
  for (auto [flag, field] :
       {std::pair{"token-file", &global->token_file},
        std::pair{"tls-ca", &global->security.tls_ca_file},
        std::pair{"tls-cert", &global->security.tls_cert_file},
        std::pair{"tls-key", &global->security.tls_key_file}}) {
    if (std::optional<std::string> value = args.Get(flag)) {
      if (value->empty()) return UsageError(absl::StrCat("--", flag, " needs a file"));
      *field = *value;
    }
  }
  if (args.Has("tls")) global->security.tls = true;
  return absl::OkStatus();
}

absl::Status ResolveSecurity(GlobalOptions* global) {
  ConnectionSecurity& security = global->security;
  if (!global->token_file.empty()) {
    std::ifstream in(global->token_file);
    if (!in) {
      return absl::NotFoundError(absl::StrCat("--token-file ",
                                              global->token_file, ": ",
                                              std::strerror(errno)));
    }
    // The first word of the first line that is not blank or a comment, so
    // that a line copied from the server's token file works as well.
    std::string line;
    security.auth_token.clear();
    while (security.auth_token.empty() && std::getline(in, line)) {
      line = line.substr(0, line.find('#'));
      std::istringstream(line) >> security.auth_token;
    }
    if (security.auth_token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--token-file ", global->token_file, ": no token in it"));
    }
  } else if (const char* env = std::getenv("TRAINWATCH_TOKEN")) {
    security.auth_token = std::string(absl::StripAsciiWhitespace(env));
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      NewChannelCredentials(security);
  if (!credentials.ok()) return credentials.status();
  global->credentials = *std::move(credentials);
  return absl::OkStatus();
}

std::unique_ptr<v1::TrainingHealth::Stub> NewStub(const GlobalOptions& global) {
  grpc::ChannelArguments args;
  // The server decides how big a QuerySteps chunk or a ListAlerts answer is;
  // gRPC's 4 MiB default would turn a large one into RESOURCE_EXHAUSTED.
  args.SetMaxReceiveMessageSize(256 << 20);
  return v1::TrainingHealth::NewStub(grpc::CreateCustomChannel(
      global.server,
      global.credentials != nullptr ? global.credentials
                                    : grpc::InsecureChannelCredentials(),
      args));
}

std::unique_ptr<grpc::ClientContext> NewContext(
    const GlobalOptions& global, std::chrono::milliseconds fallback) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() +
                        global.timeout.value_or(fallback));
  AddAuthToken(global.security, context.get());
  AddRunHeader(global.run, context.get());
  return context;
}

absl::Status RpcError(absl::string_view command, absl::string_view rpc,
                      const grpc::Status& status) {
  if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    return absl::UnimplementedError(
        absl::StrCat(command, ": the server does not implement ", rpc, " yet"));
  }
  // grpc::StatusCode and absl::StatusCode share their numbering.
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  // A plaintext client at a TLS server (or the reverse) sees only a closed
  // connection or a failed handshake.
  const absl::string_view hint =
      code == absl::StatusCode::kUnavailable
          ? " (is the server running there? does it serve TLS exactly when "
            "--tls or --tls-ca is given, and want a client certificate "
            "(--tls-cert/--tls-key)?)"
          : "";
  return absl::Status(
      code, absl::StrCat(command, ": ", absl::StatusCodeToString(code), ": ",
                         status.error_message(), hint));
}

absl::StatusOr<std::string> RequiredFlag(const ParsedArgs& args,
                                         absl::string_view name) {
  std::optional<std::string> value = args.Get(name);
  if (!value.has_value() || value->empty()) {
    return UsageError(absl::StrCat("missing --", name));
  }
  return *value;
}

absl::Status NoArguments(const ParsedArgs& args) {
  if (args.positional().empty()) return absl::OkStatus();
  return UsageError(
      absl::StrCat("unexpected argument \"", args.positional()[0], "\""));
}

void WriteStdout(absl::string_view text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
}

}  // namespace trainwatch::cli
