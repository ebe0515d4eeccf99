// The largest step a record may carry, for both sides: steps are stored as
// SQLite's signed 64-bit integers, so a step at or above 2^63 (usually a
// client's -1 read as unsigned) cannot be stored as sent. The client refuses
// it in Record() (ClientStats::rejected), the server's validation refuses a
// batch that carries one; nothing between clamps.
#ifndef TRAINWATCH_PROTO_TRAINWATCH_V1_STEP_BOUND_H_
#define TRAINWATCH_PROTO_TRAINWATCH_V1_STEP_BOUND_H_

#include <cstdint>

namespace trainwatch::v1 {

inline constexpr uint64_t kMaxStep = 9223372036854775807ULL;  // 2^63 - 1

}  // namespace trainwatch::v1

#endif  // TRAINWATCH_PROTO_TRAINWATCH_V1_STEP_BOUND_H_
