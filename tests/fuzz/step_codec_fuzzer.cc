// The step chunk codec (server/store/codec/step_codec.h) on any bytes: decoding
// never crashes, reads out of bounds or allocates past what the blob's size
// implies, and whatever decodes (a columnar chunk, or a StepBatch of the
// format before it: records from arbitrary protobuf) re-encodes to a chunk
// that decodes to the same records, bit for bit (compared as their
// deterministic serializations, which keep every double's bits, NaN
// payloads and -0.0 included, and the unknown fields). The same bytes are
// also read as a rank_tail row (store/ranks/rank_digest.h).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "proto_bytes.h"
#include "store/codec/step_codec.h"
#include "store/ranks/rank_digest.h"

namespace {

using Records = google::protobuf::RepeatedPtrField<trainwatch::v1::StepRecord>;

using trainwatch::testing::DeterministicBytes;

// The same input as a rank_tail row (store/ranks/rank_digest.h): what decodes
// re-encodes to rows that decode to the same ranks and records.
void RankTail(std::string_view blob) {
  std::vector<trainwatch::RankTailEntry> streams, streams_back;
  Records records, back;
  if (!trainwatch::DecodeRankTail(blob, &streams, &records).ok()) return;
  const std::string again = trainwatch::EncodeRankTail(streams, records);
  if (!trainwatch::DecodeRankTail(again, &streams_back, &back).ok()) std::abort();
  if (back.size() != records.size() || streams_back.size() != streams.size()) std::abort();
  for (size_t i = 0; i < streams.size(); ++i) {
    if (streams[i].rank != streams_back[i].rank ||
        streams[i].attempt != streams_back[i].attempt) {
      std::abort();
    }
  }
  for (int i = 0; i < records.size(); ++i) {
    if (DeterministicBytes(records[i]) != DeterministicBytes(back[i])) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view blob(reinterpret_cast<const char*>(data), size);
  RankTail(blob);
  Records records;
  if (!trainwatch::DecodeStepChunk(blob, &records).ok()) return 0;
  const std::string again = trainwatch::EncodeStepChunk(records);
  Records back;
  if (!trainwatch::DecodeStepChunk(again, &back).ok()) std::abort();
  if (back.size() != records.size()) std::abort();
  for (int i = 0; i < records.size(); ++i) {
    if (DeterministicBytes(records[i]) != DeterministicBytes(back[i])) std::abort();
  }
  return 0;
}
