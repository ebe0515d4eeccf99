// What the store writer's files (writer*.cc, by job) share.
#ifndef TRAINWATCH_SERVER_STORE_WRITER_INTERNAL_H_
#define TRAINWATCH_SERVER_STORE_WRITER_INTERNAL_H_

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "google/protobuf/repeated_field.h"
#include "trainwatch/v1/step_bound.h"

namespace trainwatch {

// Steps live in SQLite's signed 64-bit integers. Validation refused every
// step above v1::kMaxStep before it reached the store (ingest and the
// engine's own ops carry validated steps), so the cast is exact; nothing
// clamps.
inline int64_t ToDb(uint64_t step) {
  static_assert(v1::kMaxStep == static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
  return static_cast<int64_t>(step);
}

inline std::string PackIds(const google::protobuf::RepeatedField<int64_t>& ids) {
  std::string out(ids.size() * sizeof(int64_t), '\0');
  if (!ids.empty()) std::memcpy(out.data(), ids.data(), out.size());
  return out;
}

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_STORE_WRITER_INTERNAL_H_
