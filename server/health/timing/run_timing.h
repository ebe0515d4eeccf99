// Where a run's time goes (docs/goodput-and-stragglers.md): its ranks' step
// times, the lead rank's input waits, its goodput, and the replays of its
// spikes (the restart loop). The run's pipeline feeds it every record; the
// RankStraggler and InputPipelineStall detectors (detectors/timing.cc) ask
// it whether their condition holds, and the alert tracker does the rest
// (fire, hysteresis, resolve). Pure and single-threaded, like the pipeline
// that owns it.
#ifndef TRAINWATCH_SERVER_HEALTH_TIMING_RUN_TIMING_H_
#define TRAINWATCH_SERVER_HEALTH_TIMING_RUN_TIMING_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "health/health_config.h"
#include "health/signals/step_digests.h"
#include "health/timing/goodput.h"
#include "health/timing/spike_replay.h"
#include "health/timing/step_times.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

class RunTiming {
 public:
  // Step times of ranks arriving up to `horizon_steps` apart are judged step
  // by step (RunHealth's RankProgress keeps the lag within it).
  explicit RunTiming(const TimingConfig& config, uint32_t horizon_steps = 131072);
  // The step times a step waits with until it is judged: a float a rank.
  struct PendingTimes {
    uint32_t ranks = 0;
    std::vector<float> seconds;  // by rank; NaN: none
  };
  RunTiming(const RunTiming&) = delete;
  RunTiming& operator=(const RunTiming&) = delete;

  // A fresh record of any rank, from the stream whose RunStart named `host`:
  // its step time is kept until the step is judged (JudgeRanksThrough).
  void OnRecord(uint32_t rank, uint32_t attempt, std::string_view host,
                const v1::StepRecord& r);
  // Every rank's records up to `through` (of the attempt they came with) are
  // in: their step times enter the ranks' levels step by step, in rank
  // order, and
  // `judged(step)` is called after each step (RankStraggler is evaluated
  // there).
  void JudgeRanksThrough(uint64_t through,
                         const std::function<void(uint64_t step)>& judged);
  // Another stream leads the run: the lead's input waits start afresh.
  void ResetLead() { wait_ = InputWait{}; }
  // A live lead record's input wait, before the detectors judge it.
  void AddLeadWait(const v1::StepRecord& r);
  // A lead record (after OnRecord for it, and after the detectors judged
  // it): goodput and spike replays. `now_unix_nanos` stands in for a record
  // without time_unix_nanos. Returns the spike verdicts it settles.
  std::vector<SpikeOutcome> OnLeadRecord(const v1::StepRecord& r,
                                         int64_t now_unix_nanos);
  // A new attempt restarted at `first_step`; the run had reached `last_step`.
  void OnRewind(uint64_t first_step, uint64_t last_step);
  // A spike fired; returns the verdict when it is a recurrence under replay.
  std::vector<SpikeOutcome> OnSpike(uint64_t step,
                                    const std::vector<int64_t>& batch_ids);
  // The run finished at `step`.
  std::vector<SpikeOutcome> OnFinish(uint64_t step);

  // RankStraggler, evaluated at each judged step: one rank's CUSUM against
  // the median rank passed its threshold; while firing, holds until that
  // rank's level falls below resolve_ratio.
  bool StragglerHolds();
  double StragglerRatio() const;  // the named rank's level / the median's
  std::string StragglerSummary() const;
  std::string StragglerDescription() const;
  std::optional<uint32_t> straggler_rank() const { return straggler_; }
  std::string straggler_host() const;

  // InputPipelineStall: the median of data_wait_s / step_time_s over the
  // lead's recent steps is >= fraction; while firing, >= resolve_fraction.
  bool StallHolds();
  double StallFraction() const { return wait_.MedianFraction(); }
  std::string StallDescription() const;

  const RankStepTimes& step_times() const { return times_; }
  bool has_input_waits() const { return wait_.ready(); }
  GoodputTotals goodput() const { return goodput_.totals(); }

  // The per-run part of GetRunHealth: step-time statistics over ranks, the
  // slowest ranks, goodput.
  void FillHealth(v1::WindowStats* window, v1::GetRunHealthResponse* response,
                  size_t slowest_ranks = 8) const;

  size_t MemoryBytes() const;

 private:
  const TimingConfig& config_;
  RankStepTimes times_;
  StepDigests<PendingTimes> pending_;
  InputWait wait_;
  Goodput goodput_;
  SpikeReplay replay_;
  std::optional<uint32_t> straggler_;  // the rank named while firing
  bool stalled_ = false;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_TIMING_RUN_TIMING_H_
