// Channel credentials and call metadata from ConnectionSecurity (client.h),
// shared by Client and trainwatchctl; a tool making its own TrainingHealth
// calls can use them too. Includes gRPC, unlike client.h.
#ifndef TRAINWATCH_CHANNEL_H_
#define TRAINWATCH_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "trainwatch/client.h"

namespace trainwatch {

// Insecure credentials without TLS; otherwise SSL credentials from the PEM
// files, read now. INVALID_ARGUMENT or NOT_FOUND naming the field and file
// for a file that cannot be read or holds no PEM data, a certificate without
// its key (or a key without its certificate), or a token that is not
// printable ASCII.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> NewChannelCredentials(
    const ConnectionSecurity& security);

// Adds the bearer token, if any, to a call's metadata.
void AddAuthToken(const ConnectionSecurity& security,
                  grpc::ClientContext* context);

// The metadata key that names the run a call is about. A fleet's proxy
// (deploy/fleet, docs/fleet.md) routes each call by it with consistent
// hashing, so that all of a run's streams and queries reach the one server
// that holds the run; a single server ignores it.
inline constexpr char kRunHeader[] = "x-trainwatch-run";

// Adds `x-trainwatch-run: RUN` to a call's metadata; nothing for an empty
// run or one with characters metadata cannot carry.
void AddRunHeader(const std::string& run_id, grpc::ClientContext* context);

}  // namespace trainwatch

#endif  // TRAINWATCH_CHANNEL_H_
