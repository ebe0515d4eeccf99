// A robust linear trend of a slowly moving signal (the max attention logit,
// log Z) and the step at which it is forecast to reach a level: docs/detectors.md
// AttentionLogitGrowth fires when the trend reaches the cap (100) within a
// horizon (2000 steps), well before the crossing.
//
// The signal is decimated (the median of every `stride` values is one point)
// into a ring of the last `points` points, and the trend is Theil-Sen's: the
// median of the slopes between all pairs of points, through the median
// intercept. It resists outliers (up to ~29% of the points) and costs nothing
// between points: the O(points^2) fit runs once per `stride` values, in a
// per-thread scratch buffer (a run keeps ~1.2 KB: its 64 points).
//
// Pure and not thread-safe: one instance per run and signal.
#ifndef TRAINWATCH_SERVER_HEALTH_SIGNALS_TREND_FORECAST_H_
#define TRAINWATCH_SERVER_HEALTH_SIGNALS_TREND_FORECAST_H_

#include <cstdint>
#include <optional>
#include <vector>

namespace trainwatch {

class TrendForecaster {
 public:
  struct Options {
    uint32_t stride = 16;      // values per point
    uint32_t points = 64;      // points in the fit (64 x 16 = 1024 steps)
    uint32_t min_points = 32;  // points before there is a trend
  };

  struct Trend {
    double slope = 0.0;  // per step
    double level = 0.0;  // the trend's value at the last point's step
    uint64_t step = 0;   // the last point's step
  };

  explicit TrendForecaster(const Options& options);

  // Adds a value; true when the trend was refitted (every few points).
  bool Add(uint64_t step, double value);
  // Drops the points of steps >= `step`.
  void RewindTo(uint64_t step);

  const std::optional<Trend>& trend() const { return trend_; }
  // The first step at which the trend reaches `target`, if it is moving
  // towards it (nullopt when it moves away, is flat, or is past it).
  std::optional<uint64_t> StepReaching(double target) const;

  // Fits whose median slope was selected inside the last fit's bracket
  // (tests and benchmarks: the rest selected among all the slopes).
  uint64_t bracketed_fits() const { return bracketed_fits_; }

 private:
  void Fit();
  // The median slope when the points are in step order (nullopt when not:
  // Fit() then skips pairs of equal steps as it always did). One pass
  // computes all the slopes into `all` and counts those below the bracket
  // around the last fit's slope, keeping those inside it: the median is
  // selected among those (~400 of 2,016) when it is inside, among all of
  // them when not.
  std::optional<double> MedianSlopeInOrder(std::vector<double>& all);
  // The bracket from `slopes` and their median, for the next fit.
  void SetBracket(std::vector<double>& slopes, double median);

  Options options_;
  std::vector<double> pending_;  // values of the point being built
  uint64_t pending_last_step_ = 0;
  // The ring of points, oldest first from head_.
  std::vector<uint64_t> steps_;
  std::vector<double> values_;
  size_t head_ = 0;
  std::optional<Trend> trend_;
  // The bracket of the next fit: [last_slope_ - below_width_,
  // last_slope_ + above_width_], from the last fit.
  bool bracket_valid_ = false;
  double last_slope_ = 0.0;
  double below_width_ = 0.0;
  double above_width_ = 0.0;
  uint64_t bracketed_fits_ = 0;
};

// The step at which `trend` is forecast to be `distance` away from `base`
// on the side away from 0 (LogZDrift's forecast rule, and what `health`
// shows): only a trend already two thirds of that way out and still moving
// out (a trend fitted across a drop back to the baseline points nowhere; a
// healthy run's log Z still settling, 1-3 nats above a baseline taken early,
// is not on its way out: the lab's healthy SGD runs, 2.7 nats at step 561).
std::optional<uint64_t> OutwardCrossing(const TrendForecaster& trend, double base,
                                        double distance);

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_SIGNALS_TREND_FORECAST_H_
