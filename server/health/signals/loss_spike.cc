#include "health/signals/loss_spike.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

namespace trainwatch {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kMadToSd = 1.4826;  // a normal's sd / its MAD
// A normal's sd / its 90th percentile absolute deviation (z at 0.95).
constexpr double kQ90ToSd = 1.0 / 1.6449;
// A step this far towards the line (a fraction of it) is judged on fresh
// statistics.
constexpr double kFreshFraction = 0.5;
// A spike's aftermath is calm under 2/3 of the line in linear terms and,
// in log space, under max(1.2x, 2 robust sd of the log losses) above the
// level: a loss that came back only to 1.3x its level after a spike (a
// partial recovery, common after a hard batch's spike) is not back, and
// the next spike must not be judged against the level before this one
// (held-out spike families: 3 of 4 false spikes were that).
constexpr double kCalmFraction = 2.0 / 3.0;
constexpr double kCalmRatio = 1.2;
constexpr double kCalmSigmas = 2.0;

// The j-th smallest (from 0) of the absolute deviations of n sorted values
// v(0) <= ... <= v(n - 1) from their upper median m = v(n / 2), for j >=
// n / 2 (j = n / 2: the MAD, as MedianOf() of the deviations). The
// deviations grow outwards from n / 2 (|v - m| rounds to exactly m - v below
// and v - m above, both monotone), so the j + 1 smallest of them are a window
// [s, s + j] of the sorted values, s <= n - 1 - j, and the j-th smallest is
// the least over s of max(m - v(s), v(s + j) - m). The first term falls with
// s, the second grows: search for the first s where the second is the
// larger; the least is there or just before.
template <typename Value>
double NthDeviation(size_t n, size_t j, Value v) {
  const double m = v(n / 2);
  size_t lo = 0, count = n - j;  // s in [lo, lo + count)
  while (count > 0) {
    const size_t half = count / 2, s = lo + half;
    const bool before = v(s + j) - m < m - v(s);
    lo = before ? s + 1 : lo;
    count = before ? count - half - 1 : half;
  }
  double d = kInf;
  if (lo < n - j) d = v(lo + j) - m;
  if (lo > 0) d = std::min(d, m - v(lo - 1));
  return d;
}

}  // namespace

std::optional<LossSpikeRule::Result> LossSpikeRule::Add(uint64_t step,
                                                        double loss) {
  if (!std::isfinite(loss)) return std::nullopt;
  loss += 0.0;  // -0 (a printed "-0.0000") is 0
  const Sample x{loss, loss > 0 ? std::log(loss) : -kInf};
  if (!recent_.has_value() || history_.size() < options_.min_steps) {
    Push(x);
    return std::nullopt;
  }
  // A step near the line is judged on the statistics of the history as it
  // is now, not as it was at the last refresh: a loss that falls 10x in its
  // window moves its median and spread within the refresh's few steps.
  if (since_refresh_ > 0 && Above(x, kFreshFraction)) Refresh();
  const Recent& r = *recent_;
  Result out;
  out.high = Above(x, 1.0);
  // The window counts losses, not step numbers: a loss logged every 10
  // steps has its spike in 3 of 5 of its records too.
  if (in_episode_) ++episode_seen_;
  if (in_episode_ && !out.high && episode_fired_ && ++lows_in_row_ >= 2) {
    in_episode_ = false;  // a spike ends with two losses in a row under the line
  }
  if (out.high) {
    out.log_space = r.log_space;
    out.level = r.median;
    if (r.log_space) out.ratio = loss / r.median;
    out.sd = r.sd;
    out.resolution = r.resolution;
    if (!in_episode_ && calming_) {
      // Up again before the loss calmed: the same spike, not a new one.
      in_episode_ = true;
    } else if (!in_episode_) {
      in_episode_ = true;
      episode_onset_ = step;
      episode_highs_ = 0;
      episode_seen_ = 1;
      episode_peak_ = 0.0;
      episode_fired_ = false;
    }
    lows_in_row_ = 0;
    ++episode_highs_;
    episode_peak_ = std::max(episode_peak_, r.log_space ? out.ratio : loss - r.median);
    out.fired_now = !episode_fired_ && episode_highs_ >= options_.stay_steps &&
                    episode_seen_ <= options_.stay_window;
    if (out.fired_now) {
      // A spike and its aftermath stay out of the history until the loss
      // has calmed: its recovery tail (1.5-3x for 10-50 steps) would widen
      // the spread the next spike is judged against.
      episode_fired_ = true;
      calming_ = true;
    }
    calm_.clear();
    // Up for longer than the history holds: that is the new level.
    if (step - episode_onset_ >= options_.recent_steps) Push(x);
  } else if (calming_) {
    // Calm steps enter once calm_steps of them come in a row; a tail longer
    // than the history is a new level and enters as it comes. (While it
    // calms no new episode starts: episode_onset_ is the spike's.)
    if (step - episode_onset_ >= options_.recent_steps) {
      calming_ = false;
      Push(x);
    } else if (!Calm(x)) {
      calm_.clear();
    } else {
      calm_.push_back(x);
      if (calm_.size() >= options_.calm_steps) {
        calming_ = false;
        for (const Sample& c : calm_) Push(c);
      }
    }
  } else {
    Push(x);
  }
  // The window passed with fewer than stay_steps high losses: a hard batch
  // (one or two high steps and back), listed apart, not a spike. A high
  // loss after it starts an episode of its own.
  if (in_episode_ && !episode_fired_ && episode_seen_ >= options_.stay_window) {
    in_episode_ = false;
    out.hard_batch = HardBatch{episode_onset_, episode_highs_, episode_peak_};
  }
  out.in_episode = in_episode_;
  out.onset_step = episode_onset_;
  return out;
}

bool LossSpikeRule::Calm(const Sample& x) const {
  const Recent& r = *recent_;
  if (r.log_space) return x.log_loss - r.log_median < calm_log_line_;
  return !Above(x, kCalmFraction);
}

bool LossSpikeRule::Above(const Sample& x, double fraction) const {
  const Recent& r = *recent_;
  return x.loss - r.median >= fraction * line_ &&
         (!r.log_space || x.log_loss - r.log_median >= fraction * log_line_);
}

void LossSpikeRule::Push(const Sample& sample) {
  const size_t cap = std::max<uint32_t>(options_.recent_steps, 1);
  if (history_.size() < cap) {
    history_.push_back(sample);
  } else {
    left_.push_back(history_[next_]);
    history_[next_] = sample;
    next_ = (next_ + 1) % cap;
  }
  entered_.push_back(sample);
  if (!recent_.has_value() || ++since_refresh_ >= options_.refresh_steps) {
    Refresh();
  }
}

double LossSpikeRule::UpdateSorted() {
  // The few values that entered since the last refresh go in, in one pass,
  // then those that left come out (any copy of an equal loss will do: its
  // log is equal too), in another. Each pass walks the ~100 values with a
  // branch that changes only at the few values moved, so it is predicted:
  // ~2 cycles a value, where binary searches (one mispredict in two, or a
  // chain of dependent loads without branches) cost several times as much.
  thread_local std::vector<Sample> merged;  // scratch, shared by the runs
  const auto by_loss = [](const Sample& a, const Sample& b) {
    return a.loss < b.loss;
  };
  std::sort(entered_.begin(), entered_.end(), by_loss);
  merged.resize(sorted_.size() + entered_.size());
  const Sample* in = sorted_.data();
  const Sample* const end = in + sorted_.size();
  Sample* to = merged.data();
  for (const Sample& v : entered_) {
    while (in != end && !(v.loss < in->loss)) *to++ = *in++;
    *to++ = v;
  }
  std::copy(in, end, to);
  entered_.clear();
  // Each value that left is in merged (it entered before it left); the
  // walk goes past one copy of each, and finds the smallest positive gap
  // between the values it keeps.
  std::sort(left_.begin(), left_.end(), by_loss);
  left_.push_back(Sample{kInf, kInf});  // a sentinel: no loss is past it
  sorted_.resize(merged.size());
  const Sample* gone = left_.data();
  to = sorted_.data();
  double last = -kInf, gap = kInf;
  for (const Sample& x : merged) {
    if (!(x.loss < gone->loss)) {  // x is the next one that left
      ++gone;
      continue;
    }
    *to++ = x;
    const double d = x.loss - last;
    if (d > 0 && d < gap) gap = d;  // rarely true: predicted
    last = x.loss;
  }
  sorted_.resize(to - sorted_.data());
  left_.clear();
  return gap < kInf ? gap : 0.0;
}

void LossSpikeRule::Refresh() {
  since_refresh_ = 0;
  Recent r;
  r.resolution = UpdateSorted();
  const Sample* v = sorted_.data();
  const size_t n = sorted_.size(),
               k = n / 2;  // the upper median, as MedianOf()
  const auto loss = [v](size_t i) { return v[i].loss; };
  r.median = v[k].loss;
  // Two robust spreads; the larger: the MAD's, and for a loss more than
  // half of whose values are equal (a few printed digits, steps without a
  // learning signal: a MAD of 0) or one with a long tail on one side (a
  // pairwise loss near 0), the 90th percentile deviation's.
  r.sd = std::max(kMadToSd * NthDeviation(n, k, loss),
                  kQ90ToSd * NthDeviation(n, n * 9 / 10, loss));
  r.log_space = v[0].loss > 0;
  if (r.log_space) {
    // log is monotone: the log losses are in order too.
    r.log_median = v[k].log_loss;
    r.log_sd = std::max(
        kMadToSd * NthDeviation(n, k, [v](size_t i) { return v[i].log_loss; }),
        options_.min_sd);
  }
  // All equal: neither a spread nor a resolution to judge a jump against.
  // In log space the linear spread is not used: the 90th percentile
  // deviation of a language-model loss is the hard batches' and the last
  // spike's (10% of the window), 2.5-20x in the lab, where the MAD of the
  // logs is the loss's own noise.
  const double linear_sd = r.log_space ? 0.0 : options_.sigmas * r.sd;
  line_ = r.resolution > 0 ? std::max(linear_sd, options_.min_quanta * r.resolution)
                           : kInf;
  log_line_ = std::max(log_min_ratio_, options_.log_sigmas * r.log_sd);
  calm_log_line_ = std::max(std::log(kCalmRatio), kCalmSigmas * r.log_sd);
  recent_ = r;
}

void LossSpikeRule::Reset() {
  history_.clear();
  sorted_.clear();
  entered_.clear();
  left_.clear();
  next_ = 0;
  since_refresh_ = 0;
  recent_.reset();
  in_episode_ = false;
  calming_ = false;
  calm_.clear();
}

}  // namespace trainwatch
