// The bearer-token metadata of a gRPC call, for Authorizer (auth.h).
#ifndef TRAINWATCH_SERVER_AUTH_CALL_TOKEN_H_
#define TRAINWATCH_SERVER_AUTH_CALL_TOKEN_H_

#include <grpcpp/server_context.h>

#include <optional>

#include "absl/strings/string_view.h"

namespace trainwatch {

// The call's "authorization" metadata value (valid while the call lasts), or
// nullopt when it has none.
inline std::optional<absl::string_view> AuthorizationOf(
    const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return std::nullopt;
  return absl::string_view(it->second.data(), it->second.size());
}

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_AUTH_CALL_TOKEN_H_
