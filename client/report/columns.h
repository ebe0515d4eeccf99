// How the report reduces a run to at most kReportColumns columns: the column
// of a step, and a series as each column's min and max. Every chart and the
// MoE heatmap use this one rule, so their columns line up.
#ifndef TRAINWATCH_CLIENT_REPORT_COLUMNS_H_
#define TRAINWATCH_CLIENT_REPORT_COLUMNS_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace trainwatch::cli {

struct Point {
  uint64_t step;
  double value;
};

// One chart's series, downsampled to columns of min/max over the step range.
struct Columns {
  std::vector<uint64_t> x;  // the step of each column's first point
  std::vector<double> lo, hi;
  uint64_t points = 0;  // finite points represented
};

// Columns of equal step spans over [first, last]: step s falls in column
// floor((s - first) / (last - first + 1) * columns). Immutable, so safe to
// share between threads.
class Downsampler {
 public:
  Downsampler(uint64_t first, uint64_t last, size_t columns)
      : first_(first),
        span_(std::max<uint64_t>(last - first + 1, 1)),
        columns_(std::max<size_t>(columns, 1)) {}

  size_t columns() const { return columns_; }

  size_t Column(uint64_t step) const {
    const double at = static_cast<double>(step - first_) / span_;
    return std::min(columns_ - 1, static_cast<size_t>(at * columns_));
  }

  // Finite values only; points must come in ascending steps.
  Columns MinMax(const std::vector<Point>& points) const {
    Columns c;
    size_t current = std::numeric_limits<size_t>::max();
    for (const Point& p : points) {
      if (!std::isfinite(p.value)) continue;
      const size_t col = Column(p.step);
      if (col != current) {
        current = col;
        c.x.push_back(p.step);
        c.lo.push_back(p.value);
        c.hi.push_back(p.value);
      } else {
        c.lo.back() = std::min(c.lo.back(), p.value);
        c.hi.back() = std::max(c.hi.back(), p.value);
      }
      ++c.points;
    }
    return c;
  }

  // The steps of `steps` (ascending), one per column that holds any.
  std::vector<uint64_t> Marks(const std::vector<uint64_t>& steps) const {
    std::vector<uint64_t> out;
    size_t current = std::numeric_limits<size_t>::max();
    for (uint64_t s : steps) {
      const size_t col = Column(s);
      if (col == current) continue;
      current = col;
      out.push_back(s);
    }
    return out;
  }

  // Indices (into points) of each column's last point.
  std::vector<size_t> ColumnEnds(const std::vector<Point>& points) const {
    std::vector<size_t> ends;
    for (size_t i = 0; i < points.size(); ++i) {
      if (i + 1 == points.size() ||
          Column(points[i + 1].step) != Column(points[i].step)) {
        ends.push_back(i);
      }
    }
    return ends;
  }

 private:
  uint64_t first_;
  uint64_t span_;
  size_t columns_;
};

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLIENT_REPORT_COLUMNS_H_
