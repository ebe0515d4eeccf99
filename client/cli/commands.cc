#include "commands.h"

#include <cmath>
#include <cstdio>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace trainwatch::cli {

absl::Status ApplyGlobalFlags(const ParsedArgs& args, GlobalOptions* global) {
  if (std::optional<std::string> server = args.Get("server")) {
    if (server->empty()) return UsageError("--server needs an address");
    global->server = *server;
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
  return absl::OkStatus();
}

std::unique_ptr<v1::TrainingHealth::Stub> NewStub(const GlobalOptions& global) {
  grpc::ChannelArguments args;
  // The server decides how big a QuerySteps chunk or a ListAlerts answer is;
  // gRPC's 4 MiB default would turn a large one into RESOURCE_EXHAUSTED.
  args.SetMaxReceiveMessageSize(256 << 20);
  return v1::TrainingHealth::NewStub(grpc::CreateCustomChannel(
      global.server, grpc::InsecureChannelCredentials(), args));
}

std::unique_ptr<grpc::ClientContext> NewContext(
    const GlobalOptions& global, std::chrono::milliseconds fallback) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() +
                        global.timeout.value_or(fallback));
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
  return absl::Status(
      code, absl::StrCat(command, ": ", absl::StatusCodeToString(code), ": ",
                         status.error_message()));
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
