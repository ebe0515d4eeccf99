// The MoE router's rules (docs/detectors.md): MoeAuxLossOffBalance,
// MoeRouterZLossGrowth and MoeExpertBiasDrift, over the levels of
// detectors/moe_levels.h; MoeRouting (detectors/moe.cc) asks them after the
// load's rules.
#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_format.h"
#include "health/detectors/internal.h"
#include "health/detectors/moe_levels.h"

namespace trainwatch::moe {
namespace {

// Layers named in a description, at most.
constexpr size_t kNamed = 4;

// The normalised balancing loss off balance: high (the balancing failing)
// or low (gamed).
class AuxOffBalance final : public Rule {
 public:
  void Judge(const Report& r, AlertSink& sink) override {
    const auto& cfg = r.cfg;
    Named high_layers, low_layers;
    for (const auto& [name, s] : r.layers) {
      const auto a = s->aux.Of(r.n);
      if (!r.settled || !a || !r.judge_aux) continue;
      if (!s->aux_base) s->aux_base = *a;
      // High: over the line and, for a layer that reports its counts,
      // risen from its settled level by as much as the line is above
      // balance. The counts are the load itself (the load rules judge
      // them) and the loss also grows with the router's confidence: one
      // that settled high is what this balancing gets on this data, one
      // that rises from there is the balancing failing. Without counts
      // the loss is all that shows the load.
      const double high = r.Line(AlertKind::kMoeAuxLossOffBalance, 1.0, cfg.aux_high);
      if (*a >= high && (!s->reports_counts || *a - *s->aux_base >= high - 1.0)) {
        high_layers.emplace_back(*name, *a);
      }
      if (*a < r.Line(AlertKind::kMoeAuxLossOffBalance, 1.0, cfg.aux_low)) {
        low_layers.emplace_back(*name, *a);
      }
    }
    const bool off = !high_layers.empty() || !low_layers.empty();
    const double value = high_layers.empty()
                             ? (low_layers.empty() ? 0.0 : Worst(low_layers, false))
                             : Worst(high_layers);
    r.held.Condition(sink, AlertKind::kMoeAuxLossOffBalance, r.step, off, value, [&] {
      if (!high_layers.empty()) {
        return AlertText{
            absl::StrFormat("MoE balancing loss %.3g, above %g", Worst(high_layers),
                            cfg.aux_high),
            absl::StrFormat("step %d: the normalised load-balancing loss "
                            "(1.0 = balanced; median of the last %d "
                            "reports) >= %g (with counts: and >= %g "
                            "above its level after settling): %s",
                            r.step, r.n, cfg.aux_high, cfg.aux_high - 1.0,
                            NameLayers(high_layers, kNamed, "layer "))};
      }
      return AlertText{
          absl::StrFormat("MoE balancing loss %.3g, below %g: gamed",
                          Worst(low_layers, false), cfg.aux_low),
          absl::StrFormat("step %d: the normalised load-balancing loss "
                          "(median of the last %d reports) < %g, below "
                          "what balance gives: %s",
                          r.step, r.n, cfg.aux_low, NameLayers(low_layers, kNamed, "layer "))};
    });
  }
};

// The router's logits grown: their z-loss where the layer reports one (a
// learning router's max logit grows while z-loss keeps the logsumexp down),
// else its max logit; the level >= moe.z_ratio x its lowest over the
// moe.z_growth_steps before the rise and >= moe.z_ratio x its level when
// the run settled, held moe.persist_steps. Against a recent low: a router
// without z-loss sharpens as it learns (its z-loss 40 -> 130 over 2500
// steps, ~1.3x in 500, the run healthy), while one that runs away doubles
// in ~100 steps. And above where it settled: a z-loss that held the logits
// near 0 (z 3e-5) and lets them back to 1e-4 has not grown. While the level
// is over the line the low is frozen, so a growth that goes on stays one
// alert.
class ZGrowth final : public Rule {
 public:
  void Judge(const Report& r, AlertSink& sink) override {
    const auto& cfg = r.cfg;
    Named grown;
    uint64_t onset = r.step;
    double low = 0;
    bool z_judged = false, logit_judged = false;  // what the grown layers were judged on
    for (const auto& [name, s] : r.layers) {
      if (!r.settled) continue;
      const Level& logits = s->reports_z ? s->z : s->logit;
      const std::optional<double> now = logits.Of(r.n);
      if (!now) continue;
      auto& lows = s->logit_lows;
      if (s->lows_of_z != s->reports_z) {  // the layer's z-loss arrived
        lows.clear();
        s->logit_base.reset();
        s->lows_of_z = s->reports_z;
      }
      if (!s->logit_base) s->logit_base = *now;
      // Over both lines: a rise back from a dip (z-loss pulled the logits
      // near 0, where doubling is noise: 3e-5 -> 7e-5) is not a growth.
      const double ratio = r.Line(AlertKind::kMoeRouterZLossGrowth, 1.0, cfg.z_ratio);
      const bool over = !lows.empty() && lows.front().second > 0 && *s->logit_base > 0 &&
                        *now >= ratio * lows.front().second &&
                        *now >= ratio * *s->logit_base;
      if (r.Persists(AlertKind::kMoeRouterZLossGrowth, s->logits_grown, over,
                     logits.since(r.step))) {
        grown.emplace_back(*name, *now / lows.front().second);
        low = lows.front().second;
        onset = std::min(onset, s->logits_grown.onset());
        (s->reports_z ? z_judged : logit_judged) = true;
      }
      if (over) continue;  // the low stays what it was before the rise
      while (!lows.empty() && lows.back().second >= *now) lows.pop_back();
      lows.emplace_back(r.step, *now);
      while (lows.front().first + cfg.z_growth_steps < r.step) lows.pop_front();
    }
    r.held.Condition(
        sink, AlertKind::kMoeRouterZLossGrowth, r.step, !grown.empty(), Worst(grown), [&] {
          const char* what = z_judged && logit_judged
                                 ? "router z-loss (max router logit where a layer reports none)"
                                 : (z_judged ? "router z-loss" : "max router logit");
          return AlertText{
              absl::StrFormat("Router logits grew %.3gx", Worst(grown)),
              absl::StrFormat("step %d: the %s (median of the last %d reports) >= %g x "
                              "its lowest level over the %d steps before the rise (%.3g) "
                              "since step %d (>= %d steps): %s",
                              r.step, what, r.n, cfg.z_ratio, cfg.z_growth_steps, low, onset,
                              cfg.persist_steps, NameLayers(grown, kNamed, "layer ")),
              onset};
        });
  }
};

// The aux-free bias: its mean drifting from 0, or its update flipping sign
// without balancing the load.
class BiasDrift final : public Rule {
 public:
  void Judge(const Report& r, AlertSink& sink) override {
    const auto& cfg = r.cfg;
    Named drift, flip;
    // The load is uneven half way to the imbalance line (max/mean 1.5) or
    // more: what both arms below ask.
    const double uneven_line = 1 + 0.5 * (cfg.imbalance - 1);
    for (const auto& [name, s] : r.layers) {
      if (!r.settled) continue;
      // A shift of every expert's bias by one amount changes no choice of
      // experts: Megatron-Core's and DeepSeek-V3's sign update is not
      // re-centred, and its mean drifts while the load stays balanced (a
      // right-skewed load puts more experts below the mean than above). The
      // mean's drift is the update's fault only while the load is uneven too,
      // as the flips are; a layer without counts is judged on its mean alone.
      const std::optional<double> load = s->max_over_mean.Of(r.n);
      const bool uneven =
          !s->reports_counts ||
          (load && *load >= r.Line(AlertKind::kMoeExpertBiasDrift, 1.0, uneven_line));
      if (auto d = s->bias_mean_over_sd.Of(r.n);
          uneven && d &&
          *d >= r.Line(AlertKind::kMoeExpertBiasDrift, 0.0, cfg.bias_mean_sd) &&
          std::abs(s->bias_mean) >=
              r.Line(AlertKind::kMoeExpertBiasDrift, 0.0, 20 * r.bias_rate)) {
        drift.emplace_back(*name, s->bias_mean);
      }
      // Flipping is what a sign update does at balance: it is the rate's
      // fault only while the load stays uneven.
      if (s->flip_reports >= r.n && s->last_max_over_mean >= 0.95 * s->flip_start_imbalance &&
          s->last_max_over_mean >= uneven_line) {
        flip.emplace_back(*name, s->last_max_over_mean);
      }
    }
    const bool off = !drift.empty() || !flip.empty();
    r.held.Condition(
        sink, AlertKind::kMoeExpertBiasDrift, r.step, off,
        drift.empty() ? 0.0 : std::abs(Worst(drift)), [&] {
          if (!drift.empty()) {
            return AlertText{
                "MoE expert bias drifts away from 0",
                absl::StrFormat("step %d: the aux-free bias's mean across "
                                "experts is >= %g x its spread and >= %g (20 x "
                                "the update rate) while the load is uneven: the "
                                "update is not re-centred: %s",
                                r.step, cfg.bias_mean_sd, 20 * r.bias_rate,
                                NameLayers(drift, kNamed, "layer "))};
          }
          return AlertText{
              "MoE expert bias flips without balancing",
              absl::StrFormat("step %d: the aux-free bias's update changed sign "
                              "on >= %.0f%% of the experts on %d reports in a "
                              "row while the load's max/mean did not improve: "
                              "the update rate is too high: %s",
                              r.step, 100 * cfg.bias_flip_share, r.n,
                              NameLayers(flip, kNamed, "layer "))};
        });
  }
};

}  // namespace

std::unique_ptr<Rule> MakeAuxOffBalance() { return std::make_unique<AuxOffBalance>(); }
std::unique_ptr<Rule> MakeZGrowth() { return std::make_unique<ZGrowth>(); }
std::unique_ptr<Rule> MakeBiasDrift() { return std::make_unique<BiasDrift>(); }

}  // namespace trainwatch::moe
