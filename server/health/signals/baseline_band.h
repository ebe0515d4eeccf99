// A run against its reference runs (docs/baselines.md): the band of the
// references' 20-step bins on a common axis, and the run's standardised
// residual against it. One definition, used by the BaselineDeviation detector
// (detectors/baseline.cc) as the records arrive and by CompareRuns
// (`trainwatchctl compare`, the report) over a stored run.
//
// The axis is the tokens consumed when the run and every reference carry
// them, else the step: a run with another batch size is compared at the same
// tokens. Each bin holds 20 post-warmup records of the run; its value is the
// median of their metric (in log space: loss, grad norm, max attention logit;
// log Z as it is). A reference's value in the bin is the median of its own
// records whose x falls in the bin's range (linearly interpolated at the bin's
// centre when none does: a reference with far fewer records per x); a
// reference whose records do not cover the range is left out, and a bin that
// no reference covers is not judged. The band is the references' median +-
// band_sigmas standard deviations of the residual, which comes
//  - with one reference, from both curves' own noise (the robust spread of
//    successive differences, which a trend does not inflate), as the sd of
//    the difference of two bin medians;
//  - with three or more, from the references' spread around their median
//    (the run is one more draw of the recipe): its root mean square over the
//    last spread_bins bins, so that one bin's few values do not set it (with
//    two references a bin's spread is one degree of freedom, half-normal:
//    its median is 0.67 of the sd, and seeds' bins have heavy tails). Seeds
//    differ most where the curve falls fast (one a little ahead of another
//    along the axis): where the references' median moves over a bin by more
//    than twice the bin's noise, the bin is steep, and a flat bin's band
//    pools the spread of flat bins only (once there are 3), so the spread of
//    a steep start does not widen the band where the curve has flattened;
//    and widened for the few degrees of freedom behind it at the first
//    bins (k - 1 a bin seen): Student's t over the normal's quantile, 6.5x
//    at the first bin with two references, 1.14x at the tenth, 1.05x at
//    the 25th;
//  - with two, the larger of both;
// never below min_half_width / band_sigmas (curves that agree to the last
// digit do not make a band of zero width).
//
// A run whose warmup ended later on the axis than its references' (another
// batch size on the token axis: the same warmup steps are more tokens) is
// behind them at first, its LR having risen over more of the data, and
// catches up over about as much again: its first records, as far along the
// axis as its warmup's end lies past theirs, are not judged. Only for a run
// seen from its warmup's end (a resumed attempt is judged at once).
//
// Each bin also carries the run's learning rate against the references':
// seeds of one recipe share their schedule to the digit, so a ratio away
// from 1 says the run is another recipe (the LR 10x of a config gone wrong),
// whatever its loss does. It is taken at the same x and at the same step,
// and the one nearer 1 is kept: a schedule written in steps, as most are,
// puts another batch size's LR elsewhere on the token axis. A bin where the
// run's LR is its references' at the same step but not at the same tokens
// is not judged on the token axis: the run is at another point of its
// schedule there (mid decay where they had annealed), and its loss at those
// tokens is not its recipe's.
//
// Pure and single-threaded: no I/O, no clock.
#ifndef TRAINWATCH_SERVER_HEALTH_SIGNALS_BASELINE_BAND_H_
#define TRAINWATCH_SERVER_HEALTH_SIGNALS_BASELINE_BAND_H_

#include <array>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

// What a run is compared on.
enum class BaselineMetric { kLoss, kGradNorm, kLogZ, kMaxAttnLogit };
inline constexpr size_t kBaselineMetricCount = 4;
inline constexpr std::array<BaselineMetric, kBaselineMetricCount> kBaselineMetrics = {
    BaselineMetric::kLoss, BaselineMetric::kGradNorm, BaselineMetric::kLogZ,
    BaselineMetric::kMaxAttnLogit};

// "loss", "grad_norm", "log_z", "max_attn_logit" (the StepRecord fields).
const char* BaselineMetricName(BaselineMetric metric);
std::optional<BaselineMetric> BaselineMetricByName(std::string_view name);
// The record's value of `metric` in the band's space (the log of a loss,
// norm or logit; log Z as it is); nullopt when absent, not finite, or not
// positive where a log is taken.
std::optional<double> BaselineValue(BaselineMetric metric, const v1::StepRecord& r);
// A value of the band's space in the metric's own units.
double BaselineUnits(BaselineMetric metric, double value);
// The record's learning rate; nullopt when absent, not finite or not positive.
std::optional<double> BaselineLr(const v1::StepRecord& r);

enum class BaselineAxis { kStep, kTokens };
const char* BaselineAxisName(BaselineAxis axis);

// One post-warmup record of a reference run, as the band reads it.
struct ReferencePoint {
  uint64_t step = 0;
  std::optional<uint64_t> tokens;
  // In the band's space; NaN: absent.
  std::array<float, kBaselineMetricCount> value{};
  // The learning rate (BaselineLr); NaN: absent.
  float lr = std::numeric_limits<float>::quiet_NaN();
};

// One reference run: its post-warmup lead records in step order.
struct ReferenceRun {
  v1::BaselineRef ref;
  std::vector<ReferencePoint> points;
  // Every point carries tokens.
  bool HasTokens() const;
};

// The reference runs of one run, and where they come from ("set",
// "run_start", "previous_attempt").
struct BaselineReferences {
  std::vector<ReferenceRun> runs;
  std::string source;
};

// "run@1, other@0".
std::string DescribeRefs(const BaselineReferences& refs);

struct BandOptions {
  uint32_t bin_steps = 20;          // records of the run per bin
  double band_sigmas = 2.0;         // the band's half-width, in residual sds
  // In the band's space: 2% of a loss, about what seeds of one recipe
  // differ by (tools/lab/baseline_lab.py measures it).
  double min_half_width = 0.02;
  uint32_t spread_bins = 25;        // bins the references' spread is pooled over
  // An LR ratio beyond [1 / lr_changed, lr_changed] is another recipe: a
  // schedule's own steps and float rounding stay well inside it.
  double lr_changed = 1.25;
};

// A ratio of the run's to its references' (an LR, tokens a step) beyond
// [1 / limit, limit]: the run is not their recipe in that respect. False
// for NaN (unknown).
inline bool RatioChanged(double ratio, double limit = BandOptions{}.lr_changed) {
  return ratio > limit || ratio < 1 / limit;
}

// One judged bin. value, ref_median, lo and hi are in the band's space.
struct BandBin {
  double x = 0;                     // the centre of the bin's x range
  double x_first = 0, x_last = 0;
  uint64_t first_step = 0, last_step = 0;
  double value = 0;
  double ref_median = 0;
  double lo = 0, hi = 0;
  double z = 0;                     // (value - ref_median) / residual sd
  // The same against the references' spread as estimated, without the
  // widening for its few degrees of freedom at the first bins (z is the
  // band's). The judge of a run known not to be a seed reads it.
  double z_as_estimated = 0;
  double half_width = 0;            // (hi - lo) / 2
  int refs = 0;                     // references that covered it
  // The run's median LR over the references' in the bin; NaN when either
  // has none.
  double lr_ratio = std::numeric_limits<double>::quiet_NaN();
  bool outside() const { return value < lo || value > hi; }
  // The run's LR is not its references' (see BandOptions::lr_changed).
  bool lr_changed(double limit = BandOptions{}.lr_changed) const {
    return RatioChanged(lr_ratio, limit);
  }
};

// The band of one metric on one axis, fed the run's post-warmup records.
class BaselineBand {
 public:
  // `refs` must not be null; `warmup_steps`: the run's (RunStart's).
  BaselineBand(BaselineMetric metric, BaselineAxis axis,
               std::shared_ptr<const BaselineReferences> refs, uint64_t warmup_steps,
               BandOptions options = {});

  // A post-warmup record of the run, in step order. Returns the bin it
  // closed, when the references cover it. A record without the metric (or
  // without tokens on the token axis) is left out, and so is one the run's
  // longer warmup leaves behind (above).
  std::optional<BandBin> Add(const v1::StepRecord& record);
  // Drops the bin being filled (a rewind to an earlier step).
  void Reset();

  BaselineMetric metric() const { return metric_; }
  BaselineAxis axis() const { return axis_; }

 private:
  struct Sample {
    uint64_t step;
    double x;
    double value;
    double lr;  // NaN: absent
  };
  std::optional<BandBin> Close();
  // The reference's median over [x0, x1] and the count of its points there;
  // nullopt when it does not cover the range.
  std::optional<std::pair<double, int>> RefValue(size_t ref, double x0, double x1) const;
  // The reference's median LR over its points whose x is in [x0, x1]; NaN
  // when it has none there.
  double RefLr(size_t ref, double x0, double x1) const;
  // How far the references move over one bin's width about [x0, x1]: the
  // median over them of half the change from the width before the bin to
  // the width after (from the bin itself at a reference's start); 0 where
  // none covers the width after.
  double RefSlope(double x0, double x1) const;
  // ... whose step is in [first, last] (its points are in step order).
  double RefLrBySteps(size_t ref, uint64_t first, uint64_t last) const;

  const BaselineMetric metric_;
  const BaselineAxis axis_;
  const std::shared_ptr<const BaselineReferences> refs_;
  const BandOptions options_;
  const uint64_t warmup_steps_;
  // The references' warmups' end on the axis: their first point's x, the
  // latest (NaN: none).
  double refs_start_x_ = std::numeric_limits<double>::quiet_NaN();
  // Where the run is judged from on the axis, set by its first record.
  std::optional<double> judge_from_;
  // Per reference: its points' x and value (finite values only), x sorted,
  // and its noise (robust sd of one record).
  struct RefCurve {
    std::vector<double> x, v;
    std::vector<float> lr;  // beside x; NaN: absent
    double noise = 0;
  };
  std::vector<RefCurve> curves_;
  std::vector<Sample> bin_;
  // The run's successive differences (the last few hundred), for its noise.
  std::deque<double> run_diffs_;
  std::optional<double> last_value_;
  std::deque<double> spreads_;  // the references' variance in recent bins
  std::deque<double> flat_spreads_;  // ... in recent bins where their median is flat
};

// The axis a run is compared on: tokens when the run's record and every
// reference carry them (or `wanted` says so and they do), else the step.
BaselineAxis ChooseAxis(const v1::StepRecord& first_record,
                        const BaselineReferences& refs,
                        std::optional<BaselineAxis> wanted = std::nullopt);

// The one-sided CUSUMs on a band's standardised residual, upward (worse:
// for every metric a rise is the failure's direction) and downward (better),
// S_up = max(0, S_up + z - k) and S_down = max(0, S_down - z - k) per bin,
// with k the band's half-width (2 sds): they add up how far and how long the
// run is outside the band, so a healthy seed that sits a sd off its
// references all along is no alarm; the threshold is for the false-alarm
// rate of change.arl0 (counted in records, so arl0 / bin_steps bins). The
// episode's onset is the first step of the first bin outside the band since
// the statistic last stood at 0 (else of the bin it left 0 in).
class ResidualCusum {
 public:
  ResidualCusum(double arl0_records, uint32_t bin_steps, double k = BandOptions{}.band_sigmas);

  struct Verdict {
    bool worse = false;       // the upward CUSUM is past its threshold
    bool better = false;      // the downward one is
    uint64_t onset_step = 0;  // of the side that holds (worse first)
    uint64_t better_onset_step = 0;  // of the better side, when it holds
    // Bins in a row beyond twice the band on the worse side.
    uint32_t beyond_twice = 0;
  };
  Verdict Add(const BandBin& bin);
  void Reset();
  double threshold() const { return threshold_; }

 private:
  struct Side {
    double s = 0;
    uint64_t onset = 0;         // where it left 0
    uint64_t first_outside = 0; // 0: none since
    bool alarmed = false;       // past the threshold; holds until s is 0
    // Where the side's episode began: its first bin outside the band, else
    // where it left 0.
    uint64_t Onset() const { return first_outside != 0 ? first_outside : onset; }
  };
  static bool Step(Side& side, double increment, const BandBin& bin, bool outside,
                   double threshold);

  double threshold_;
  double k_;
  Side up_, down_;
  uint32_t beyond_twice_ = 0;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_SIGNALS_BASELINE_BAND_H_
