// Every alert trainwatch raises (docs/detectors.md) and its whole policy: its
// name, severity, what to tell the person it wakes up (the likely cause and
// the fix), what it means in a line, the report's charts it is drawn on, how
// Prometheus raises it from /metrics,
// what its detector reads (its scope), the alerts it is a consequence of, and
// whether it implicates the machine it names. The deploy files and docs
// tables that repeat it are printed from here (health/catalog_print.h,
// `trainwatch-server --print-catalog`). Adding an alert is its entry here
// plus its detector (and their tests).
#ifndef TRAINWATCH_SERVER_HEALTH_ALERT_CATALOG_H_
#define TRAINWATCH_SERVER_HEALTH_ALERT_CATALOG_H_

#include <array>
#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string_view>

#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

enum class AlertKind {
  // Gradients and clipping: the norm's level, spikes and the clip
  // (detectors/clipping.cc, grad_norm.cc).
  kClipFractionHigh,
  kPostClipNormReported,
  kGradNormSpike,
  kGradNormDrift,
  // The loss: spikes, their early warning, divergence, and the run against its
  // reference runs (detectors/loss.cc, hazard.cc, baseline.cc).
  kLossSpike,
  kSpikeHazard,
  kLossDivergence,
  kBaselineDeviation,
  // fp16 loss scaling, the clip before unscaling, and non-finite updates
  // (detectors/fp16.cc, nonfinite.cc).
  kLossScaleCollapse,
  kSkipRateHigh,
  kScalerStuck,
  kClipBeforeUnscale,
  kFp16WithoutScaler,
  kNonFiniteUpdate,
  // FP8 per-tensor scaling (detectors/fp8.cc).
  kFp8Overflow,
  kFp8Underflow,
  kFp8ScaleMismatch,
  kFp8AmaxDesync,
  kFp8AmaxGrowth,
  // Output logits (detectors/logits.cc).
  kAttentionLogitGrowth,
  kLogZDrift,
  // The optimizer's state per layer (detectors/layers.cc).
  kAdamStaleSecondMoment,
  kLayerUpdateStall,
  // Across ranks and shards: the same step's norms (detectors/ranks.cc).
  kRankNormMismatch,
  kShardNormMismatch,
  // Time: a silent run, stragglers, input stalls, and (server-wide, over every
  // run's alerts; raised on the run whose alert made its host suspect) suspect
  // hosts (detectors/timing.cc, host_suspect.cc).
  kRunSilent,
  kRankStraggler,
  kInputPipelineStall,
  kHostSuspect,
  // Mixture-of-experts routing (detectors/moe.cc, moe_router.cc).
  kMoeRouterCollapse,
  kMoeDeadExpert,
  kMoeImbalanceHigh,
  kMoeAuxLossOffBalance,
  kMoeRouterZLossGrowth,
  kMoeExpertBiasDrift,
  kMoeTokensDropped,
  kMoeExpertParallelImbalance,
  // The closed loop's ladder ran out (server/closedloop): raised by the run's
  // router when the policy proposes its Stop.
  kClosedLoopExhausted,
  // Not an alert: the count of those above.
  kCount,
};
inline constexpr size_t kAlertKindCount = static_cast<size_t>(AlertKind::kCount);

// What an alert's detector reads: the lead stream's records, every rank's
// (judged once a step is complete across ranks), the clock, or every run's
// alerts (server-wide).
enum class AlertScope { kLead, kAcrossRanks, kClock, kServer };

// The alerts an alert is a consequence of, tried in order: the first one
// firing at its steps is its caused_by (docs/detectors.md#one-page-per-cause;
// deploy/alertmanager's inhibit_rules).
struct AlertCauses {
  constexpr AlertCauses() = default;
  constexpr AlertCauses(std::initializer_list<AlertKind> kinds) {
    for (AlertKind k : kinds) list[n++] = k;
  }
  constexpr const AlertKind* begin() const { return list.data(); }
  constexpr const AlertKind* end() const { return list.data() + n; }

  std::array<AlertKind, 4> list{};
  size_t n = 0;
};

// How deploy/prometheus raises an alert from the run's series on /metrics.
enum class AlertRuleKind {
  // max by (run) of trainwatch_alert_active{alertname} == 1: the server's
  // verdict, held with its hysteresis.
  kActive,
  // The verdict, valued by another series of the run (`value`), so that
  // $value and the description carry the number.
  kValued,
  // Not printed: written by hand in trainwatch-rules.yml (RunSilent's clock
  // backstop, HostSuspect's count across servers).
  kCustom,
};

// The Prometheus rule of an alert and the annotations Prometheus gives it
// beyond likely_cause and fix (texts are Go templates over $labels.run).
struct AlertRule {
  AlertRuleKind kind = AlertRuleKind::kActive;
  std::string_view summary;
  // kActive: "trainwatch-server reports NAME firing for run R; QUOTE_LABEL:
  // (the run's last value of `quote`, printed through `format`). DETAILS";
  // no quote when quote_label is empty.
  std::string_view quote_label;
  std::string_view quote;  // a series selector, %q for the run
  std::string_view format = "printf \"%.4g\"";
  std::string_view details =
      "Details (numbers, step range, batch ids): trainwatchctl alerts --run "
      "{{ $labels.run }} --active.";
  // kValued: the series that values it, and its whole description.
  std::string_view value;
  std::string_view description;
  // Alertmanager mutes the alerts that name this one as a cause while it
  // fires (deploy/alertmanager's inhibit_rules), unless the consequence is
  // critical and this is not: that one is the page.
  bool inhibits = true;
};

struct AlertSpec {
  AlertKind kind;
  std::string_view name;      // the alertname label
  // critical and warning page; info is recorded, exported and drawn, not
  // paged (the shipped Alertmanager routes).
  v1::Severity severity;
  std::string_view likely_cause;
  std::string_view fix;
  // What it means, in a line (the alert tables of README and docs).
  std::string_view brief;
  // The charts of the HTML report (client/report/report.cc) it is shaded on;
  // none: the norm chart.
  std::array<std::string_view, 3> charts;
  AlertRule rule;
  AlertScope scope = AlertScope::kLead;
  AlertCauses causes = {};
  // A host it names counts toward HostSuspect (a lemon machine).
  bool implicates_host = false;
  // It carries a restart plan: the closed loop answers it with a rollback,
  // and a restart from before it resolves it (a recurrence in the replayed
  // steps is an alert of its own, the rung above).
  bool has_restart_plan = false;
};

const AlertSpec& Spec(AlertKind kind);
const std::array<AlertSpec, kAlertKindCount>& AllAlertSpecs();
std::optional<AlertKind> AlertKindByName(std::string_view name);

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_ALERT_CATALOG_H_
