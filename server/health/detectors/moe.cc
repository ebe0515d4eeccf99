// The mixture-of-experts routing rules (docs/detectors.md, the Moe* rows):
// MoeRouterCollapse, MoeDeadExpert, MoeImbalanceHigh, MoeAuxLossOffBalance,
// MoeRouterZLossGrowth, MoeExpertBiasDrift, MoeTokensDropped and
// MoeExpertParallelImbalance. They read the MoeStats the trainer sends every
// N steps on the lead stream (records without it leave them unchanged) and
// judge a layer on its level (detectors/moe_levels.h), the median of its
// last moe.level_reports reports, never in the first moe.settle_steps
// post-warmup steps: a router balances its load in ~150 steps, and one
// report is one global batch. A level that moves with its data (a batch's
// mix, a router that learns) is judged against what the layer settled at,
// and a crossing must persist.
//
// MoeRouting takes a report into the levels, then asks each rule, a small
// class of its own, in the catalog's order: the load's rules here, the
// router's (balancing loss, logits, aux-free bias) in detectors/moe_router.cc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "health/detectors/internal.h"
#include "health/detectors/moe_levels.h"
#include "health/signals/trend_forecast.h"

namespace trainwatch {
namespace {

using moe::Held;
using moe::LayerState;
using moe::Named;
using moe::Report;
using moe::Rule;
using moe::Worst;

// Layers named in a description, at most.
constexpr size_t kNamed = 4;

// Collapse: the routing rests on a few experts, the rest starved: the
// fewest experts that carry 90% of the assignments (n90) <= 2 x top_k, of
// a layer with more than twice that. Not the entropy's effective number: a
// thin spread over the starved experts counts as load there (two experts
// with 92% and six with 1.3% each are 2.9 effective experts, n90 2); nor
// the hottest expert's share, which is an imbalance (MoeImbalanceHigh) while
// the rest still carry their part.
class Collapse final : public Rule {
 public:
  void Judge(const Report& r, AlertSink& sink) override {
    const auto& cfg = r.cfg;
    Named collapsed;
    uint64_t onset = r.step;
    double limit = 0;
    for (const auto& [name, s] : r.layers) {
      if (!r.settled || !s->counts_now) continue;
      limit = moe::CollapseLimit(r.top_k, cfg.collapse_top_k_multiple, s->experts);
      const auto n90 = s->n90.Of(r.n);
      if (n90 && *n90 <= r.Line(AlertKind::kMoeRouterCollapse, s->experts, limit)) {
        collapsed.emplace_back(*name, *n90);
        onset = std::min(onset, s->n90.since(r.step));
      }
    }
    r.held.Condition(sink, AlertKind::kMoeRouterCollapse, r.step, !collapsed.empty(),
                     collapsed.empty() ? 0.0 : Worst(collapsed, false), [&] {
                       return AlertText{
                           absl::StrFormat("MoE routing collapsed in %d layer(s)",
                                           collapsed.size()),
                           absl::StrFormat("step %d: 90%% of the assignments go to %g "
                                           "expert(s) (the fewest that carry them, median "
                                           "of the last %d reports) <= %g (%g x top_k "
                                           "%d): %s",
                                           r.step, Worst(collapsed, false), r.n, limit,
                                           cfg.collapse_top_k_multiple, r.top_k,
                                           NameLayers(collapsed, kNamed, "layer ")),
                           onset};
                     });
  }
};

// Experts starved for moe.dead_steps (and moe.dead_min_reports reports): no
// assignment on at least 90% of the reports of the stretch (moe_levels.cc).
class Dead final : public Rule {
 public:
  void Judge(const Report& r, AlertSink& sink) override {
    const auto& cfg = r.cfg;
    Named dead;
    std::string experts;
    uint64_t onset = r.step;
    for (const auto& [name, s] : r.layers) {
      if (!r.settled || !s->counts_now) continue;
      if (const uint32_t now = DeadExperts(*s, r.step, cfg, &experts, *name, &onset)) {
        dead.emplace_back(*name, now);
      }
    }
    r.held.Condition(sink, AlertKind::kMoeDeadExpert, r.step, !dead.empty(), Worst(dead), [&] {
      return AlertText{
          absl::StrFormat("%g dead expert(s) in %d layer(s)", Worst(dead), dead.size()),
          absl::StrFormat("step %d: experts with no assignment in the global "
                          "batch on 90%%+ of the reports for >= %d steps (%d+ reports): %s",
                          r.step, cfg.dead_steps, cfg.dead_min_reports, experts),
          onset};
    });
  }

 private:
  // Experts of this layer dead at `step`; appends "layer L: experts a, b".
  static uint32_t DeadExperts(const LayerState& s, uint64_t step,
                              const decltype(HealthConfig::moe)& cfg,
                              std::string* out, const std::string& name, uint64_t* onset) {
    if (s.starving == 0) return 0;
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
};

// The hottest expert's load over the mean, persisting over moe.imbalance;
// or the worst layer's trend forecast to cross it.
class Imbalance final : public Rule {
 public:
  void Judge(const Report& r, AlertSink& sink) override {
    const auto& cfg = r.cfg;
    const uint32_t n = r.n;
    Named imbalanced;
    uint64_t onset = r.step;
    double worst = 0.0;
    for (const auto& [name, s] : r.layers) {
      if (!r.settled || !s->counts_now) continue;
      if (auto m = s->max_over_mean.Of(n)) {
        worst = std::max(worst, *m);
        if (!s->imbalance_base) s->imbalance_base = *m;
        // Over the line and risen from where the layer settled by as much
        // as the line is above balance: a skew the run settled with is what
        // its data gives (skewed data: 2-3x from the start, the run
        // healthy); one that grows from there is the balancing failing.
        const double line = r.Line(AlertKind::kMoeImbalanceHigh, 1.0, cfg.imbalance);
        const bool over = *m >= line && *m - *s->imbalance_base >= line - 1.0;
        if (r.Persists(AlertKind::kMoeImbalanceHigh, s->imbalanced, over,
                       s->max_over_mean.since(r.step))) {
          imbalanced.emplace_back(*name, *m);
          onset = std::min(onset, s->imbalanced.onset());
        }
      }
    }
    // The worst layer's imbalance trend, forecast to reach what the rule
    // above fires on: the run's settled level (the median of its first
    // reports after settling) risen by the line's distance from balance, and
    // at least the line. Only once the level is most of the way there and its
    // trend two thirds of the way and still rising. A skew that settled near
    // the line and stays there moves with its data, and its excursions are
    // no trend (a weak aux loss on mixed data: 1.6-2.1x for 2,000 steps).
    if (r.settled && worst > 0) {
      trend_.Add(r.step, worst);
      if (!base_.Of(n)) base_.Add(worst, n);
    }
    std::optional<uint64_t> at;
    double target = cfg.imbalance;
    if (const auto base = base_.Of(n); imbalanced.empty() && base) {
      target = std::max(cfg.imbalance, *base + cfg.imbalance - 1.0);
      // With hysteresis, as the level rules and LogZDrift's forecast have:
      // while the alert fires, its gate holds at 0.8 of its way from
      // balance and its horizon at horizon / 0.8, so a level hovering near
      // the gate is one episode (a data-mix shift to 2.2-2.3x under a
      // 2.28 gate fired, resolved and fired again 44 steps later).
      const bool firing = r.Firing(AlertKind::kMoeImbalanceHigh);
      if (worst >= r.Line(AlertKind::kMoeImbalanceHigh, 1.0, 1 + 0.8 * (target - 1))) {
        at = OutwardCrossing(trend_, *base, target - *base);
        const double horizon = static_cast<double>(cfg.horizon_steps) /
                               (firing ? r.config.change.resolve_ratio : 1.0);
        if (at && static_cast<double>(*at) > static_cast<double>(r.step) + horizon) at.reset();
      }
    }
    r.held.Condition(
        sink, AlertKind::kMoeImbalanceHigh, r.step, !imbalanced.empty() || at.has_value(),
        imbalanced.empty() ? worst : Worst(imbalanced), [&] {
          if (!imbalanced.empty()) {
            return AlertText{
                absl::StrFormat("MoE load imbalance %.3gx in %d layer(s)",
                                Worst(imbalanced), imbalanced.size()),
                absl::StrFormat("step %d: the hottest expert's load over the "
                                "mean (median of the last %d reports) >= %g "
                                "since step %d (>= %d steps): %s",
                                r.step, n, cfg.imbalance, onset, cfg.persist_steps,
                                NameLayers(imbalanced, kNamed, "layer ")),
                onset};
          }
          return AlertText{
              absl::StrFormat("MoE load imbalance forecast to reach %.3gx by step %d",
                              target, *at),
              absl::StrFormat("step %d: the worst layer's max/mean is %.3g, its "
                              "trend (Theil-Sen) risen from %.3g after "
                              "settling and rising: %.3g at step %d, within the "
                              "%d-step horizon",
                              r.step, worst, *base_.Of(n), target, *at,
                              cfg.horizon_steps)};
        });
  }
  void OnRewind(uint64_t step) override {
    base_.Clear();
    trend_.RewindTo(step);
  }

 private:
  TrendForecaster trend_{TrendForecaster::Options{}};
  moe::Level base_;  // the worst layer's first levels after settling
};

// The report's share of dropped assignments over every layer.
class Drops final : public Rule {
 public:
  void Judge(const Report& r, AlertSink& sink) override {
    const auto& cfg = r.cfg;
    const auto dropped = r.settled ? r.levels.dropped().Of(r.n) : std::nullopt;
    const bool drops =
        dropped.has_value() &&
        *dropped > r.Line(AlertKind::kMoeTokensDropped, 0.0, cfg.dropped_fraction);
    r.held.Condition(sink, AlertKind::kMoeTokensDropped, r.step, drops, dropped.value_or(0.0),
                     [&] {
                       return AlertText{
                           absl::StrFormat("MoE drops %.2g%% of its assignments",
                                           100 * *dropped),
                           absl::StrFormat("step %d: dropped / routed assignments over every "
                                           "layer (median of the last %d reports) is %.3g, "
                                           "above %g%s",
                                           r.step, r.n, *dropped, cfg.dropped_fraction,
                                           *dropped > 0.1 ? " (above 10%: a critical share)"
                                                          : "")};
                     });
  }
};

// The expert-parallel rank with the most assignments over the mean rank's.
class EpImbalance final : public Rule {
 public:
  void Judge(const Report& r, AlertSink& sink) override {
    const auto& cfg = r.cfg;
    Named hot;
    for (const auto& [name, s] : r.layers) {
      if (!r.settled || !s->blocks_now) continue;
      const auto level = s->blocks.Of(r.n);
      if (level && *level >= r.Line(AlertKind::kMoeExpertParallelImbalance, 1.0, cfg.ep_ratio)) {
        hot.emplace_back(*name, *level);
      }
    }
    r.held.Condition(
        sink, AlertKind::kMoeExpertParallelImbalance, r.step, !hot.empty(), Worst(hot), [&] {
          const LayerState& worst = r.levels.layer(
              std::max_element(hot.begin(), hot.end(),
                               [](const auto& a, const auto& b) { return a.second < b.second; })
                  ->first);
          return AlertText{
              absl::StrFormat("EP rank %d carries %.3gx the mean rank's tokens",
                              worst.hottest_block, Worst(hot)),
              absl::StrFormat("step %d: the expert-parallel rank with the most "
                              "assignments (experts in %d contiguous blocks) "
                              "carries >= %g x the mean rank's (median of the "
                              "last %d reports); the hottest: EP rank %d: %s",
                              r.step, r.ep_size, cfg.ep_ratio, r.n, worst.hottest_block,
                              NameLayers(hot, kNamed, "layer "))};
        });
  }
};

class MoeRouting final : public Detector {
 public:
  MoeRouting() {
    rules_.push_back(std::make_unique<Collapse>());
    rules_.push_back(std::make_unique<Dead>());
    rules_.push_back(std::make_unique<Imbalance>());
    rules_.push_back(moe::MakeAuxOffBalance());
    rules_.push_back(moe::MakeZGrowth());
    rules_.push_back(moe::MakeBiasDrift());
    rules_.push_back(std::make_unique<Drops>());
    rules_.push_back(std::make_unique<EpImbalance>());
  }

  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    const v1::StepRecord& rec = ctx.record;
    if (!rec.has_moe() || rec.moe().layers().empty() || !ctx.post_warmup) return;
    const auto& cfg = ctx.config.moe;
    const uint64_t step = rec.step();
    if (!first_post_warmup_.has_value()) first_post_warmup_ = step;
    const v1::MoeConfig* moe = ctx.run.moe.has_value() ? &*ctx.run.moe : nullptr;
    const uint32_t ep_size = moe != nullptr ? moe->ep_size() : 0;
    const uint32_t top_k = moe != nullptr && moe->top_k() > 0 ? moe->top_k() : 1;
    const moe::ReportLayers layers = levels_.Update(rec.moe(), step, ctx.config, top_k, ep_size);
    const Report report{
        ctx.config,
        cfg,
        step,
        step - *first_post_warmup_ >= cfg.settle_steps,
        cfg.level_reports,
        top_k,
        ep_size,
        moe != nullptr && moe->bias_update_rate() > 0 ? moe->bias_update_rate() : 1e-3,
        moe == nullptr || (moe->balancing() != v1::NO_BALANCING &&
                           moe->balancing() != v1::AUX_FREE_BIAS),
        layers,
        levels_,
        held_};
    for (const auto& rule : rules_) rule->Judge(report, sink);
  }

  void OnRewind(uint64_t step) override {
    levels_.Clear();
    held_ = Held{};
    for (const auto& rule : rules_) rule->OnRewind(step);
    if (first_post_warmup_.has_value() && *first_post_warmup_ >= step) {
      first_post_warmup_.reset();
    }
  }

 private:
  moe::MoeLevels levels_;
  Held held_;
  std::vector<std::unique_ptr<Rule>> rules_;
  std::optional<uint64_t> first_post_warmup_;
};

}  // namespace

void AddMoeDetectors(const HealthConfig& config, Detectors* out) {
  out->push_back(std::make_unique<MoeRouting>());
}

}  // namespace trainwatch
