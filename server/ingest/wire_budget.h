// What a ReportRequest would cost to parse, judged on its wire bytes before
// it is parsed. Protobuf materialises every sub-message, string and unknown
// field as an object of its own: an empty StepRecord is 2 bytes on the wire
// and a few hundred in memory, so a 16 MiB message of 8M empty records would
// take gigabytes before any count in it could be checked. The budget counts
// those objects (and the batch's records) with one pass over the bytes and
// refuses the message before the parse when it is over.
//
// Driven by the proto's descriptors (a new field is counted as what it is,
// without a change here). Repeated scalars are not counted: packed or not,
// their memory is at most 8x their wire size. Thread-safe (immutable).
#ifndef TRAINWATCH_SERVER_INGEST_WIRE_BUDGET_H_
#define TRAINWATCH_SERVER_INGEST_WIRE_BUDGET_H_

#include <cstddef>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/validate.h"
#include "google/protobuf/descriptor.h"

namespace trainwatch {

class WireBudget {
 public:
  // Budgets of `limits`: max_batch_records records in a batch,
  // max_message_entries objects in the whole message.
  explicit WireBudget(const ValidationLimits& limits);
  ~WireBudget();
  WireBudget(const WireBudget&) = delete;
  WireBudget& operator=(const WireBudget&) = delete;

  // OK, or INVALID_ARGUMENT naming what is over (the stream ends). Bytes
  // that are not a well-formed message are left to the parser to refuse
  // (OK here), except a group (wire type 3) in a message large enough to be
  // walked, which no trainwatch.v1 message has: refused. A message of at
  // most 2 x the budgets' bytes is not walked at all (it cannot be over).
  absl::Status Check(std::string_view wire) const;

  struct Shape;  // one message type: what each field number is (wire_budget.cc)

 private:
  const Shape* ShapeOf(const google::protobuf::Descriptor* d);

  const size_t max_batch_records_;
  const size_t max_entries_;
  std::vector<std::unique_ptr<Shape>> shapes_;
  absl::flat_hash_map<const google::protobuf::Descriptor*, const Shape*> built_;
  const Shape* request_ = nullptr;  // trainwatch.v1.ReportRequest
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_INGEST_WIRE_BUDGET_H_
