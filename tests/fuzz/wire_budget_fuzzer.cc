// The ReportRequest's cost judged on its bytes (server/ingest/wire_budget.h).
// Any input: the check must not crash or read out of bounds; and when it
// passes a message that protobuf then parses, what the parse made is within
// the budget: at most max_batch_records records, and at most 3x
// max_message_entries objects (sub-messages, strings, unknown fields; a map
// entry counted once on the wire is an entry, a key and a value). The
// budget is kept small so that the fuzzer reaches it.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/reflection.h"
#include "google/protobuf/unknown_field_set.h"
#include "ingest/wire_budget.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace {

namespace pb = google::protobuf;

// Objects a parsed message holds: itself, its sub-messages and strings, its
// unknown fields, recursively.
size_t Objects(const pb::Message& m) {
  const pb::Reflection* r = m.GetReflection();
  size_t n = 1 + static_cast<size_t>(r->GetUnknownFields(m).field_count());
  std::vector<const pb::FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const pb::FieldDescriptor* f : fields) {
    const bool message = f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE;
    const bool text = f->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING;
    if (!message && !text) continue;
    if (f->is_repeated()) {
      const int size = r->FieldSize(m, f);
      for (int i = 0; i < size; ++i) {
        n += message ? Objects(r->GetRepeatedMessage(m, f, i)) : 1;
      }
    } else {
      n += message ? Objects(r->GetMessage(m, f)) : 1;
    }
  }
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  trainwatch::ValidationLimits limits;
  limits.max_batch_records = 8;
  limits.max_message_entries = 64;
  static const trainwatch::WireBudget budget(limits);
  const std::string_view wire(reinterpret_cast<const char*>(data), size);
  if (!budget.Check(wire).ok()) return 0;
  trainwatch::v1::ReportRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  if (request.has_batch() &&
      static_cast<size_t>(request.batch().records_size()) > limits.max_batch_records) {
    std::abort();
  }
  if (Objects(request) > 3 * limits.max_message_entries + 1) std::abort();
  return 0;
}
