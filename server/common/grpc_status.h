// The one conversion from absl::Status (used inside the server) to the
// grpc::Status a client sees; the codes share their numbering.
#ifndef TRAINWATCH_SERVER_COMMON_GRPC_STATUS_H_
#define TRAINWATCH_SERVER_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"

namespace trainwatch {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_COMMON_GRPC_STATUS_H_
