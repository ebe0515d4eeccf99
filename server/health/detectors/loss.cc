// LossSpike (docs/detectors.md): the loss jumps far above its recent level and
// stays up for a few steps (LossSpikeRule). Reads the lead stream only.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "health/detectors/internal.h"
#include "health/signals/loss_spike.h"

namespace trainwatch {
namespace {

// Catches the PaLM / BLOOM kind of loss spike, which needs a person: an event
// per spike, with the batch ids of its high steps and, like a gradient
// spike, an entry in the spike list with its restart plan (the checkpoint
// at least 100 steps before it, the batches to skip). A gradient spike that
// clipping absorbed leaves the loss where it was and stays GradNormSpike's
// (info). Any loss convention: a loss near 0 or below (an RL policy loss) is
// judged in linear terms, and never on one step of its printed resolution.
class LossSpike final : public Detector {
 public:
  explicit LossSpike(const HealthConfig& config)
      : rule_(LossSpikeRule::Options{
            .recent_steps = config.loss_spike.recent_steps,
            .min_steps = std::min<uint32_t>(50, config.loss_spike.recent_steps),
            .sigmas = config.loss_spike.sigmas,
            .log_sigmas = config.loss_spike.log_sigmas,
            .min_ratio = config.loss_spike.min_ratio,
            .stay_steps = config.loss_spike.stay_steps}) {}

  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    const v1::StepRecord& r = ctx.record;
    // Warmup included: a run that diverges during its warmup (the lab's,
    // at steps 90-208 of 300) is the one that most needs a person, and a
    // falling loss never rises above the median of its recent values.
    if (!r.has_loss()) return;
    std::optional<LossSpikeRule::Result> s = rule_.Add(r.step(), r.loss());
    if (!s.has_value() || !s->high) {
      high_batch_ids_.clear();
      return;
    }
    if (high_batch_ids_.empty()) onset_norm_ = r.grad_norm();
    for (int64_t id : r.batch_ids()) {
      if (high_batch_ids_.size() < kMaxBatchIds) high_batch_ids_.push_back(id);
    }
    const uint32_t stay = ctx.config.loss_spike.stay_steps;
    if (r.step() < s->onset_step + stay - 1) return;  // not up long enough yet
    const std::vector<int64_t> ids = s->fired_now
        ? high_batch_ids_
        : std::vector<int64_t>(r.batch_ids().begin(), r.batch_ids().end());
    // The peak: the ratio in log space; in linear terms (a ratio to a level
    // near 0 says nothing) the jump itself.
    const double peak = s->log_space ? s->ratio : r.loss() - s->level;
    sink.Event(AlertKind::kLossSpike, r.step(), peak, ids, [&] {
      const auto& c = ctx.config.loss_spike;
      const std::string plan = absl::StrFormat(
          "; restart plan: trainwatchctl spikes (the checkpoint >= 100 steps "
          "before step %d, skip the batches listed)",
          s->onset_step);
      std::string description =
          s->log_space
              ? absl::StrFormat(
                    "loss %.4g at step %d is %.2fx its recent level %.4g "
                    "(median of the last %d losses) and has stayed >= %gx and "
                    "%g robust sd of the log losses above it since step %d",
                    r.loss(), r.step(), s->ratio, s->level, c.recent_steps,
                    c.min_ratio, c.log_sigmas, s->onset_step)
              : absl::StrFormat(
                    "loss %.4g at step %d is %.4g above its recent level %.4g "
                    "(median of the last %d losses; robust sd %.2g, resolution "
                    "%.2g) and has stayed >= %g robust sd and >= %g resolution "
                    "steps above it since step %d",
                    r.loss(), r.step(), r.loss() - s->level, s->level,
                    c.recent_steps, s->sd, s->resolution, c.sigmas,
                    rule_.options().min_quanta, s->onset_step);
      return AlertText{absl::StrFormat("Loss spike at step %d", s->onset_step),
                       description + plan, s->onset_step,
                       // What the lead rank computed: its machine (HostSuspect).
                       ctx.run.host};
    });
    if (s->fired_now) {
      sink.Spike(SpikeInfo{.step = s->onset_step,
                           .grad_norm = onset_norm_,
                           .ratio_to_ema = 0.0,
                           .sigmas = 0.0,
                           .batch_ids = high_batch_ids_});
    }
  }

  // The recent level is the run's, which a restart does not change.
  void OnRewind(uint64_t step) override { high_batch_ids_.clear(); }

 private:
  static constexpr size_t kMaxBatchIds = 256;

  LossSpikeRule rule_;
  std::vector<int64_t> high_batch_ids_;  // of the current high steps
  double onset_norm_ = 0.0;
};

}  // namespace

std::unique_ptr<Detector> MakeLossSpike(const HealthConfig& config) {
  return std::make_unique<LossSpike>(config);
}

}  // namespace trainwatch
