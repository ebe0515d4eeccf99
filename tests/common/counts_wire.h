// The wire of a ReportRequest built around an MoE layer's tokens_per_expert
// field, and protobuf's own parse of it: what packed_counts_test and
// packed_counts_fuzzer compare the counts' own parser
// (proto/trainwatch/v1/packed_counts.h) with.
#ifndef TRAINWATCH_TESTS_COMMON_COUNTS_WIRE_H_
#define TRAINWATCH_TESTS_COMMON_COUNTS_WIRE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "google/protobuf/dynamic_message.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch::testing {

inline void PutVarint(uint64_t v, std::string& out) {
  for (; v >= 0x80; v >>= 7) out.push_back(static_cast<char>(0x80 | (v & 0x7f)));
  out.push_back(static_cast<char>(v));
}

// A length-delimited field `number` holding `body`.
inline std::string LengthDelimited(int number, const std::string& body) {
  std::string out;
  PutVarint(static_cast<uint64_t>(number) << 3 | 2, out);
  PutVarint(body.size(), out);
  return out + body;
}

// A ReportRequest of one record whose MoE report is one layer ("l") with
// `body` as its packed tokens_per_expert, the field's length written as
// `length` (which may lie), then `after` more fields of the record (step =
// 1, 2 bytes each): the counts lie anywhere in the parser's buffer.
inline std::string CountsRequestWire(const std::string& body, uint64_t length, int after) {
  std::string layer = "\x0a\x01l\x12";  // layer = "l", then tokens_per_expert
  PutVarint(length, layer);
  layer += body;
  std::string record =
      LengthDelimited(v1::StepRecord::kMoeFieldNumber, LengthDelimited(1, layer));  // layers
  for (int i = 0; i < after; ++i) record += "\x08\x01";
  return LengthDelimited(v1::ReportRequest::kBatchFieldNumber,
                         LengthDelimited(2, record));  // StepBatch.records
}

// An empty ReportRequest that parses with protobuf's own parser: a dynamic
// message of the same descriptor, which parses by reflection (the generated
// code's parser of the counts is trainwatch's).
inline std::unique_ptr<google::protobuf::Message> ProtobufParsedRequest() {
  static google::protobuf::DynamicMessageFactory* factory = [] {
    auto* f = new google::protobuf::DynamicMessageFactory;
    f->SetDelegateToGeneratedFactory(false);
    return f;
  }();
  return std::unique_ptr<google::protobuf::Message>(
      factory->GetPrototype(v1::ReportRequest::descriptor())->New());
}

}  // namespace trainwatch::testing

#endif  // TRAINWATCH_TESTS_COMMON_COUNTS_WIRE_H_
