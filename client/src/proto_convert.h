// Conversions between the public client types and the trainwatch.v1 wire
// messages, from the field tables (trainwatch/step_fields.h,
// run_start_fields.h; MakeRunStart and ApplyRunStart are run_start.h's).
#ifndef TRAINWATCH_CLIENT_SRC_PROTO_CONVERT_H_
#define TRAINWATCH_CLIENT_SRC_PROTO_CONVERT_H_

#include "intake.h"
#include "trainwatch/client.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch::internal {

// Fills `out` with the fields of `step` that are present, then derives
// clipping as DeriveClipping() does.
void FillStepRecord(const Step& step, double max_norm, v1::StepRecord* out);

// The Step that FillStepRecord (without max_norm) turns into `record`: the
// table's other direction, which shows that every field of the wire's
// record has its place in a Step (client_fields_test).
Step StepFromRecord(const v1::StepRecord& record);

// When clipped or clip_coef is absent and max_norm > 0, derives it the way
// torch.nn.utils.clip_grad_norm_ does, so the server sees the same
// values whether or not the trainer reported them.
void DeriveClipping(double max_norm, v1::StepRecord* record);

// Appends the step `item` holds (a Step or a wire record; not an event) to
// `batch`: a Step through FillStepRecord(), a wire record moved in as it is
// with DeriveClipping(), so both give the same record.
void AddStepRecord(QueueItem&& item, double max_norm, v1::StepBatch* batch);

void FillRunEvent(const EventItem& event, v1::RunEvent* out);

}  // namespace trainwatch::internal

#endif  // TRAINWATCH_CLIENT_SRC_PROTO_CONVERT_H_
