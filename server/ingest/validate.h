// Validation of what trainers send (docs/contracts.md): the RunStart, a
// batch's shape, each record, each event, against ValidationLimits
// (common/validate.h). Each function returns INVALID_ARGUMENT with a message
// that names the field, the value and the step where there is one, so a
// user can find the problem in their loop.
#ifndef TRAINWATCH_SERVER_INGEST_VALIDATE_H_
#define TRAINWATCH_SERVER_INGEST_VALIDATE_H_

#include <cstddef>

#include "absl/status/status.h"
#include "common/validate.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

absl::Status ValidateRunStart(const v1::RunStart& start,
                              const ValidationLimits& limits);

// The batch as a whole (its record count): a refusal ends the stream.
absl::Status ValidateBatchShape(const v1::StepBatch& batch,
                                const ValidationLimits& limits);

// One record: a bad one is refused alone, and the rest of its batch is
// stored (docs/contracts.md, partial acceptance). Non-finite floats are data
// and pass (a finite clip_coef outside [0, 1] does not). `moe` is the
// stream's RunStart.moe: with num_experts known, a count or bias vector must
// have that length. Step order is not checked here: the store ignores a step
// at or below the last one stored for the stream.
absl::Status ValidateStepRecord(const v1::StepRecord& r,
                                const ValidationLimits& limits,
                                const v1::MoeConfig& moe = v1::MoeConfig());

// Takes the records of `batch` that ValidateStepRecord refuses out of it,
// in place, keeping the others in their order; returns how many it took
// and sets *first_refusal (when non-null) to the first one's reason.
size_t RefuseBadRecords(v1::StepBatch* batch, const ValidationLimits& limits,
                        const v1::MoeConfig& moe, absl::Status* first_refusal);

// The shape and every record; the first refusal.
absl::Status ValidateStepBatch(const v1::StepBatch& batch,
                               const ValidationLimits& limits);

absl::Status ValidateRunEvent(const v1::RunEvent& event,
                              const ValidationLimits& limits);

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_INGEST_VALIDATE_H_
