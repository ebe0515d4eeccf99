// Where a run's time goes: RankStraggler (every rank's step times, judged
// across ranks), InputPipelineStall (the lead's input waits) and RunSilent
// (the clock). The state they judge, step times and waits, is the run's
// RunTiming, which also feeds goodput and /metrics.
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "health/detectors/internal.h"
#include "health/timing/run_timing.h"

namespace trainwatch {
namespace {

// One rank's step time stays >= straggler.ratio x the median rank's
// (sustained: a CUSUM per rank against the median); names the rank and its
// host. Judged once per step, when every rank's record of it is in.
class RankStraggler final : public Detector {
 public:
  void OnRanksThrough(const RanksThroughContext& ctx, AlertSink& sink) override {
    RunTiming& t = ctx.timing;
    t.JudgeRanksThrough(ctx.through, [&](uint64_t step) {
      sink.Condition(AlertKind::kRankStraggler, step, t.StragglerHolds(),
                     t.StragglerRatio(), [&t] {
                       return AlertText{.summary = t.StragglerSummary(),
                                        .description = t.StragglerDescription(),
                                        .host = t.straggler_host(),
                                        .rank = t.straggler_rank()};
                     });
    });
  }
};

// data_wait_s is a large share of step_time_s on the lead rank, sustained.
class InputPipelineStall final : public Detector {
 public:
  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    RunTiming& t = ctx.timing;
    sink.Condition(AlertKind::kInputPipelineStall, ctx.record.step(),
                   t.StallHolds(), t.StallFraction(), [&t, &ctx] {
                     return AlertText{
                         .summary = "the input pipeline stalls the run",
                         .description = t.StallDescription(),
                         .host = ctx.run.host};
                   });
  }
};

// No record for silent.seconds from a run that has not finished; resolved
// by the next record or event of any of its streams (or by its end).
class RunSilent final : public Detector {
 public:
  void OnTick(const TickContext& ctx, AlertSink& sink) override {
    const int64_t quiet = ctx.now_unix_nanos - ctx.last_record_unix_nanos;
    if (quiet < ctx.config.silent.seconds * 1'000'000'000) return;
    const double seconds = static_cast<double>(quiet) * 1e-9;
    sink.Fire(AlertKind::kRunSilent, ctx.last_step, seconds,
              AlertText{absl::StrCat("run ", ctx.run.run_id, " is silent"),
                        absl::StrFormat("no step from run %s for %.0f s (last step %d); "
                                        "the run has not reported RUN_FINISHED",
                                        ctx.run.run_id, seconds, ctx.last_step)});
  }
  void OnActivity(uint64_t step, AlertSink& sink) override {
    sink.Resolve(AlertKind::kRunSilent, step);
  }
};

}  // namespace

std::unique_ptr<Detector> MakeRankStraggler(const HealthConfig&) {
  return std::make_unique<RankStraggler>();
}

std::unique_ptr<Detector> MakeInputPipelineStall(const HealthConfig&) {
  return std::make_unique<InputPipelineStall>();
}

std::unique_ptr<Detector> MakeRunSilent(const HealthConfig&) {
  return std::make_unique<RunSilent>();
}

}  // namespace trainwatch
