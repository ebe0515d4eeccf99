// The step chunk codec (server/store/step_codec.h) on any bytes: decoding
// never crashes, reads out of bounds or allocates past what the blob's size
// implies, and whatever decodes (a columnar chunk, or a StepBatch of the
// format before it: records from arbitrary protobuf) re-encodes to a chunk
// that decodes to the same records, bit for bit (compared as their
// deterministic serializations, which keep every double's bits, NaN
// payloads and -0.0 included, and the unknown fields).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "store/step_codec.h"

namespace {

using Records = google::protobuf::RepeatedPtrField<trainwatch::v1::StepRecord>;

std::string Deterministic(const trainwatch::v1::StepRecord& r) {
  std::string out;
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  r.SerializeToCodedStream(&coded);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view blob(reinterpret_cast<const char*>(data), size);
  Records records;
  if (!trainwatch::DecodeStepChunk(blob, &records).ok()) return 0;
  const std::string again = trainwatch::EncodeStepChunk(records);
  Records back;
  if (!trainwatch::DecodeStepChunk(again, &back).ok()) std::abort();
  if (back.size() != records.size()) std::abort();
  for (int i = 0; i < records.size(); ++i) {
    if (Deterministic(records[i]) != Deterministic(back[i])) std::abort();
  }
  return 0;
}
