// LossSpike's rule (DESIGN.md §4): the loss jumps far above its recent level
// and stays up for a few steps, the PaLM / BLOOM kind of spike that needs a
// person (a restart before it, skipping its batches). A gradient spike that
// clipping absorbed leaves the loss where it was and is not one.
//
// Works in log space (losses are positive and their noise is roughly
// multiplicative): the recent level is the median of the last
// `recent_steps` log losses and its noise their robust sd (1.4826 x MAD),
// refreshed every `refresh_steps` from a sorted copy of the history,
// brought up to date at each refresh: the median is read and the MAD found
// by a short binary search (~70 ns a step in all, against ~125 ns with two
// selections of the history a refresh). A step is high when its log loss is
// at least max(log(min_ratio), sigmas x sd) above that level; stay_steps high
// steps in a row make a spike, whose onset is the first of them. High steps
// do not enter the history (a spike cannot raise its own reference), unless
// the loss stays up for longer than the history is long: then it is the new
// level.
//
// Pure and not thread-safe: one instance per run.
#ifndef TRAINWATCH_SERVER_HEALTH_LOSS_SPIKE_H_
#define TRAINWATCH_SERVER_HEALTH_LOSS_SPIKE_H_

#include <cstdint>
#include <optional>
#include <vector>

namespace trainwatch {

class LossSpikeRule {
 public:
  struct Options {
    uint32_t recent_steps = 100;  // history of log losses for the level
    uint32_t min_steps = 50;      // history before a spike can be named
    double sigmas = 6.0;          // above the level by this many robust sd ...
    double min_ratio = 1.25;      // ... and by at least this factor
    uint32_t stay_steps = 3;      // high steps in a row
    uint32_t refresh_steps = 8;   // the level is recomputed this often
    double min_sd = 0.005;        // floor on the robust sd (log space)
  };

  struct Result {
    bool high = false;        // this step is above the spike line
    bool fired_now = false;   // this step completed stay_steps high steps
    uint64_t onset_step = 0;  // first high step of the current run of them
    double ratio = 0.0;       // loss / recent level (when high)
    double level = 0.0;       // the recent level, a loss (when high)
  };

  explicit LossSpikeRule(const Options& options) : options_(options) {}

  // Adds a finite, positive loss; nullopt when it says nothing.
  std::optional<Result> Add(uint64_t step, double loss);
  void Reset();

  // The recent level (a log loss) and its robust sd at the last refresh.
  const std::optional<double>& median_log() const { return median_; }
  double sd() const { return sd_; }

 private:
  void Push(double log_loss);
  void UpdateSorted();
  void Refresh();

  Options options_;
  std::vector<double> history_;  // ring of log losses
  std::vector<double> sorted_;   // the history at the last refresh, in order
  std::vector<double> entered_;  // pushed since then
  std::vector<double> left_;     // evicted since then
  size_t next_ = 0;
  uint32_t since_refresh_ = 0;
  std::optional<double> median_;
  double sd_ = 0.0;
  uint32_t high_run_ = 0;
  uint64_t high_since_ = 0;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_LOSS_SPIKE_H_
