// TensorBoard event files (events.out.tfevents.*), read without TensorFlow.
//
// A file is a sequence of TFRecords: uint64 length, masked CRC32C of the
// length, the data, masked CRC32C of the data (both little-endian). Each
// record is an Event proto; scalar points are Event.summary.value entries
// with a simple_value, or a scalar float/double tensor (TF2 summaries). The
// protos are read from the wire format with protobuf's CodedInputStream, so
// no TensorFlow .proto is needed.
#ifndef TRAINWATCH_CLIENT_IMPORT_IMPORT_TENSORBOARD_H_
#define TRAINWATCH_CLIENT_IMPORT_IMPORT_TENSORBOARD_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "import/import_log.h"

namespace trainwatch::cli {

// CRC32C (Castagnoli) of `data`, and TFRecord's masked form of a CRC.
uint32_t Crc32c(absl::string_view data);
uint32_t MaskCrc(uint32_t crc);

// One scalar point of an event file.
struct ScalarPoint {
  absl::string_view tag;
  int64_t step;
  double value;
};

// Reads every scalar point of an event file's bytes. A bad length or data
// CRC, or an undecodable Event, fails with "NAME:offset N: ..." before any
// point after it is delivered. A truncated last record is not an error:
// `*truncated_at` (if given) is set to its offset and the points before it
// stand. `name` is how messages refer to the file.
absl::Status ReadEventScalars(absl::string_view bytes, absl::string_view name,
                              const std::function<void(const ScalarPoint&)>& fn,
                              int64_t* truncated_at = nullptr);

// Reads an event file into `run` through the tag table (LookUpTag) and user
// mappings; notes what it ignored and a truncated tail.
absl::Status ImportTensorBoard(const std::string& path, const TagMap& map,
                               LoggedRun* run);

// Whether `bytes` starts like a TFRecord file (a valid length CRC).
bool LooksLikeTfRecord(absl::string_view bytes);

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLIENT_IMPORT_IMPORT_TENSORBOARD_H_
