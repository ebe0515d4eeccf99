// The loss family (docs/detectors.md): LossSpike, every spike of the loss
// (info), and LossDivergence, a loss that did not come back (critical).
// Reads the lead stream only.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "health/detectors/internal.h"
#include "health/signals/loss_spike.h"

namespace trainwatch {
namespace {

// LossSpike names the PaLM / BLOOM kind of loss spike: an event per spike,
// with the batch ids of its high steps and, like a gradient spike, an entry
// in the spike list with its restart plan. A spike the loss recovers from
// is information (info); one that does not is LossDivergence's. A gradient
// spike that clipping absorbed leaves the loss where it was and stays
// GradNormSpike's. Any loss convention: a loss near 0 or below (an RL
// policy loss) is judged in linear terms, never on one printed quantum.
//
// LossDivergence catches a run that left its loss level for good, three
// ways: a spike whose level (the median of the last level_steps losses)
// is still >= spike_ratio x the level before it check_after_steps after
// its onset; a slow rise, no single step a spike (an LR too high, a
// constant schedule), of the level to >= ratio x the run's best level
// (counted from kSettleSteps levels into the run, warmup included) on
// sustain_steps steps in a row; and the same rise
// while it is under way, before it doubles: the level >= early_ratio x the
// best and still climbing (>= early_rise x the level level_steps steps
// before) on early_sustain_steps steps in a row (a loss that climbs 3x in
// 150 steps doubles only ~90 steps in). Judged in log space only: a loss
// that reaches 0 or below has no level to be a multiple of.
class Loss final : public Detector {
 public:
  explicit Loss(const HealthConfig& config)
      : rule_(LossSpikeRule::Options{
            .recent_steps = config.loss_spike.recent_steps,
            .min_steps = std::min<uint32_t>(50, config.loss_spike.recent_steps),
            .sigmas = config.loss_spike.sigmas,
            .log_sigmas = config.loss_spike.log_sigmas,
            .min_ratio = config.loss_spike.min_ratio,
            .stay_steps = config.loss_spike.stay_steps,
            .stay_window = config.loss_spike.stay_window}),
        level_steps_(config.loss_divergence.level_steps) {}

  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    const v1::StepRecord& r = ctx.record;
    // Warmup included: a run that diverges during its warmup (the lab's,
    // at steps 90-208 of 300) is the one that most needs a person, and a
    // falling loss never rises above the median of its recent values.
    if (!r.has_loss()) return;
    const std::optional<LossSpikeRule::Result> s = rule_.Add(r.step(), r.loss());
    if (std::isfinite(r.loss())) PushLevel(r.loss());
    if (s.has_value()) Spike(ctx, *s, sink);
    Divergence(ctx, sink);
  }

  // The recent level is the run's, which a restart does not change; the
  // divergence is judged afresh from the restart.
  void OnRewind(uint64_t step) override {
    high_batch_ids_.clear();
    fired_onset_.reset();
    pending_.reset();
    diverged_.reset();
    best_.reset();
    rising_steps_ = 0;
    climbing_steps_ = 0;
    past_levels_.clear();
  }

 private:
  static constexpr size_t kMaxBatchIds = 256;

  // A spike waiting for its check_after_steps verdict.
  struct Pending {
    uint64_t onset = 0;
    double level_before = 0.0;
    std::vector<int64_t> batch_ids;
  };
  // The run's best level so far (warmup included, once settled).
  struct Best {
    double level = 0.0;
    // The level to reach: >= ratio x best and sigmas standard errors of the
    // level (the loss's noise, a robust sd of the log losses, over
    // sqrt(level_steps)) above it.
    double rise_line = 0.0;
    double early_line = 0.0;  // the same with early_ratio: a rise under way
    uint64_t step = 0;
    uint64_t near_step = 0;  // the last step the level was near it
    double log_sd_at_best = 0.0;  // the robust sd of the log losses then
    double drawn_log_sd = -1.0;   // the noise the lines were drawn with
  };
  // What a divergence is judged against while it holds.
  struct Diverged {
    double reference = 0.0;
    uint64_t onset = 0;
    bool from_spike = false;
    bool climbing = false;  // named while the rise is under way
    // The step the run left its level: a spike that did not come back, or
    // the level doubled (nullopt while a climb is named before it doubled).
    std::optional<uint64_t> left_at;
  };

  void Spike(const StepContext& ctx, const LossSpikeRule::Result& s, AlertSink& sink) {
    const v1::StepRecord& r = ctx.record;
    if (s.high) {
      if (high_batch_ids_.empty()) onset_norm_ = r.grad_norm();
      for (int64_t id : r.batch_ids()) {
        if (high_batch_ids_.size() < kMaxBatchIds) high_batch_ids_.push_back(id);
      }
    }
    if (s.hard_batch.has_value()) {
      // One or two high losses and back: a hard batch, listed apart with
      // its batch ids (a data loader may want them), not a spike. Inside a
      // divergence the loss's jumps are the divergence's.
      if (!diverged_.has_value()) {
        sink.Spike(SpikeInfo{.kind = SpikeInfo::Kind::kHardBatch,
                             .step = s.hard_batch->onset_step,
                             .batch_ids = high_batch_ids_,
                             .high_steps = s.hard_batch->high_steps,
                             .loss_peak = s.hard_batch->peak,
                             .loss_level = rule_.recent()->median,
                             .peak_is_ratio = rule_.recent()->log_space});
      }
      high_batch_ids_.clear();
      return;
    }
    if (!s.in_episode) {
      // The loss is back: the spike's alert resolves at its recovery step,
      // and the next spike is an alert of its own.
      if (fired_onset_.has_value()) {
        sink.Resolve(AlertKind::kLossSpike, r.step());
        fired_onset_.reset();
      }
      high_batch_ids_.clear();
      return;
    }
    if (!s.high) return;
    if (!s.fired_now && !NamedEpisode(s)) return;  // not a spike (yet)
    // Once the run has left its level (a spike that did not come back, a
    // level >= ratio x the best on sustain_steps steps) for kDivergedSteps,
    // a spike of its loss is the divergence's: the run is named already,
    // and a diverged loss jumps often. Before that a spike is listed: it
    // may be how the divergence goes on (its batches are worth skipping);
    // and a climb named early, before it doubled, may carry spikes of its
    // own.
    if (s.fired_now && diverged_.has_value() && diverged_->left_at.has_value() &&
        r.step() >= *diverged_->left_at + kDivergedSteps) {
      return;
    }
    const std::vector<int64_t> ids =
        s.fired_now ? high_batch_ids_
                    : std::vector<int64_t>(r.batch_ids().begin(), r.batch_ids().end());
    // The peak: the ratio in log space; in linear terms (a ratio to a level
    // near 0 says nothing) the jump itself.
    const double peak = s.log_space ? s.ratio : r.loss() - s.level;
    sink.Event(AlertKind::kLossSpike, r.step(), peak, ids, [&] {
      const auto& c = ctx.config.loss_spike;
      const std::string plan = absl::StrFormat(
          "; batches and restart plan: trainwatchctl spikes (the checkpoint >= 100 "
          "steps before step %d)",
          s.onset_step);
      std::string description =
          s.log_space
              ? absl::StrFormat(
                    "loss %.4g at step %d is %.2fx its recent level %.4g "
                    "(median of the last %d losses): >= %gx and %g robust sd "
                    "of the log losses above it on %d of %d steps since step %d",
                    r.loss(), r.step(), s.ratio, s.level, c.recent_steps, c.min_ratio,
                    c.log_sigmas, c.stay_steps, c.stay_window, s.onset_step)
              : absl::StrFormat(
                    "loss %.4g at step %d is %.4g above its recent level %.4g "
                    "(median of the last %d losses; robust sd %.2g, resolution "
                    "%.2g): >= %g robust sd and >= %g resolution steps above it "
                    "on %d of %d steps since step %d",
                    r.loss(), r.step(), r.loss() - s.level, s.level, c.recent_steps,
                    s.sd, s.resolution, c.sigmas, rule_.options().min_quanta,
                    c.stay_steps, c.stay_window, s.onset_step);
      return AlertText{absl::StrFormat("Loss spike at step %d", s.onset_step),
                       description + plan, s.onset_step,
                       // What the lead rank computed: its machine (HostSuspect).
                       ctx.run.host};
    });
    if (s.fired_now) {
      fired_onset_ = s.onset_step;
      sink.Spike(SpikeInfo{.kind = SpikeInfo::Kind::kLoss,
                           .step = s.onset_step,
                           .grad_norm = onset_norm_,
                           .ratio_to_ema = 0.0,
                           .sigmas = 0.0,
                           .batch_ids = high_batch_ids_});
      if (s.log_space && !pending_.has_value() && !diverged_.has_value()) {
        pending_ = Pending{s.onset_step, s.level, high_batch_ids_};
      }
    }
  }

  // A high step of a spike already named extends its episode.
  bool NamedEpisode(const LossSpikeRule::Result& s) const {
    return fired_onset_.has_value() && *fired_onset_ == s.onset_step;
  }

  // The last level_steps finite losses, in arrival order and sorted: the
  // level (their upper median) is read each step without a selection.
  void PushLevel(double loss) {
    recent_.push_back(loss);
    sorted_.insert(std::upper_bound(sorted_.begin(), sorted_.end(), loss), loss);
    if (recent_.size() > level_steps_) {
      sorted_.erase(std::lower_bound(sorted_.begin(), sorted_.end(), recent_.front()));
      recent_.pop_front();
    }
  }

  void Divergence(const StepContext& ctx, AlertSink& sink) {
    const auto& c = ctx.config.loss_divergence;
    const v1::StepRecord& r = ctx.record;
    const std::optional<LossSpikeRule::Recent>& recent = rule_.recent();
    if (recent_.size() < c.level_steps || !recent.has_value() || !recent->log_space) {
      // A loss at or below 0 (RL): no level to be a multiple of.
      if (recent.has_value() && !recent->log_space) {
        pending_.reset();
        best_.reset();
        rising_steps_ = 0;
        climbing_steps_ = 0;
        past_levels_.clear();
      }
      Report(ctx, sink, std::nan(""));
      return;
    }
    const double level = sorted_[sorted_.size() / 2];
    if (!(level > 0)) {
      Report(ctx, sink, level);
      return;
    }

    // A spike that stayed.
    if (pending_.has_value() && r.step() >= pending_->onset + c.check_after_steps) {
      if (level >= c.spike_ratio * pending_->level_before) {
        diverged_ = Diverged{pending_->level_before, SpikeOnset(c), true, false, r.step()};
        spike_ids_ = pending_->batch_ids;
      }
      pending_.reset();
    }
    // A slow rise over the run's best level, warmup included: a run whose
    // loss climbs as its rising LR passes what it tolerates diverges inside
    // its warmup, and a best counted only after warmup would be taken from
    // the climb itself. The best is a settled level's: over the first
    // steps the loss falls fast and its level passes through lows a noisy
    // run does not hold.
    if (settle_steps_ <= kSettleSteps) ++settle_steps_;
    if (settle_steps_ > kSettleSteps) {
      if (!best_.has_value() || level < best_->level) {
        best_ = Best{level, 0.0, 0.0, r.step(), r.step(), recent->log_sd, -1.0};
      }
      // The loss's noise: the smaller of its spread when the best was set
      // and now. A window's spread carries its trend: a steep fall early
      // on (a log sd of 2: a 2x line at 4.6x the best for good), or the
      // climb being judged.
      double noise = std::min(best_->log_sd_at_best, recent->log_sd);
      // Near a line (the level over kNearBest x the best), the noise free
      // of any trend too: during a climb the window's spread is the climb's
      // (a log-linear climb of 4.7x in 350 steps drew the early line at
      // 1.75x, named 60 steps later than at 1.5x).
      if (level > kNearBest * best_->level) noise = std::min(noise, TrendFreeLogSd());
      if (noise != best_->drawn_log_sd) {
        // The rise's lines in loss terms, when the best or the noise moves
        // (no log a step).
        // The level is a median of level_steps losses: its own noise is the
        // losses' over sqrt(level_steps) (x1.25, a median's efficiency). A
        // step's noise (hard batches: 0.3-0.6 in log on a small noisy run)
        // put the 2x line far past 2x, and a falling loss's trend in the
        // window inflated it further.
        // A rise still under way is named on less evidence: its line keeps
        // a step's noise (a heavy-tailed DPO loss's level wanders 1.6x).
        const double level_noise = std::exp(
            c.sigmas * noise * kMedianSe / std::sqrt(static_cast<double>(c.level_steps)));
        const double step_noise = std::exp(c.sigmas * noise);
        best_->rise_line = best_->level * std::max(c.ratio, level_noise);
        best_->early_line = best_->level * std::max(c.early_ratio, step_noise);
        best_->drawn_log_sd = noise;
      }
      if (level <= kNearBest * best_->level) best_->near_step = r.step();
      // Once over the line, a dip of the level (a noisy run's hard batches
      // move a median of 20 too) does not restart the count unless it falls
      // clearly back, under kSustainFloor of the line.
      const bool rising = level >= best_->rise_line ||
                          (rising_steps_ > 0 && level >= kSustainFloor * best_->rise_line);
      rising_steps_ = rising ? rising_steps_ + 1 : 0;
      // The level level_steps steps ago (settled levels only).
      past_levels_.push_back(level);
      const double before = past_levels_.front();
      if (past_levels_.size() > c.level_steps) past_levels_.pop_front();
      // A climb under way has its latest losses over the line too: the
      // level lags them by half its length, and the aftermath of a few hard
      // batches lifts it for a while after the loss is back (a held-out run
      // with a hard batch every 15 steps: its level 1.5x the best and still
      // "climbing" at step 201, its latest losses at 1.16x).
      const bool climbing = past_levels_.size() > c.level_steps - 1 &&
                            level >= best_->early_line && level >= c.early_rise * before &&
                            LatestLevel() >= best_->early_line;
      climbing_steps_ = climbing ? climbing_steps_ + 1 : 0;
      // A spike under way has its own verdict, check_after_steps after its
      // onset (a spike of 10-20 steps lifts the level as a climb would),
      // unless the level was climbing well before it: the spike rule saw
      // the climb itself, late.
      const bool climbed =
          climbing_steps_ >= c.early_sustain_steps &&
          (!pending_.has_value() || RiseOnset(c) + c.level_steps < pending_->onset);
      const bool doubled = rising_steps_ >= c.sustain_steps;
      if ((doubled || climbed) && !diverged_.has_value()) {
        if (pending_.has_value() && doubled) {
          // A spike under way that the level confirms: it did not come back.
          diverged_ = Diverged{pending_->level_before, SpikeOnset(c), true, false, r.step()};
          spike_ids_ = pending_->batch_ids;
        } else {
          // A rise (a spike under way, if any, is the climb seen late).
          diverged_ = Diverged{best_->level, RiseOnset(c), false, !doubled};
          spike_ids_.clear();
        }
        pending_.reset();
      }
      if (diverged_.has_value() && doubled && !diverged_->left_at.has_value()) {
        diverged_->left_at = r.step();
      }
    }
    Report(ctx, sink, level);
  }

  // The median of the last kLatestSteps losses.
  double LatestLevel() const {
    std::array<double, kLatestSteps> last{};
    const size_t n = std::min(recent_.size(), kLatestSteps);
    std::copy(recent_.end() - static_cast<std::ptrdiff_t>(n), recent_.end(), last.begin());
    std::nth_element(last.begin(), last.begin() + n / 2, last.begin() + n);
    return last[n / 2];
  }

  // The loss's noise over its last level_steps losses without their trend:
  // the robust sd (1.4826 x MAD) of the successive log differences, over
  // sqrt(2) (a difference carries two steps' noise).
  double TrendFreeLogSd() {
    diffs_.clear();
    for (size_t i = 1; i < recent_.size(); ++i) {
      diffs_.push_back(std::log(recent_[i]) - std::log(recent_[i - 1]));
    }
    if (diffs_.size() < 2) return std::numeric_limits<double>::infinity();
    const auto mid = diffs_.begin() + static_cast<std::ptrdiff_t>(diffs_.size() / 2);
    std::nth_element(diffs_.begin(), mid, diffs_.end());
    const double center = *mid;
    for (double& d : diffs_) d = std::abs(d - center);
    std::nth_element(diffs_.begin(), mid, diffs_.end());
    return 1.4826 * *mid / std::sqrt(2.0);
  }

  // Where a rise began: the level (a median of level_steps) lags a change
  // by half its length behind the last step it was near its best.
  uint64_t RiseOnset(const decltype(HealthConfig::loss_divergence)& c) const {
    if (!best_.has_value()) return 0;
    const uint64_t lag = c.level_steps / 2;
    return std::max(best_->step, best_->near_step > lag ? best_->near_step - lag : 0);
  }

  // A divergence that began as a spike: the spike's onset, unless the level
  // was rising well before it (a drift the spike rule saw late).
  uint64_t SpikeOnset(const decltype(HealthConfig::loss_divergence)& c) const {
    const uint64_t rise = RiseOnset(c);
    return best_.has_value() && rise + c.level_steps < pending_->onset ? rise
                                                                       : pending_->onset;
  }

  void Report(const StepContext& ctx, AlertSink& sink, double level) {
    const auto& c = ctx.config.loss_divergence;
    const v1::StepRecord& r = ctx.record;
    if (diverged_.has_value() && std::isfinite(level) &&
        level < c.resolve_ratio * diverged_->reference) {
      diverged_.reset();
    }
    // A condition that does not hold says nothing to the tracker.
    if (!diverged_.has_value()) return;
    const double ratio = std::isfinite(level) ? level / diverged_->reference : 0.0;
    sink.Condition(AlertKind::kLossDivergence, r.step(), true, ratio, [&] {
      const Diverged& d = *diverged_;
      std::string how =
          d.from_spike
              ? absl::StrFormat(
                    "the loss spiked at step %d and did not come back: %d steps "
                    "later its level (median of the last %d losses) is %.4g, "
                    "%.2fx the level %.4g before the spike",
                    d.onset, r.step() - d.onset, c.level_steps, level, ratio,
                    d.reference)
              : d.climbing
              ? absl::StrFormat(
                    "the loss's level (median of the last %d losses) is %.4g at "
                    "step %d, %.2fx the run's best level %.4g, and "
                    "still climbing: >= %gx the best and >= %gx its level %d "
                    "steps before on %d steps in a row; it left the best level "
                    "after step %d",
                    c.level_steps, level, r.step(), ratio, d.reference, c.early_ratio,
                    c.early_rise, c.level_steps, c.early_sustain_steps, d.onset)
              : absl::StrFormat(
                    "the loss's level (median of the last %d losses) is %.4g at "
                    "step %d, %.2fx the run's best level %.4g, and "
                    ">= %gx it on %d steps in a row; it left the best level "
                    "after step %d",
                    c.level_steps, level, r.step(), ratio, d.reference, c.ratio,
                    c.sustain_steps, d.onset);
      std::string plan = absl::StrFormat(
          "; restart plan: the last checkpoint before step %d (trainwatchctl "
          "plan --run %s)",
          d.onset, ctx.run.run_id);
      if (!spike_ids_.empty()) {
        plan += absl::StrFormat(", skip the spike's batches (%d: trainwatchctl spikes)",
                                spike_ids_.size());
      }
      plan += ", and lower the learning rate";
      return AlertText{absl::StrFormat("Loss diverged after step %d", d.onset),
                       how + plan, d.onset, ctx.run.host};
    });
  }

  // A climb's latest losses: their median is over the early line too.
  static constexpr size_t kLatestSteps = 5;
  // A spike this many steps after the run left its level is the
  // divergence's, not listed.
  static constexpr uint64_t kDivergedSteps = 100;
  // The level counts as back at its best within this factor.
  static constexpr double kNearBest = 1.2;
  // A slow rise's count survives a dip of its level down to this share of
  // the line.
  static constexpr double kSustainFloor = 0.8;
  // A median's standard error over the mean's, for normal noise.
  static constexpr double kMedianSe = 1.2533;
  // Levels (from the run's first full level window, warmup included)
  // before the run's best level counts.
  static constexpr uint32_t kSettleSteps = 100;

  LossSpikeRule rule_;
  std::vector<int64_t> high_batch_ids_;  // of the current episode's high steps
  double onset_norm_ = 0.0;
  std::optional<uint64_t> fired_onset_;  // the onset of the last spike named

  size_t level_steps_;
  std::deque<double> recent_;  // the last level_steps finite losses
  std::vector<double> diffs_;  // TrendFreeLogSd's scratch
  std::vector<double> sorted_;  // the same, in order
  std::optional<Pending> pending_;
  std::optional<Best> best_;
  uint32_t settle_steps_ = 0;  // levels judged, up to kSettleSteps + 1
  uint32_t rising_steps_ = 0;
  uint32_t climbing_steps_ = 0;
  std::deque<double> past_levels_;  // the last level_steps settled levels
  std::optional<Diverged> diverged_;
  std::vector<int64_t> spike_ids_;  // of the spike that became the divergence
};

}  // namespace

std::unique_ptr<Detector> MakeLossSpike(const HealthConfig& config) {
  return std::make_unique<Loss>(config);
}

}  // namespace trainwatch
