// Test helpers for detectors: a RunHealth with the real detectors and alert
// tracker, recording every transition and spike.
#ifndef TRAINWATCH_TESTS_UNIT_HEALTH_TEST_UTIL_H_
#define TRAINWATCH_TESTS_UNIT_HEALTH_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "health/run/run_health.h"

namespace trainwatch::testing {

struct Transition {
  AlertKind kind;
  bool firing;     // true: fired, false: resolved
  uint64_t step;   // started_step when fired, resolved_step when resolved
  double peak;
  std::string description;
  std::vector<int64_t> batch_ids;
  uint64_t onset_step = 0;
  std::string caused_by;  // "" when a cause of its own
};

// A step record as a client would send it: clipped and clip_coef derived
// from max_norm (as the clients do) when max_norm > 0.
inline v1::StepRecord Rec(uint64_t step, double grad_norm, double max_norm = 1.0) {
  v1::StepRecord r;
  r.set_step(step);
  r.set_grad_norm(grad_norm);
  if (max_norm > 0) {
    r.set_clipped(grad_norm > max_norm);
    if (!std::isnan(grad_norm)) {
      r.set_clip_coef(std::min(1.0, max_norm / (grad_norm + 1e-6)));
    }
  }
  r.add_batch_ids(static_cast<int64_t>(step) * 10);
  return r;
}

class HealthHarness {
 public:
  explicit HealthHarness(RunInfo info, HealthConfig config = {})
      : config_(std::move(config)),
        health_(std::move(info), config_,
                [this](const AlertEpisode& e) {
                  const std::string cause =
                      e.caused_by ? std::string(Spec(*e.caused_by).name) : "";
                  if (e.update) {  // caused_by found later: not a new fire
                    for (auto t = transitions.rbegin(); t != transitions.rend(); ++t) {
                      if (t->kind == e.kind && t->firing) {
                        t->caused_by = cause;
                        break;
                      }
                    }
                    return;
                  }
                  transitions.push_back(
                      {e.kind, e.firing, e.firing ? e.started_step : e.resolved_step,
                       e.peak_value, e.text.description, e.batch_ids,
                       e.text.onset_step, cause});
                },
                [this](const SpikeInfo& s) { spikes.push_back(s); }) {}

  // A lead-stream record (rank 0); also fed to the cross-rank checks.
  void Lead(const v1::StepRecord& r) {
    health_.OnRankRecord(0, 0, r);
    health_.OnLeadRecord(r, now_ns_ += 1'000'000);
  }
  // A record of another rank (cross-rank checks only).
  void Rank(uint32_t rank, const v1::StepRecord& r) {
    health_.OnRankRecord(rank, 0, r);
  }

  std::vector<Transition> Fired(AlertKind kind) const { return Filter(kind, true); }
  std::vector<Transition> Resolved(AlertKind kind) const { return Filter(kind, false); }
  // Alertnames that fired at least once.
  std::vector<std::string> FiredNames() const {
    std::vector<std::string> names;
    for (const Transition& t : transitions) {
      std::string n(Spec(t.kind).name);
      if (t.firing && std::find(names.begin(), names.end(), n) == names.end()) {
        names.push_back(n);
      }
    }
    return names;
  }

  RunHealth& health() { return health_; }
  const HealthConfig& config() const { return config_; }

  std::vector<Transition> transitions;
  std::vector<SpikeInfo> spikes;

 private:
  std::vector<Transition> Filter(AlertKind kind, bool firing) const {
    std::vector<Transition> out;
    for (const Transition& t : transitions) {
      if (t.kind == kind && t.firing == firing) out.push_back(t);
    }
    return out;
  }

  HealthConfig config_;
  RunHealth health_;
  int64_t now_ns_ = 1'700'000'000'000'000'000;
};

}  // namespace trainwatch::testing

#endif  // TRAINWATCH_TESTS_UNIT_HEALTH_TEST_UTIL_H_
