// The largest finite value of each FP8 format (docs/contracts.md fp8), shared
// by the server's Fp8* detectors, the report and trainwatch.fp8 (which
// checks its own table against this one in its tests).
#ifndef TRAINWATCH_PROTO_TRAINWATCH_V1_FP8_FORMAT_H_
#define TRAINWATCH_PROTO_TRAINWATCH_V1_FP8_FORMAT_H_

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

}  // namespace trainwatch::v1

#endif  // TRAINWATCH_PROTO_TRAINWATCH_V1_FP8_FORMAT_H_
