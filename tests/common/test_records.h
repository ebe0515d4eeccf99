// What the unit tests of the store and the engine send: a RunStart and runs
// of step records, built one way for all of them.
#ifndef TRAINWATCH_TESTS_COMMON_TEST_RECORDS_H_
#define TRAINWATCH_TESTS_COMMON_TEST_RECORDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch::testing {

// A RunStart of a 2-rank BF16 run clipping at max_norm 1.0, labelled
// model=tiny.
v1::RunStart Start(const std::string& run, uint32_t rank = 0,
                   uint32_t attempt = 0, uint64_t warmup_steps = 0);

using StepRecords = google::protobuf::RepeatedPtrField<v1::StepRecord>;

// Records of steps [from, to), each with grad_norm `norm` (clipped when
// above 1.0, the max_norm of Start) and batch id 2 * step.
StepRecords Steps(uint64_t from, uint64_t to, double norm = 0.5);

// The same records as a StepBatch.
v1::StepBatch Batch(uint64_t from, uint64_t to, double norm = 0.5);

}  // namespace trainwatch::testing

#endif  // TRAINWATCH_TESTS_COMMON_TEST_RECORDS_H_
