// Sequential change detection for the level signals of docs/detectors.md (log grad
// norm, clip and skip rates, max attention logit, log Z): a windowed median or
// fraction needs about W/2 steps to move past its threshold after a sudden
// change; a CUSUM against the run's baseline names a persistent shift within
// tens of steps, at a false-alarm rate set by its in-control average run
// length (ARL0, in steps).
//
// Each detector pairs an upward CUSUM that names the change with a downward
// one, started when it fires, that says when the level is clearly back below
// a lower resolve level (hysteresis): a quantity hovering at its threshold
// gives one alert, not a flapping pager.
//
// Pure and not thread-safe: one instance per run and signal, fed in step
// order by the run's pipeline.
#ifndef TRAINWATCH_SERVER_HEALTH_SIGNALS_CHANGE_DETECTION_H_
#define TRAINWATCH_SERVER_HEALTH_SIGNALS_CHANGE_DETECTION_H_

#include <cstdint>
#include <optional>
#include <vector>

namespace trainwatch {

// The threshold h of a one-sided CUSUM S = max(0, S + z - k) on standardized
// values (z ~ N(0, 1) in control) whose in-control average run length is
// `arl0` steps, by Siegmund's approximation
//   ARL0 = (exp(2 k b) - 2 k b - 1) / (2 k^2),  b = h + 1.166.
double GaussianCusumThreshold(double k, double arl0);

// The threshold h of a CUSUM of log-likelihood ratios whose in-control mean
// increment is -kl (the Kullback-Leibler divergence of the two hypotheses):
// the same approximation with the exponent's root theta = 1,
//   ARL0 = (exp(b) - b - 1) / kl,  b = h + overshoot (taken as 0.5).
double LlrCusumThreshold(double kl, double arl0);

// One-sided CUSUM S = max(0, S + increment). The change point estimate is the
// first step after the statistic last stood at 0.
class Cusum {
 public:
  explicit Cusum(double threshold = 0.0) : threshold_(threshold) {}

  // Adds `increment` at `step`; true while the statistic is above the
  // threshold.
  bool Add(uint64_t step, double increment);
  void Reset() { statistic_ = 0.0; }
  double statistic() const { return statistic_; }
  double threshold() const { return threshold_; }
  uint64_t onset_step() const { return onset_step_; }

 private:
  double threshold_;
  double statistic_ = 0.0;
  uint64_t onset_step_ = 0;
};

// The fire / hold / resolve state of one level alert, from the increments of
// an upward CUSUM (evidence the level is above the fire level) and of a
// downward one (evidence it is below the resolve level). Idle: the upward
// CUSUM runs and fires. Firing: holds until the downward CUSUM is convinced;
// then the condition is false and, after `resolve_after_steps` more steps
// without a new upward alarm, the alert resolves (idle again).
class ShiftAlarm {
 public:
  struct State {
    bool holds = false;       // the alert's condition at this step
    bool fired_now = false;   // this step moved it from idle to firing
    uint64_t onset_step = 0;  // the change point of the current episode
  };

  ShiftAlarm(double up_threshold, double down_threshold,
             uint32_t resolve_after_steps)
      : up_(up_threshold),
        down_(down_threshold),
        resolve_after_steps_(resolve_after_steps) {}

  State Add(uint64_t step, double up_increment, double down_increment);
  // Forgets everything (a rewind before the baseline's end).
  void Reset();
  bool firing() const { return phase_ != Phase::kIdle; }
  const Cusum& up() const { return up_; }

 private:
  enum class Phase { kIdle, kFiring, kCooling };
  Cusum up_;
  Cusum down_;
  uint32_t resolve_after_steps_;
  Phase phase_ = Phase::kIdle;
  uint64_t onset_step_ = 0;
  uint64_t cooling_since_ = 0;
};

// The hysteresis of a level alert fed by several rules (a CUSUM, a windowed
// quantity, a forecast): it fires when a rule fires, holds while a rule still
// holds (each against its lower resolve threshold), and is idle again after
// resolve_after_steps without holding, when the alert tracker resolves it.
class Hysteresis {
 public:
  explicit Hysteresis(uint32_t resolve_after_steps)
      : resolve_after_steps_(resolve_after_steps) {}
  // The alert's condition at `step`.
  bool Update(uint64_t step, bool fires, bool holds);
  bool firing() const { return firing_; }
  void Reset() { firing_ = false; }

 private:
  uint32_t resolve_after_steps_;
  bool firing_ = false;
  uint64_t last_hold_step_ = 0;
};

// The median and robust standard deviation (1.4826 x MAD) of `values`
// (reordered); nullopt when empty.
struct RobustStats {
  double median = 0.0;
  double sd = 0.0;
};
std::optional<RobustStats> Robust(std::vector<double>& values);

// Change detection on a roughly gaussian signal x (a log norm, a log logit, or
// log Z in nats) against its baseline: names a persistent shift of `shift`
// (in x's units) or more within about min_steps steps.
//
// The baseline is the median and robust sd of the first `baseline_steps`
// values. The upward CUSUM runs on z = (x - median) / sd against the
// reference level shift - min(shift / 4, 2 sd), the level above which the
// statistic drifts upward; each z is clamped to the reference + h / min_steps
// (h from arl0), so no single value, however far out (a heavy tail, a 4-6x
// excursion), moves it by more than 1 / min_steps of the way: a shift must
// persist about min_steps steps. After the fire, a downward CUSUM with the
// same threshold looks for the level below resolve_ratio x the reference.
// `two_sided` watches x going down by the same amount too.
class LevelShiftDetector {
 public:
  struct Options {
    double shift = 0.6931471805599453;  // log(2): a 2x level, in log space
    double resolve_ratio = 0.8;         // of the reference level shift
    double arl0 = 1e6;                  // steps between false alarms
    uint32_t min_steps = 16;            // a shift must persist this long
    uint32_t baseline_steps = 1000;
    uint32_t resolve_after_steps = 100;
    double min_sd = 0.01;  // floor on the baseline's robust sd
    bool two_sided = false;
  };

  struct Result {
    bool holds = false;
    bool fired_now = false;
    uint64_t onset_step = 0;
    // The mean of x from the change point to this step (the level since the
    // change), and whether the shift is downward (two-sided only).
    double level = 0.0;
    bool downward = false;
  };

  explicit LevelShiftDetector(const Options& options);

  // Adds x at `step`; nullopt while the baseline is being taken.
  std::optional<Result> Add(uint64_t step, double x);
  // The job restarted at `step`: a rewind into the baseline retakes it.
  void RewindTo(uint64_t step);

  const std::optional<RobustStats>& baseline() const { return baseline_; }
  // The x level above which (below which, downward) evidence builds up.
  double reference() const { return reference_; }
  bool firing() const { return up_.alarm.firing() || down_.alarm.firing(); }

 private:
  struct Side {
    explicit Side(double h, uint32_t resolve_after)
        : alarm(h, h, resolve_after) {}
    ShiftAlarm alarm;
    double segment_sum = 0.0;  // x since the upward statistic left 0
    uint32_t segment_steps = 0;
  };
  Result AddSide(Side& side, uint64_t step, double z, double x);

  Options options_;
  std::vector<double> baseline_values_;
  uint64_t baseline_last_step_ = 0;
  std::optional<RobustStats> baseline_;
  double k_ = 0.0;          // the reference, in sd
  double h_ = 0.0;          // the CUSUM threshold
  double reference_ = 0.0;  // the reference, in x's units
  Side up_;
  Side down_;
};

// Change detection on a rate (clipped or skipped steps): a Bernoulli CUSUM of
// the log-likelihood ratio of p1 = 3 x threshold against p0 = threshold / 2,
// whose statistic drifts upward once the rate is above about the threshold.
// h comes from arl0 under p0. After the fire, a downward CUSUM (p1' =
// resolve_ratio x threshold / 2 against p0' = 2 x that) says when the rate is
// clearly below resolve_ratio x threshold.
class RateShiftDetector {
 public:
  struct Options {
    double threshold = 0.05;
    double resolve_ratio = 0.8;
    double arl0 = 1e6;
    uint32_t resolve_after_steps = 100;
  };

  struct Result {
    bool holds = false;
    bool fired_now = false;
    uint64_t onset_step = 0;
    double rate = 0.0;  // flagged share of the steps since the change point
  };

  explicit RateShiftDetector(const Options& options);

  Result Add(uint64_t step, bool flagged);
  void Reset();
  bool firing() const { return alarm_.firing(); }

 private:
  double up_hit_, up_miss_, down_hit_, down_miss_;  // LLR increments
  ShiftAlarm alarm_;
  uint32_t segment_hits_ = 0;  // since the upward statistic left 0
  uint32_t segment_steps_ = 0;
};

// Whether a rate alert's rate is clearly below its threshold again, judged
// from the fire on, whichever rule fired it: a Bernoulli CUSUM of the
// log-likelihood ratio of q1 = resolve_ratio x threshold / 2 against q0 =
// the threshold itself, h from arl0 under q0. Its statistic drifts upward
// once the rate is below about 0.65 x the threshold (resolve_ratio 0.8), and
// a rate hovering at the threshold convinces it once in about arl0 steps;
// a windowed share's lower line (0.8 x over W) is crossed by such a rate
// every few thousand steps (at a 1% threshold it is 0.6 sd below).
class RateFallTest {
 public:
  RateFallTest(double threshold, double resolve_ratio, double arl0);

  // Adds one step; true while convinced the rate is below.
  bool Add(uint64_t step, bool flagged) {
    return cusum_.Add(step, flagged ? hit_ : miss_);
  }
  // Forgets the evidence (at a fire).
  void Restart() { cusum_.Reset(); }

 private:
  double hit_, miss_;  // LLR increments
  Cusum cusum_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_SIGNALS_CHANGE_DETECTION_H_
