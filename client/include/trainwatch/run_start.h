// A client's RunStart, both ways: the wire's RunStart that ClientOptions
// send, and the ClientOptions a RunStart gives (the run_start line of a
// replayed step log). Both come from the one table in run_start_fields.h,
// so every field of the proto's RunStart is carried both ways.
#ifndef TRAINWATCH_CLIENT_INCLUDE_TRAINWATCH_RUN_START_H_
#define TRAINWATCH_CLIENT_INCLUDE_TRAINWATCH_RUN_START_H_

#include "trainwatch/client.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

// The RunStart a client with `options` sends (address, security and
// buffering are not in it).
v1::RunStart MakeRunStart(const ClientOptions& options);

// Sets every RunStart field of `options` from `start`, the address,
// security and buffering untouched. world_size 0 is read as 1, as the wire
// reads it (Client::Create checks rank < world_size).
void ApplyRunStart(const v1::RunStart& start, ClientOptions* options);

}  // namespace trainwatch

#endif  // TRAINWATCH_CLIENT_INCLUDE_TRAINWATCH_RUN_START_H_
