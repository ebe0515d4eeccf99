// The largest finite value of each FP8 format (docs/contracts.md fp8), and a
// tensor's scaled amax, shared by the server's Fp8* detectors, /metrics, the
// report and trainwatch.fp8 (which checks its own table against this one in
// its tests).
#ifndef TRAINWATCH_PROTO_TRAINWATCH_V1_FP8_FORMAT_H_
#define TRAINWATCH_PROTO_TRAINWATCH_V1_FP8_FORMAT_H_

#include <cmath>
#include <optional>

#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch::v1 {

// 0 for FP8_FORMAT_UNSPECIFIED and unknown values.
inline double Fp8FormatMax(Fp8Format format) {
  switch (format) {
    case E4M3:
      return 448.0;    // OCP E4M3 (S.1111.110 x 2^8 = 1.75 x 256)
    case E4M3_FNUZ:
      return 240.0;    // no infinities, bias 8: 1.875 x 128
    case E5M2:
    case E5M2_FNUZ:
      return 57344.0;  // 1.75 x 2^15
    default:
      return 0.0;
  }
}

// amax x scale over the format's max: 1 at the format's max; above it the
// largest values saturate. nullopt when it says nothing: an unknown
// format, or an amax or scale that is not finite (an overflowed amax is
// the Fp8Overflow detector's, not a ratio to draw or export).
inline std::optional<double> ScaledAmax(const Fp8TensorStats& f) {
  const double max = Fp8FormatMax(f.format());
  if (!(max > 0) || !std::isfinite(f.amax()) || !std::isfinite(f.scale())) {
    return std::nullopt;
  }
  return f.amax() * f.scale() / max;
}

}  // namespace trainwatch::v1

#endif  // TRAINWATCH_PROTO_TRAINWATCH_V1_FP8_FORMAT_H_
