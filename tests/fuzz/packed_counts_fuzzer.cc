// The MoE counts' own parser (proto/trainwatch/v1/packed_counts.h), patched
// into the generated MoeLayerStats: the input is the body of a
// tokens_per_expert field, placed in a ReportRequest with a length that may
// lie and 0-30 bytes of the record after it (so that the field lies whole
// in the parser's buffer or reaches into its last 16 bytes), parsed flat and
// from chunks of 1-64 bytes. The generated code (this parser) and
// protobuf's reflection parser of the same descriptor must accept and
// refuse the same inputs, with the same values; under ASan, neither may
// read outside the input.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "counts_wire.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/util/message_differencer.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace {
namespace pb = google::protobuf;
using trainwatch::v1::ReportRequest;
}  // namespace

// A length that lies moves the layer name's bytes; the parse refuses invalid
// UTF-8, and protobuf's log of it would drown libFuzzer's output.
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int after = data[0] & 15;      // fields of the record after the counts
  const int lie = (data[0] >> 4) % 5;  // the length's error: -2..+2
  const int chunk = 1 + data[1] % 64;
  const std::string body(reinterpret_cast<const char*>(data + 2), size - 2);
  const std::string wire = trainwatch::testing::CountsRequestWire(
      body, static_cast<uint64_t>(std::max<int64_t>(0, static_cast<int64_t>(body.size()) + lie - 2)),
      after);
  const std::unique_ptr<pb::Message> reference = trainwatch::testing::ProtobufParsedRequest();
  const bool want = reference->ParseFromString(wire);
  ReportRequest flat;
  if (flat.ParseFromString(wire) != want) std::abort();
  pb::io::ArrayInputStream chunks(wire.data(), static_cast<int>(wire.size()), chunk);
  ReportRequest chunked;
  if (chunked.ParseFromZeroCopyStream(&chunks) != want) std::abort();
  if (want && (!pb::util::MessageDifferencer::Equals(flat, *reference) ||
               !pb::util::MessageDifferencer::Equals(chunked, *reference))) {
    std::abort();
  }
  return 0;
}
