// Partial acceptance (docs/errors-and-limits.md): a StepBatch holding good
// and bad records, as ingest filters it (RefuseBadRecords). The oracle:
// every good record is kept exactly once, in its order, unchanged; every
// bad one is counted and none is kept; the first refusal names a step;
// nothing else comes out.
//
// Input: one byte for RunStart.moe's num_experts (0: unknown), then a
// serialized trainwatch.v1.StepBatch.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ingest/validate.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace {

std::string Bytes(const trainwatch::v1::StepRecord& r) {
  std::string out;
  r.SerializeToString(&out);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  trainwatch::v1::StepBatch batch;
  if (!batch.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
  trainwatch::v1::MoeConfig moe;
  moe.set_num_experts(data[0] % 9);
  trainwatch::ValidationLimits limits;
  limits.max_layers = 4;
  limits.max_layer_name_chars = 16;
  limits.max_fp8_tensors = 4;
  limits.max_batch_ids = 8;
  limits.max_moe_layers = 4;
  limits.max_experts = 16;

  std::vector<std::string> good;
  size_t bad = 0;
  for (const trainwatch::v1::StepRecord& r : batch.records()) {
    if (trainwatch::ValidateStepRecord(r, limits, moe).ok()) {
      good.push_back(Bytes(r));
    } else {
      ++bad;
    }
  }
  absl::Status first;
  const size_t refused = trainwatch::RefuseBadRecords(&batch, limits, moe, &first);
  if (refused != bad) std::abort();
  if (static_cast<size_t>(batch.records_size()) != good.size()) std::abort();
  for (size_t i = 0; i < good.size(); ++i) {
    if (Bytes(batch.records(static_cast<int>(i))) != good[i]) std::abort();
  }
  if (bad > 0) {
    if (!absl::IsInvalidArgument(first)) std::abort();
    if (first.message().find("step ") == std::string::npos) std::abort();
  } else if (!first.ok()) {
    std::abort();
  }
  // What was kept passes on its own: nothing bad is left to store.
  for (const trainwatch::v1::StepRecord& r : batch.records()) {
    if (!trainwatch::ValidateStepRecord(r, limits, moe).ok()) std::abort();
  }
  return 0;
}
