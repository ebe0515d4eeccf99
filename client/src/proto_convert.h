// Conversions from the public client types to the trainwatch.v1 wire messages.
#ifndef TRAINWATCH_CLIENT_SRC_PROTO_CONVERT_H_
#define TRAINWATCH_CLIENT_SRC_PROTO_CONVERT_H_

#include "intake.h"
#include "trainwatch/client.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch::internal {

v1::RunStart MakeRunStart(const ClientOptions& options);

// Fills `out` with the fields of `step` that are present. When clipped or
// clip_coef is absent and max_norm > 0, derives it the way
// torch.nn.utils.clip_grad_norm_ does, so the server sees the same
// values whether or not the trainer reported them.
void FillStepRecord(const Step& step, double max_norm, v1::StepRecord* out);

void FillRunEvent(const EventItem& event, v1::RunEvent* out);

}  // namespace trainwatch::internal

#endif  // TRAINWATCH_CLIENT_SRC_PROTO_CONVERT_H_
