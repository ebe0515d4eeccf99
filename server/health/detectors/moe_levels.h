// What the MoE routing rules (detectors/moe.cc) judge: per layer, the levels
// of its load, balancing loss, router logits, aux-free bias and
// expert-parallel blocks, updated once a report by MoeLevels; the
// persistence and hysteresis the rules share (Persistent, Held).
//
// A level is the median of a signal's last moe.level_reports reports; one
// report is one global batch, so a level moves with the batch's mix of data
// and a rule judges it against what the layer settled at.
#ifndef TRAINWATCH_SERVER_HEALTH_DETECTORS_MOE_LEVELS_H_
#define TRAINWATCH_SERVER_HEALTH_DETECTORS_MOE_LEVELS_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/node_hash_map.h"
#include "health/alert_catalog.h"
#include "health/detector.h"
#include "health/health_config.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch::moe {

// The last `n` values of one signal of one layer, and their median (taken
// once a value, when the ring is full).
class Level {
 public:
  void Add(double v, uint32_t n, uint64_t step = 0);
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
  void Clear();

 private:
  std::vector<double> values_;
  std::vector<uint64_t> steps_;
  std::vector<double> sorted_;  // values_ in order: the median without a select
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
  bool Update(bool holds, uint64_t step, uint64_t onset, uint32_t steps, uint32_t reports);
  uint64_t onset() const { return onset_; }

 private:
  uint64_t since_ = 0, onset_ = 0;
  uint32_t reports_ = 0;
};

// MoeRouterCollapse's limit for a layer of `experts` at top_k: the routing
// rests on at most this many experts (its n90, the fewest carrying 90% of
// the assignments): 2 x top_k, at most half the layer.
inline double CollapseLimit(uint32_t top_k, double multiple, size_t experts) {
  return std::min(multiple * top_k, experts / 2.0);
}

struct LayerState {
  // n90: the fewest experts that carry 90% of the assignments.
  Level n90, max_over_mean, aux, z, logit, blocks;
  // Baselines, the first level after settling: the balancing loss's, the
  // load's max/mean and the router logits' (z-loss, else max logit).
  std::optional<double> aux_base, imbalance_base, logit_base;
  // The router logits' levels (z-loss, else max logit) over the last
  // moe.z_growth_steps while they were not rising, as a monotonic deque
  // (ascending levels, oldest first): front() is their lowest.
  std::deque<std::pair<uint64_t, double>> logit_lows;
  bool lows_of_z = false;  // logit_lows holds z-loss levels
  bool reports_z = false;       // the layer has reported a z-loss
  bool reports_counts = false;  // ... its assignments per expert
  // What this report carried: counts, and counts in expert-parallel blocks.
  bool counts_now = false, blocks_now = false;
  Persistent imbalanced, logits_grown;
  // Per expert, its starved stretch: where it began (a report with no
  // assignment), its reports, and those of them with some (at most
  // kStarvedFedShare of them: more ends the stretch).
  std::vector<uint64_t> empty_since;
  std::vector<uint32_t> empty_reports, fed_reports;
  uint32_t starving = 0;  // experts with empty_reports > 0 (0: none to judge)
  size_t experts = 0;  // in the last report with counts
  // The aux-free bias: the last report's and its change.
  std::vector<float> bias, bias_delta;
  uint32_t flip_reports = 0;          // reports in a row that flipped
  double flip_start_imbalance = 0.0;  // max/mean when that run began
  Level bias_mean_over_sd;
  double bias_mean = 0.0;  // the last report's, across experts
  uint32_t hottest_block = 0;  // the EP rank with the most assignments
  double last_max_over_mean = 0.0;
};

// One report's layers, after their levels took it in, in the report's order.
using ReportLayers = std::vector<std::pair<const std::string*, LayerState*>>;

// The levels of every layer of one run, updated a report at a time.
class MoeLevels {
 public:
  // Takes one report in; returns its layers (a layer past the first
  // kMaxLayers is left out).
  ReportLayers Update(const v1::MoeStats& report, uint64_t step, const HealthConfig& config,
                      uint32_t top_k, uint32_t ep_size);
  // The report's share of dropped assignments over every layer (what
  // Summarize() gives /metrics), its level.
  const Level& dropped() const { return dropped_; }
  const LayerState& layer(const std::string& name) const { return layers_.at(name); }
  void Clear();

 private:
  // By name; node-based, so that a report's ReportLayers keep pointing at
  // them (a sorted map's string compares, 48 lookups a report, cost more).
  absl::node_hash_map<std::string, LayerState> layers_;
  Level dropped_;
};

// A layer that holds a rule, with the number the description names.
using Named = std::vector<std::pair<std::string, double>>;

double Worst(const Named& layers, bool largest = true);

// The hysteresis of the level rules: once an alert's condition held, until
// the tracker resolves it (resolve_after_steps without holding), a rule
// judges against a line change.resolve_ratio (0.8) of the way from the
// neutral value (a balanced load's max/mean of 1, no drops) to its fire
// line: max/mean 1.8 holds what 2 fired. A level hovering at its line is one
// alert, not a flapping pager.
class Held {
 public:
  double Line(AlertKind kind, uint64_t step, double neutral, double fire,
              const HealthConfig& config) const;
  // Whether the alert held within the last resolve_after_steps (it fires).
  bool Firing(AlertKind kind, uint64_t step, const HealthConfig& config) const;
  // Reports the condition, noting the step it held.
  void Condition(AlertSink& sink, AlertKind kind, uint64_t step, bool holds, double value,
                 const std::function<AlertText()>& text);

 private:
  std::map<AlertKind, uint64_t> last_held_;  // the last step each held
};

// One report, its levels taken in: what every rule judges.
struct Report {
  const HealthConfig& config;
  const decltype(HealthConfig::moe)& cfg;
  uint64_t step;
  bool settled;  // moe.settle_steps past warmup: before it, nothing holds
  uint32_t n;    // reports in a level
  uint32_t top_k, ep_size;
  double bias_rate;
  // A run whose balancing is not a loss (none, or the aux-free bias) has no
  // balancing loss to be off: its aux loss is a diagnostic, and its load is
  // judged by the load's own rules.
  bool judge_aux;
  const ReportLayers& layers;
  const MoeLevels& levels;
  Held& held;

  // A rule's line: its fire line, or while its alert is firing the lower
  // one that holds it (hysteresis).
  double Line(AlertKind kind, double neutral, double fire) const {
    return held.Line(kind, step, neutral, fire, config);
  }
  bool Firing(AlertKind kind) const { return held.Firing(kind, step, config); }
  // Persistence gates a fire; once `kind` fires, a report over its (lower)
  // line holds it: a one-report dip restarts the count but does not let a
  // sustained condition resolve and fire again (a layer at 2.7-2.9x its
  // mean's load was three MoeImbalanceHigh episodes in 500 steps).
  bool Persists(AlertKind kind, Persistent& p, bool holds, uint64_t onset) const {
    const bool persisted = p.Update(holds, step, onset, cfg.persist_steps, cfg.persist_reports);
    return persisted || (holds && Firing(kind));
  }
};

// One alert's rule over a report.
class Rule {
 public:
  virtual ~Rule() = default;
  virtual void Judge(const Report& r, AlertSink& sink) = 0;
  virtual void OnRewind(uint64_t step) {}
};

// detectors/moe_router.cc: MoeAuxLossOffBalance, MoeRouterZLossGrowth,
// MoeExpertBiasDrift.
std::unique_ptr<Rule> MakeAuxOffBalance();
std::unique_ptr<Rule> MakeZGrowth();
std::unique_ptr<Rule> MakeBiasDrift();

}  // namespace trainwatch::moe

#endif  // TRAINWATCH_SERVER_HEALTH_DETECTORS_MOE_LEVELS_H_
