// LossSpike's rule (docs/detectors.md): the loss jumps far above its recent level
// and stays up for a few steps, the PaLM / BLOOM kind of spike that needs a
// person (a restart before it, skipping its batches). A gradient spike that
// clipping absorbed leaves the loss where it was and is not one.
//
// Any loss convention. The recent level is the median of the last
// `recent_steps` losses, their spread a robust sd (the larger of 1.4826 x
// MAD and the 90th percentile absolute deviation / 1.645: the second still
// measures a loss more than half of whose values are equal, as when it is
// printed with few digits, and is wider for a loss with a long tail on one
// side) and their resolution the smallest positive gap between two of them
// (one printing or rounding step). A step is high when the loss is at least
// max(sigmas x sd, min_quanta x resolution) above the level: a jump must be
// large against the loss's own spread and resolution, so one quantization
// step of a policy loss printed as 0.0001 never is. When every recent loss
// is > 0 (a language-model loss, DPO, a reward model) the noise is roughly
// multiplicative and the step must also be high in log space: its log at
// least max(log(min_ratio), sigmas x log sd) above the median log loss, log
// sd being 1.4826 x the MAD of the log losses. Losses that reach 0 or go
// below (RL policy losses) have no meaningful ratio and are judged linearly.
//
// stay_steps high losses among the first stay_window losses from a high one
// (records, not step numbers: a sparsely logged loss counts its own
// records) make a spike, whose onset is that first high step (a spike's
// loss may dip under the line for a step); fewer is a hard batch, reported
// when its window closes. A spike lasts while the loss keeps coming back
// above the line, and ends with two losses in a row under it. High steps
// do not enter the history (a spike cannot raise its own reference),
// unless the loss stays up for longer than the history is long: then it is
// the new level. Nor, once a spike is named, does its aftermath until the
// loss is calm: calm_steps steps in a row under the calm line (in log
// space max(1.2x, 2 robust sd) above the level, else 2/3 of the line),
// which then enter together (a recovery tail at 1.5-3x for 10-50
// steps would widen the spread the next spike is judged against); a loss
// up again before that is the same spike, not a new one. The statistics
// are refreshed every `refresh_steps` from a sorted copy of the history,
// brought up to date at each refresh by merges, and before judging a step
// at least kFreshFraction of the way to the line (a loss falling 8x over
// its history moves them within a few steps); the median is read and each
// deviation quantile found by a short binary search.
//
// Pure and not thread-safe: one instance per run.
#ifndef TRAINWATCH_SERVER_HEALTH_SIGNALS_LOSS_SPIKE_H_
#define TRAINWATCH_SERVER_HEALTH_SIGNALS_LOSS_SPIKE_H_

#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

namespace trainwatch {

class LossSpikeRule {
 public:
  struct Options {
    uint32_t recent_steps = 100;  // history of losses for the level
    uint32_t min_steps = 50;      // history before a spike can be named
    double sigmas = 6.0;          // above the level by this many robust sd,
    // In log space (every loss > 0: language-model, DPO, reward losses) the
    // log rule decides, by this many robust sd of the log losses (their
    // MAD's), and the linear rule only guards the printed resolution.
    double log_sigmas = 4.0;
    double min_quanta = 10.0;     // by this many resolution steps,
    double min_ratio = 1.5;       // and, in log space, by this factor
    uint32_t stay_steps = 3;      // high steps ...
    uint32_t stay_window = 5;     // ... among this many from the first
    uint32_t refresh_steps = 8;   // the statistics are recomputed this often
    double min_sd = 0.005;        // floor on the robust sd of the log losses
    uint32_t calm_steps = 5;      // a spike's aftermath ends after this many calm steps
  };

  // The recent losses at the last refresh.
  struct Recent {
    double median = 0.0;      // the level
    double sd = 0.0;          // robust sd (see above)
    double resolution = 0.0;  // smallest positive gap; 0: all equal
    bool log_space = false;   // all > 0: the log statistics are set
    double log_median = 0.0;  // median of the log losses
    double log_sd = 0.0;      // 1.4826 x their MAD, floored at min_sd
  };

  // An episode whose window passed with fewer than stay_steps high losses.
  struct HardBatch {
    uint64_t onset_step = 0;  // its first high step
    uint32_t high_steps = 0;  // 1 .. stay_steps - 1
    // Its highest loss: the ratio to the level in log space, else the jump
    // above it.
    double peak = 0.0;
  };

  struct Result {
    bool high = false;        // this step is above the spike line
    bool in_episode = false;  // a spike (or a hard batch) is under way
    bool fired_now = false;   // this step completed stay_steps high steps
    uint64_t onset_step = 0;  // first high step of the current episode
    bool log_space = false;   // judged in log space (ratio is meaningful)
    double level = 0.0;       // the recent level, a loss (when high)
    double ratio = 0.0;       // loss / level (when high, in log space)
    double sd = 0.0;          // the recent robust sd (when high)
    double resolution = 0.0;  // the recent resolution (when high)
    // Set on the loss that closed a hard batch's window (the window's last).
    std::optional<HardBatch> hard_batch;
  };

  explicit LossSpikeRule(const Options& options)
      : options_(options), log_min_ratio_(std::log(options.min_ratio)) {}

  // Adds a finite loss; nullopt when it says nothing (too little history, a
  // non-finite loss).
  std::optional<Result> Add(uint64_t step, double loss);
  void Reset();

  const Options& options() const { return options_; }
  const std::optional<Recent>& recent() const { return recent_; }

 private:
  struct Sample {
    double loss;
    double log_loss;  // -inf for a loss <= 0
  };

  // x is at least `fraction` of the way from the level to the spike line.
  bool Above(const Sample& x, double fraction) const;
  // x is under the calm line: a spike's aftermath has come back.
  bool Calm(const Sample& x) const;
  void Push(const Sample& sample);
  // Brings sorted_ up to date; returns the smallest positive gap between
  // two of its losses (0: all equal).
  double UpdateSorted();
  void Refresh();

  Options options_;
  double log_min_ratio_;
  std::vector<Sample> history_;  // ring
  std::vector<Sample> sorted_;   // the history at the last refresh, by loss
  std::vector<Sample> entered_;  // pushed since then
  std::vector<Sample> left_;     // evicted since then
  size_t next_ = 0;
  uint32_t since_refresh_ = 0;
  std::optional<Recent> recent_;
  double line_ = 0.0;      // loss - median must reach this ...
  double log_line_ = 0.0;  // ... and, in log space, log loss - log_median this
  double calm_log_line_ = 0.0;  // in log space, calm under this
  // The current episode: its first high step, its high steps so far, the
  // last of them and whether it became a spike.
  bool in_episode_ = false;
  uint64_t episode_onset_ = 0;
  uint32_t episode_highs_ = 0;
  uint32_t episode_seen_ = 0;   // losses since its onset, the onset's included
  uint32_t lows_in_row_ = 0;    // a named spike's losses under the line in a row
  double episode_peak_ = 0.0;   // as HardBatch::peak
  bool episode_fired_ = false;
  // From a spike's naming: it and its aftermath are kept out of the
  // history until calm_steps steps in a row (held in calm_) are under
  // kCalmFraction of the line, or the history's length after its onset.
  bool calming_ = false;
  std::vector<Sample> calm_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_SIGNALS_LOSS_SPIKE_H_
