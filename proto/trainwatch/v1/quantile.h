// The one definition of a window quantile, shared by the server (its window,
// trainwatch_grad_norm_window{percentile} and GetRunHealth) and the tools
// (the report's rolling percentiles), so the two never disagree: the nearest
// rank, sorted[ceil(q n) - 1].
#ifndef TRAINWATCH_PROTO_TRAINWATCH_V1_QUANTILE_H_
#define TRAINWATCH_PROTO_TRAINWATCH_V1_QUANTILE_H_

#include <cmath>
#include <cstddef>

namespace trainwatch::v1 {

// The index of the nearest-rank q-quantile among n > 0 sorted values: the
// smallest value with at least q of the values at or below it.
inline size_t NearestRank(double q, size_t n) {
  const double clamped = q < 0 ? 0 : (q > 1 ? 1 : q);
  const size_t rank =
      static_cast<size_t>(std::ceil(clamped * static_cast<double>(n)));
  return rank == 0 ? 0 : rank - 1;
}

}  // namespace trainwatch::v1

#endif  // TRAINWATCH_PROTO_TRAINWATCH_V1_QUANTILE_H_
