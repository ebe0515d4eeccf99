// The mixture-of-experts routing rules (docs/detectors.md, the Moe* rows):
// MoeRouterCollapse, MoeDeadExpert, MoeImbalanceHigh, MoeAuxLossOffBalance,
// MoeRouterZLossGrowth, MoeExpertBiasDrift, MoeTokensDropped and
// MoeExpertParallelImbalance. They read the MoeStats the trainer sends every
// N steps on the lead stream (records without it leave them unchanged) and
// judge a layer on its level, the median of its last moe.level_reports
// reports, never in the first moe.settle_steps post-warmup steps: a router
// balances its load in ~150 steps, and one report is one global batch.
// A level that moves with its data (a batch's mix, a router that learns) is
// judged against what the layer settled at, and a crossing must persist.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "health/detectors/internal.h"
#include "health/signals/moe_load.h"
#include "health/signals/select.h"
#include "health/signals/trend_forecast.h"

namespace trainwatch {
namespace {

// Layers tracked at once, at most (the wire allows no more).
constexpr size_t kMaxLayers = 1024;
// Layers named in a description, at most.
constexpr size_t kNamed = 4;

// The last `n` values of one signal of one layer, and their median (taken
// once a value, when the ring is full).
class Level {
 public:
  void Add(double v, uint32_t n, uint64_t step = 0) {
    if (!std::isfinite(v)) return;
    if (values_.size() < n) {
      values_.push_back(v);
      steps_.push_back(step);
    } else {
      values_[next_] = v;
      steps_[next_] = step;
      next_ = (next_ + 1) % n;
    }
    if (values_.size() >= n) median_ = MedianOf(values_.data(), values_.size());
  }
  // The step of the oldest report in the level: where what it says began
  // (`otherwise` while empty).
  uint64_t since(uint64_t otherwise) const {
    return steps_.empty() ? otherwise : steps_[next_ % steps_.size()];
  }
  // The median once `n` values are in.
  std::optional<double> Of(uint32_t n) const {
    if (values_.empty() || values_.size() < n) return std::nullopt;
    return median_;
  }
  void Clear() {
    values_.clear();
    steps_.clear();
    next_ = 0;
  }

 private:
  std::vector<double> values_;
  std::vector<uint64_t> steps_;
  size_t next_ = 0;
  double median_ = 0.0;
};

// A condition that must hold on every report for a while before it counts:
// a level over its line that comes back within moe.persist_steps was an
// excursion (a batch's mix of data, a passing bump), not a change.
class Persistent {
 public:
  // Notes whether the condition holds at `step` (where it began, if it
  // begins now: `onset`); true once it has held on every report since for
  // >= `steps` steps and >= `reports` reports.
  bool Update(bool holds, uint64_t step, uint64_t onset, uint32_t steps, uint32_t reports) {
    if (!holds) {
      reports_ = 0;
      return false;
    }
    if (reports_++ == 0) {
      since_ = step;
      onset_ = onset;
    }
    return step - since_ >= steps && reports_ >= reports;
  }
  uint64_t onset() const { return onset_; }

 private:
  uint64_t since_ = 0, onset_ = 0;
  uint32_t reports_ = 0;
};

struct LayerState {
  Level effective, share, max_over_mean, aux, z, logit, blocks;
  // Baselines (the first level after settling): the router's logits and
  // the balancing loss.
  std::optional<double> z_base, logit_base, aux_base;
  bool reports_z = false;       // the layer has reported a z-loss
  bool reports_counts = false;  // ... its assignments per expert
  Persistent imbalanced, logits_grown;
  // Per expert: the first step of its run of empty reports, and their count.
  std::vector<uint64_t> empty_since;
  std::vector<uint32_t> empty_reports;
  // The aux-free bias: the last report's and its change.
  std::vector<float> bias, bias_delta;
  uint32_t flip_reports = 0;          // reports in a row that flipped
  double flip_start_imbalance = 0.0;  // max/mean when that run began
  Level bias_mean_over_sd;
  double bias_mean = 0.0, bias_sd = 0.0;
  uint32_t hottest_block = 0;  // the EP rank with the most assignments
  double last_max_over_mean = 0.0;
};

// A layer that holds a rule, with the number the description names.
using Named = std::vector<std::pair<std::string, double>>;

double Worst(const Named& layers, bool largest = true) {
  double w = largest ? 0.0 : INFINITY;
  for (const auto& [name, v] : layers) w = largest ? std::max(w, v) : std::min(w, v);
  return w;
}

// The hysteresis of the level rules: once an alert's condition held, until
// the tracker resolves it (resolve_after_steps without holding), a rule
// judges against a line change.resolve_ratio (0.8) of the way from the
// neutral value (a balanced load's max/mean of 1, no drops) to its fire
// line: max/mean 1.8 holds what 2 fired. A level hovering at its line is one
// alert, not a flapping pager.
class Held {
 public:
  double Line(AlertKind kind, uint64_t step, double neutral, double fire,
              const HealthConfig& config) const {
    const auto it = last_held_.find(kind);
    const bool firing = it != last_held_.end() && step < it->second + config.resolve_after_steps;
    return firing ? neutral + config.change.resolve_ratio * (fire - neutral) : fire;
  }
  // Reports the condition, noting the step it held.
  void Condition(AlertSink& sink, AlertKind kind, uint64_t step, bool holds, double value,
                 const std::function<AlertText()>& text) {
    if (holds) last_held_[kind] = step;
    sink.Condition(kind, step, holds, value, text);
  }

 private:
  std::map<AlertKind, uint64_t> last_held_;  // the last step each held
};

class MoeRouting final : public Detector {
 public:

  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    const v1::StepRecord& r = ctx.record;
    if (!r.has_moe() || r.moe().layers().empty() || !ctx.post_warmup) return;
    const auto& cfg = ctx.config.moe;
    const uint64_t step = r.step();
    if (!first_post_warmup_.has_value()) first_post_warmup_ = step;
    const bool settled = step - *first_post_warmup_ >= cfg.settle_steps;
    const uint32_t n = cfg.level_reports;
    const v1::MoeConfig* moe = ctx.run.moe.has_value() ? &*ctx.run.moe : nullptr;
    const uint32_t top_k = moe != nullptr && moe->top_k() > 0 ? moe->top_k() : 1;
    const uint32_t ep_size = moe != nullptr ? moe->ep_size() : 0;
    const double bias_rate =
        moe != nullptr && moe->bias_update_rate() > 0 ? moe->bias_update_rate() : 1e-3;
    // A run that balances nothing has no balancing to be off: its aux loss
    // is a diagnostic, and its load is judged by the load's own rules.
    const bool judge_aux = moe == nullptr || moe->balancing() != v1::NO_BALANCING;
    const auto persists = [&](Persistent& p, bool holds, uint64_t onset) {
      return p.Update(holds, step, onset, cfg.persist_steps, cfg.persist_reports);
    };
    // Each rule's line: its fire line, or while its alert is firing the
    // lower one that holds it (hysteresis).
    const auto line = [&](AlertKind kind, double neutral, double fire) {
      return held_.Line(kind, step, neutral, fire, ctx.config);
    };

    Named collapsed, dead, imbalanced, aux_high, aux_low, z_grown, bias_drift,
        bias_flip, ep_hot;
    MoeDrops report_drops;
    // Where each cause's condition began (the oldest report of its level):
    // a consequence that fired since then is its (AlertText::onset_step).
    uint64_t collapse_onset = step, dead_onset = step, z_onset = step, imbalance_onset = step;
    bool z_judged = false, logit_judged = false;  // what the grown layers were judged on
    std::string dead_experts;
    double worst_imbalance = 0.0;
    for (const v1::MoeLayerStats& layer : r.moe().layers()) {
      auto it = layers_.find(layer.layer());
      if (it == layers_.end()) {
        if (layers_.size() >= kMaxLayers) continue;
        it = layers_.emplace(layer.layer(), LayerState{}).first;
      }
      LayerState& s = it->second;
      const std::string& name = layer.layer();
      if (std::optional<MoeLayerLoad> load = LoadOf(layer)) {
        report_drops.Add(layer, *load);
        s.reports_counts = true;
        s.effective.Add(load->effective_experts, n, step);
        s.share.Add(load->max_share, n, step);
        s.max_over_mean.Add(load->max_over_mean, n, step);
        s.last_max_over_mean = load->max_over_mean;
        TrackEmpty(layer, step, s);
        const size_t experts = layer.tokens_per_expert_size();
        if (settled) {
          // Collapse: onto <= 2 top_k experts (of a layer with more than
          // twice that), or one expert taking half at top_k 1.
          const double limit =
              std::min(cfg.collapse_top_k_multiple * top_k, experts / 2.0);
          const auto eff = s.effective.Of(n);
          const auto share = s.share.Of(n);
          if (eff && *eff <= line(AlertKind::kMoeRouterCollapse, experts, limit)) {
            collapsed.emplace_back(name, *eff);
            collapse_onset = std::min(collapse_onset, s.effective.since(step));
          } else if (top_k == 1 && share &&
                     *share >= line(AlertKind::kMoeRouterCollapse, 1.0 / experts,
                                    cfg.collapse_share)) {
            collapsed.emplace_back(name, *share * experts);
            collapse_onset = std::min(collapse_onset, s.share.since(step));
          }
          const uint32_t dead_now = DeadExperts(s, step, cfg, &dead_experts, name, &dead_onset);
          if (dead_now > 0) dead.emplace_back(name, dead_now);
          if (auto m = s.max_over_mean.Of(n)) {
            worst_imbalance = std::max(worst_imbalance, *m);
            const bool over = *m >= line(AlertKind::kMoeImbalanceHigh, 1.0, cfg.imbalance);
            if (persists(s.imbalanced, over, s.max_over_mean.since(step))) {
              imbalanced.emplace_back(name, *m);
              imbalance_onset = std::min(imbalance_onset, s.imbalanced.onset());
            }
          }
        }
        const std::vector<uint64_t> blocks = BlockLoads(layer, ep_size);
        if (!blocks.empty()) {
          const auto max = std::max_element(blocks.begin(), blocks.end());
          double sum = 0;
          for (uint64_t b : blocks) sum += static_cast<double>(b);
          if (sum > 0) {
            s.blocks.Add(*max / (sum / blocks.size()), n);
            s.hottest_block = static_cast<uint32_t>(max - blocks.begin());
          }
          const auto level = s.blocks.Of(n);
          if (settled && level &&
              *level >= line(AlertKind::kMoeExpertParallelImbalance, 1.0, cfg.ep_ratio)) {
            ep_hot.emplace_back(name, *level);
          }
        }
      }
      if (layer.has_aux_loss()) s.aux.Add(layer.aux_loss(), n);
      if (layer.has_z_loss()) {
        s.z.Add(layer.z_loss(), n, step);
        s.reports_z = true;
      }
      if (layer.has_router_logit_max()) s.logit.Add(layer.router_logit_max(), n, step);
      TrackBias(layer, s, n, cfg.bias_flip_share);
      if (!settled) continue;
      if (auto a = s.aux.Of(n); a && judge_aux) {
        if (!s.aux_base) s.aux_base = *a;
        // High: over the line and, for a layer that reports its counts,
        // risen from its settled level by as much as the line is above
        // balance. The counts are the load itself (the load rules judge
        // them) and the loss also grows with the router's confidence: one
        // that settled high is what this balancing gets on this data, one
        // that rises from there is the balancing failing. Without counts
        // the loss is all that shows the load.
        const double high = line(AlertKind::kMoeAuxLossOffBalance, 1.0, cfg.aux_high);
        if (*a >= high && (!s.reports_counts || *a - *s.aux_base >= high - 1.0)) {
          aux_high.emplace_back(name, *a);
        }
        if (*a < line(AlertKind::kMoeAuxLossOffBalance, 1.0, cfg.aux_low)) {
          aux_low.emplace_back(name, *a);
        }
      }
      // The router's logits: its z-loss where the layer reports one (a
      // learning router's max logit grows while z-loss keeps the
      // logsumexp down), else its max logit.
      const Level& logits = s.reports_z ? s.z : s.logit;
      std::optional<double>& base = s.reports_z ? s.z_base : s.logit_base;
      const std::optional<double> now = logits.Of(n);
      if (now && !base) base = *now;
      const double z_ratio = line(AlertKind::kMoeRouterZLossGrowth, 1.0, cfg.z_ratio);
      if (persists(s.logits_grown, now && *base > 0 && *now >= z_ratio * *base,
                   logits.since(step))) {
        z_grown.emplace_back(name, *now / *base);
        z_onset = std::min(z_onset, s.logits_grown.onset());
        (s.reports_z ? z_judged : logit_judged) = true;
      }
      if (auto d = s.bias_mean_over_sd.Of(n);
          d && *d >= line(AlertKind::kMoeExpertBiasDrift, 0.0, cfg.bias_mean_sd) &&
          std::abs(s.bias_mean) >= line(AlertKind::kMoeExpertBiasDrift, 0.0, 20 * bias_rate)) {
        bias_drift.emplace_back(name, s.bias_mean);
      }
      if (s.flip_reports >= n && s.last_max_over_mean >= 0.95 * s.flip_start_imbalance &&
          s.last_max_over_mean > 1.1) {
        bias_flip.emplace_back(name, s.last_max_over_mean);
      }
    }

    // The report's share of dropped assignments, over every layer (what
    // Summarize() gives /metrics).
    if (const std::optional<double> share = report_drops.fraction()) dropped_.Add(*share, n);
    const auto dropped = settled ? dropped_.Of(n) : std::nullopt;

    // The worst layer's imbalance trend, forecast to cross the line: only
    // once it is most of the way there and its trend has risen from the
    // run's settled level (the median of its first reports after settling)
    // two thirds of the way to the line and still rises. A skew that
    // settled near the line and stays there moves with its data, and its
    // excursions are no trend.
    if (settled && worst_imbalance > 0) {
      imbalance_trend_.Add(step, worst_imbalance);
      if (!imbalance_base_.Of(n)) imbalance_base_.Add(worst_imbalance, n);
    }
    std::optional<uint64_t> imbalance_at;
    if (const auto base = imbalance_base_.Of(n);
        imbalanced.empty() && base && *base < cfg.imbalance &&
        worst_imbalance >= 1 + 0.8 * (cfg.imbalance - 1)) {
      imbalance_at = OutwardCrossing(imbalance_trend_, *base, cfg.imbalance - *base);
      if (imbalance_at && *imbalance_at > step + cfg.horizon_steps) imbalance_at.reset();
    }

    held_.Condition(sink, AlertKind::kMoeRouterCollapse, step, !collapsed.empty(),
                    collapsed.empty() ? 0.0 : Worst(collapsed, false), [&] {
                      return AlertText{
                          absl::StrFormat("MoE routing collapsed in %d layer(s)", collapsed.size()),
                          absl::StrFormat("step %d: effective experts (exp of the load's "
                                          "entropy, median of the last %d reports) <= %g "
                                          "(%g x top_k %d): %s",
                                          step, n, cfg.collapse_top_k_multiple * top_k,
                                          cfg.collapse_top_k_multiple, top_k,
                                          NameLayers(collapsed, kNamed, "layer ")),
                          collapse_onset};
                    });
    held_.Condition(sink, AlertKind::kMoeDeadExpert, step, !dead.empty(), Worst(dead), [&] {
      return AlertText{
          absl::StrFormat("%g dead expert(s) in %d layer(s)", Worst(dead), dead.size()),
          absl::StrFormat("step %d: experts with no assignment in the global "
                          "batch for >= %d steps (%d+ reports): %s",
                          step, cfg.dead_steps, cfg.dead_min_reports, dead_experts),
          dead_onset};
    });
    held_.Condition(
        sink, AlertKind::kMoeImbalanceHigh, step, !imbalanced.empty() || imbalance_at.has_value(),
        imbalanced.empty() ? worst_imbalance : Worst(imbalanced), [&] {
          if (!imbalanced.empty()) {
            return AlertText{
                absl::StrFormat("MoE load imbalance %.3gx in %d layer(s)",
                                Worst(imbalanced), imbalanced.size()),
                absl::StrFormat("step %d: the hottest expert's load over the "
                                "mean (median of the last %d reports) >= %g "
                                "since step %d (>= %d steps): %s",
                                step, n, cfg.imbalance, imbalance_onset,
                                cfg.persist_steps,
                                NameLayers(imbalanced, kNamed, "layer ")),
                imbalance_onset};
          }
          return AlertText{
              absl::StrFormat("MoE load imbalance forecast to reach %gx by step %d",
                              cfg.imbalance, *imbalance_at),
              absl::StrFormat("step %d: the worst layer's max/mean is %.3g, its "
                              "trend (Theil-Sen) risen from %.3g after "
                              "settling and rising: %g at step %d, within the "
                              "%d-step horizon",
                              step, worst_imbalance, *imbalance_base_.Of(n),
                              cfg.imbalance, *imbalance_at, cfg.horizon_steps)};
        });
    const bool aux_off = !aux_high.empty() || !aux_low.empty();
    held_.Condition(
        sink, AlertKind::kMoeAuxLossOffBalance, step, aux_off,
        aux_high.empty() ? (aux_low.empty() ? 0.0 : Worst(aux_low, false)) : Worst(aux_high),
        [&] {
          if (!aux_high.empty()) {
            return AlertText{
                absl::StrFormat("MoE balancing loss %.3g, above %g", Worst(aux_high),
                                cfg.aux_high),
                absl::StrFormat("step %d: the normalised load-balancing loss "
                                "(1.0 = balanced; median of the last %d "
                                "reports) >= %g (with counts: and >= %g "
                                "above its level after settling): %s",
                                step, n, cfg.aux_high, cfg.aux_high - 1.0,
                                NameLayers(aux_high, kNamed, "layer "))};
          }
          return AlertText{
              absl::StrFormat("MoE balancing loss %.3g, below %g: gamed",
                              Worst(aux_low, false), cfg.aux_low),
              absl::StrFormat("step %d: the normalised load-balancing loss "
                              "(median of the last %d reports) < %g, below "
                              "what balance gives: %s",
                              step, n, cfg.aux_low, NameLayers(aux_low, kNamed, "layer "))};
        });
    held_.Condition(
        sink, AlertKind::kMoeRouterZLossGrowth, step, !z_grown.empty(), Worst(z_grown), [&] {
          const char* what = z_judged && logit_judged
                                 ? "router z-loss (max router logit where a layer reports none)"
                                 : (z_judged ? "router z-loss" : "max router logit");
          return AlertText{
              absl::StrFormat("Router logits grew %.3gx", Worst(z_grown)),
              absl::StrFormat("step %d: the %s (median of the last %d reports) >= %g x "
                              "its level after settling since step %d (>= %d steps): %s",
                              step, what, n, cfg.z_ratio, z_onset, cfg.persist_steps,
                              NameLayers(z_grown, kNamed, "layer ")),
              z_onset};
        });
    const bool bias_off = !bias_drift.empty() || !bias_flip.empty();
    held_.Condition(
        sink, AlertKind::kMoeExpertBiasDrift, step, bias_off,
        bias_drift.empty() ? 0.0 : std::abs(Worst(bias_drift)), [&] {
          if (!bias_drift.empty()) {
            return AlertText{
                "MoE expert bias drifts away from 0",
                absl::StrFormat("step %d: the aux-free bias's mean across "
                                "experts is >= %g x its spread and >= %g (20 x "
                                "the update rate): the update is not "
                                "re-centred: %s",
                                step, cfg.bias_mean_sd, 20 * bias_rate,
                                NameLayers(bias_drift, kNamed, "layer "))};
          }
          return AlertText{
              "MoE expert bias flips without balancing",
              absl::StrFormat("step %d: the aux-free bias's update changed sign "
                              "on >= %.0f%% of the experts on %d reports in a "
                              "row while the load's max/mean did not improve: "
                              "the update rate is too high: %s",
                              step, 100 * cfg.bias_flip_share, n,
                              NameLayers(bias_flip, kNamed, "layer "))};
        });
    const bool drops = dropped.has_value() &&
                       *dropped > line(AlertKind::kMoeTokensDropped, 0.0, cfg.dropped_fraction);
    held_.Condition(sink, AlertKind::kMoeTokensDropped, step, drops, dropped.value_or(0.0), [&] {
      return AlertText{
          absl::StrFormat("MoE drops %.2g%% of its assignments", 100 * *dropped),
          absl::StrFormat("step %d: dropped / routed assignments over every "
                          "layer (median of the last %d reports) is %.3g, "
                          "above %g%s",
                          step, n, *dropped, cfg.dropped_fraction,
                          *dropped > 0.1 ? " (above 10%: a critical share)" : "")};
    });
    held_.Condition(
        sink, AlertKind::kMoeExpertParallelImbalance, step, !ep_hot.empty(), Worst(ep_hot), [&] {
          const LayerState& worst = layers_.at(
              std::max_element(ep_hot.begin(), ep_hot.end(),
                               [](const auto& a, const auto& b) { return a.second < b.second; })
                  ->first);
          return AlertText{
              absl::StrFormat("EP rank %d carries %.3gx the mean rank's tokens",
                              worst.hottest_block, Worst(ep_hot)),
              absl::StrFormat("step %d: the expert-parallel rank with the most "
                              "assignments (experts in %d contiguous blocks) "
                              "carries >= %g x the mean rank's (median of the "
                              "last %d reports); the hottest: EP rank %d: %s",
                              step, ep_size, cfg.ep_ratio, n, worst.hottest_block,
                              NameLayers(ep_hot, kNamed, "layer "))};
        });
  }

  void OnRewind(uint64_t step) override {
    layers_.clear();
    held_ = Held{};
    dropped_.Clear();
    imbalance_base_.Clear();
    imbalance_trend_.RewindTo(step);
    if (first_post_warmup_.has_value() && *first_post_warmup_ >= step) {
      first_post_warmup_.reset();
    }
  }

 private:
  static void TrackEmpty(const v1::MoeLayerStats& layer, uint64_t step, LayerState& s) {
    const auto& counts = layer.tokens_per_expert();
    if (s.empty_since.size() != static_cast<size_t>(counts.size())) {
      s.empty_since.assign(counts.size(), 0);
      s.empty_reports.assign(counts.size(), 0);
    }
    for (int e = 0; e < counts.size(); ++e) {
      if (counts[e] > 0) {
        s.empty_reports[e] = 0;
      } else if (s.empty_reports[e]++ == 0) {
        s.empty_since[e] = step;
      }
    }
  }

  // Experts of this layer dead at `step`; appends "layer L: experts a, b".
  static uint32_t DeadExperts(const LayerState& s, uint64_t step,
                              const decltype(HealthConfig::moe)& cfg,
                              std::string* out, const std::string& name, uint64_t* onset) {
    std::vector<size_t> dead;
    for (size_t e = 0; e < s.empty_reports.size(); ++e) {
      if (s.empty_reports[e] >= cfg.dead_min_reports &&
          step - s.empty_since[e] >= cfg.dead_steps) {
        dead.push_back(e);
        *onset = std::min(*onset, s.empty_since[e]);
      }
    }
    if (dead.empty()) return 0;
    if (!out->empty()) out->append("; ");
    absl::StrAppendFormat(out, "layer %s: expert", name);
    for (size_t i = 0; i < dead.size() && i < 8; ++i) {
      absl::StrAppendFormat(out, "%s %d", i == 0 ? "" : ",", dead[i]);
    }
    if (dead.size() > 8) absl::StrAppendFormat(out, " and %d more", dead.size() - 8);
    return static_cast<uint32_t>(dead.size());
  }

  static void TrackBias(const v1::MoeLayerStats& layer, LayerState& s,
                        uint32_t n, double flip_share) {
    const auto& bias = layer.expert_bias();
    if (bias.empty()) return;
    double sum = 0, sq = 0;
    for (float b : bias) sum += b;
    const double mean = sum / bias.size();
    for (float b : bias) sq += (b - mean) * (b - mean);
    s.bias_mean = mean;
    s.bias_sd = std::sqrt(sq / bias.size());
    s.bias_mean_over_sd.Add(std::abs(mean) / std::max(s.bias_sd, 1e-12), n);
    // Flips: the change's sign against the last change's, on consecutive
    // reports of the same experts.
    if (s.bias.size() == static_cast<size_t>(bias.size())) {
      std::vector<float> delta(bias.size());
      size_t flips = 0;
      for (int e = 0; e < bias.size(); ++e) {
        delta[e] = bias[e] - s.bias[e];
        if (s.bias_delta.size() == delta.size() && delta[e] * s.bias_delta[e] < 0) ++flips;
      }
      const bool flipped = s.bias_delta.size() == delta.size() &&
                           flips >= flip_share * static_cast<double>(bias.size());
      if (flipped) {
        if (s.flip_reports++ == 0) s.flip_start_imbalance = s.last_max_over_mean;
      } else {
        s.flip_reports = 0;
      }
      s.bias_delta = std::move(delta);
    }
    s.bias.assign(bias.begin(), bias.end());
  }

  std::map<std::string, LayerState> layers_;
  Held held_;
  Level dropped_;
  TrendForecaster imbalance_trend_{TrendForecaster::Options{}};
  Level imbalance_base_;  // the worst layer's first levels after settling
  std::optional<uint64_t> first_post_warmup_;
};

}  // namespace

void AddMoeDetectors(const HealthConfig& config, Detectors* out) {
  out->push_back(std::make_unique<MoeRouting>());
}

}  // namespace trainwatch
