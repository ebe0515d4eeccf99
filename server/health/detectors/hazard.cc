// SpikeHazard (docs/detectors.md): a loss spike is likely within the next few
// steps, from its precursors in the layer statistics the lead sends every
// step (layer_stats_every=1): a layer's RMS of g/sqrt(v) (Adam's second
// moment under-estimating the squared gradient, Wortsman et al. 2023,
// arXiv 2304.13013) or its update_rms_ratio (the update norm) jumping far
// above its own recent level.
//
// The rule was calibrated on the lab's tuning seeds and measured on held-out
// ones (tests/lab, docs/lab.md "Judged on the lab"): for each layer
// that is not an embedding (rare tokens' rows dominate an embedding's raw
// statistic), jump = ln(x_t / median(x over its previous `window` reports))
// - alpha x ln(B), with B = sqrt(1 / (1 - adam_beta2)) (the bound of g^2/v's
// RMS after a step: a threshold must depend on beta2); it fires when at
// least `min_layers` layers jump >= theta, after warmup, then stays quiet
// for `cooldown_steps`. Off by default (hazard.enabled): on families it was
// not fitted on, its precision is under the 0.5 that would turn it on.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "health/detectors/internal.h"
#include "health/signals/layer_kind.h"
#include "health/signals/select.h"

namespace trainwatch {
namespace {

// The default rule's figures on families it was not fitted on
// (docs/lab.md, "Held out by family").
constexpr double kMeasuredPrecision = 0.41;
constexpr double kMeasuredRecall = 0.24;

class SpikeHazard final : public Detector {
 public:
  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    const v1::StepRecord& r = ctx.record;
    const auto& cfg = ctx.config.hazard;
    if (!cfg.enabled || r.layer_stats().empty()) return;
    const double bound =
        ctx.run.adam_beta2.has_value() && *ctx.run.adam_beta2 > 0 && *ctx.run.adam_beta2 < 1
            ? std::log(std::sqrt(1.0 / (1.0 - *ctx.run.adam_beta2)))
            : 0.0;
    struct Jump {
      std::string layer;
      double jump = 0.0;
      double value = 0.0;
      double median = 0.0;
    };
    std::vector<Jump> jumps;
    for (const auto& [layer, stats] : r.layer_stats()) {
      if (IsTokenRowLayer(kinds_.Of(layer, stats))) continue;
      const double x = cfg.use_update_ratio
                           ? (stats.has_update_rms_ratio() ? stats.update_rms_ratio() : NAN)
                           : stats.g_over_sqrt_v_rms();
      if (!std::isfinite(x) || !(x > 0)) continue;
      auto it = history_.find(layer);
      if (it == history_.end()) {
        if (history_.size() >= kMaxLayers) continue;
        it = history_.emplace(layer, Layer{}).first;
      }
      Layer& l = it->second;
      std::deque<float>& h = l.values;
      // Reports a step apart only: the rule's level is the last `window`
      // steps' (with layer_stats every N steps it would span N x window).
      const bool consecutive = l.any && r.step() == l.last_step + 1;
      if (!consecutive) h.clear();
      l.last_step = r.step();
      l.any = true;
      if (h.size() >= cfg.window / 2) {
        scratch_.assign(h.begin(), h.end());
        const double median = MedianOf(scratch_.data(), scratch_.size());
        if (median > 0) {
          jumps.push_back({layer, std::log(x / median) - cfg.alpha * bound, x, median});
        }
      }
      h.push_back(static_cast<float>(x));
      if (h.size() > cfg.window) h.pop_front();
    }
    if (!ctx.post_warmup || r.step() < quiet_until_) return;
    std::sort(jumps.begin(), jumps.end(), [](const Jump& a, const Jump& b) {
      return a.jump != b.jump ? a.jump > b.jump : a.layer < b.layer;
    });
    const size_t k = cfg.min_layers;
    if (jumps.size() < k || jumps[k - 1].jump < cfg.theta) return;
    quiet_until_ = r.step() + cfg.cooldown_steps + 1;
    const Jump& top = jumps.front();
    size_t over = 0;
    for (const Jump& j : jumps) over += j.jump >= cfg.theta ? 1 : 0;
    const char* what = cfg.use_update_ratio ? "update_rms_ratio" : "g/sqrt(v) RMS";
    sink.Event(AlertKind::kSpikeHazard, r.step(), std::exp(top.jump), {}, [&] {
      return AlertText{
          .summary = absl::StrFormat("Loss spike likely soon: %s jumped in %s", what, top.layer),
          .description = absl::StrFormat(
              "step %d: %s of %s is %.3g, %.3gx its median over its last %d "
              "reports (%.3g); %d layer(s) jumped >= e^%g%s. The default "
              "rule, on families it was not fitted on: precision %g, recall "
              "%g (docs/detectors.md)",
              r.step(), what, top.layer, top.value, top.value / top.median, cfg.window,
              top.median, over, cfg.theta,
              bound > 0 && cfg.alpha > 0
                  ? absl::StrFormat(" beyond %g x ln(sqrt(1/(1-beta2)))", cfg.alpha)
                  : std::string(),
              kMeasuredPrecision, kMeasuredRecall)};
    });
  }

  void OnRewind(uint64_t step) override {
    history_.clear();
    quiet_until_ = 0;
  }

 private:
  static constexpr size_t kMaxLayers = 4096;
  struct Layer {
    std::deque<float> values;  // the last `window` reports, a step apart
    uint64_t last_step = 0;
    bool any = false;
  };
  absl::flat_hash_map<std::string, Layer> history_;
  LayerKinds kinds_;
  std::vector<float> scratch_;
  uint64_t quiet_until_ = 0;
};

}  // namespace

std::unique_ptr<Detector> MakeSpikeHazard(const HealthConfig& config) {
  return std::make_unique<SpikeHazard>();
}

}  // namespace trainwatch
