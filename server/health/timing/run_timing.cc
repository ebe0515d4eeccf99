#include "health/timing/run_timing.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainwatch {

RunTiming::RunTiming(const TimingConfig& config, uint32_t horizon_steps)
    : config_(config),
      times_(config.straggler),
      pending_(horizon_steps),
      goodput_(config.goodput),
      replay_(config.spike_replay) {}

void RunTiming::OnRecord(uint32_t rank, uint32_t attempt, std::string_view host,
                         const v1::StepRecord& r) {
  if (!r.has_step_time_s()) return;
  if (times_.HostOf(rank) != host) times_.SetHost(rank, host);
  PendingTimes* p = pending_.Get(attempt, r.step());
  if (p == nullptr) return;
  if (rank >= p->seconds.size()) {
    p->seconds.resize(size_t{rank} + 1, std::numeric_limits<float>::quiet_NaN());
  }
  p->seconds[rank] = static_cast<float>(r.step_time_s());
  ++p->ranks;
}

void RunTiming::JudgeRanksThrough(
    uint64_t through, const std::function<void(uint64_t step)>& judged) {
  pending_.JudgeThrough(through, [&](uint64_t step, const PendingTimes& p) {
    for (uint32_t rank = 0; rank < p.seconds.size(); ++rank) {
      if (!std::isnan(p.seconds[rank])) times_.Add(rank, p.seconds[rank]);
    }
    judged(step);
  });
}

void RunTiming::AddLeadWait(const v1::StepRecord& r) {
  if (r.has_step_time_s() && r.has_data_wait_s()) {
    wait_.Add(r.step_time_s(), r.data_wait_s());
  }
}

std::vector<SpikeOutcome> RunTiming::OnLeadRecord(const v1::StepRecord& r,
                                                  int64_t now_unix_nanos) {
  std::optional<double> step_time;
  if (r.has_step_time_s()) step_time = r.step_time_s();
  goodput_.OnLeadRecord(r.step(), r.skipped(),
                        r.time_unix_nanos() != 0 ? r.time_unix_nanos()
                                                 : now_unix_nanos,
                        step_time);
  std::vector<int64_t> ids(r.batch_ids().begin(), r.batch_ids().end());
  return replay_.OnLeadRecord(r.step(), ids);
}

void RunTiming::OnRewind(uint64_t first_step, uint64_t last_step) {
  goodput_.OnRewind(first_step, last_step);
  replay_.OnRewind(first_step);
}

std::vector<SpikeOutcome> RunTiming::OnSpike(
    uint64_t step, const std::vector<int64_t>& batch_ids) {
  return replay_.OnSpike(step, batch_ids);
}

std::vector<SpikeOutcome> RunTiming::OnFinish(uint64_t step) {
  return replay_.OnFinish(step);
}

bool RunTiming::StragglerHolds() {
  if (straggler_.has_value() &&
      times_.Ratio(*straggler_) < config_.straggler.resolve_ratio) {
    straggler_.reset();
  }
  if (!straggler_.has_value()) straggler_ = times_.Suspect();
  return straggler_.has_value();
}

double RunTiming::StragglerRatio() const {
  return straggler_.has_value() ? times_.Ratio(*straggler_) : 1.0;
}

std::string RunTiming::straggler_host() const {
  return straggler_.has_value() ? times_.HostOf(*straggler_) : "";
}

std::string RunTiming::StragglerSummary() const {
  if (!straggler_.has_value()) return "a rank is slower than the others";
  const std::string& host = times_.HostOf(*straggler_);
  return absl::StrCat("rank ", *straggler_,
                      host.empty() ? "" : absl::StrCat(" on ", host),
                      " is a straggler");
}

std::string RunTiming::StragglerDescription() const {
  if (!straggler_.has_value()) return "";
  const std::string& host = times_.HostOf(*straggler_);
  const uint32_t slow = times_.RanksAtLeast(config_.straggler.ratio);
  return absl::StrFormat(
      "rank %d%s takes %.2fx the median rank's step time (%.3f s vs %.3f s "
      "over recent steps); every rank waits for it, so the run loses %.0f%% "
      "of each step to it. %d of %d ranks are >= %.1fx the median.",
      *straggler_, host.empty() ? " (host unknown)" : absl::StrCat(" on host ", host),
      StragglerRatio(), times_.median_seconds() * StragglerRatio(),
      times_.median_seconds(), 100.0 * (1.0 - 1.0 / StragglerRatio()), slow,
      times_.ranks(), config_.straggler.ratio);
}

bool RunTiming::StallHolds() {
  if (!wait_.ready()) {
    stalled_ = false;
    return false;
  }
  const double f = wait_.MedianFraction();
  stalled_ = stalled_ ? f >= config_.input_stall.resolve_fraction
                      : f >= config_.input_stall.fraction;
  return stalled_;
}

std::string RunTiming::StallDescription() const {
  return absl::StrFormat(
      "the lead rank waits for its input pipeline %.0f%% of each step (median "
      "of data_wait_s / step_time_s over its last %d steps; threshold %.0f%%)",
      100.0 * wait_.MedianFraction(), InputWait::kSteps,
      100.0 * config_.input_stall.fraction);
}

void RunTiming::FillHealth(v1::WindowStats* window,
                           v1::GetRunHealthResponse* response,
                           size_t slowest_ranks) const {
  if (times_.ready()) {
    window->set_step_seconds_median(times_.median_seconds());
    window->set_step_seconds_max(times_.max_seconds());
    window->set_straggler_lost_fraction(times_.lost_fraction());
    for (const RankStepTimes::RankDetail& d : times_.Slowest(slowest_ranks)) {
      v1::RankStepTime* out = response->add_slowest_ranks();
      out->set_rank(d.rank);
      out->set_host(d.host);
      out->set_step_seconds(d.seconds);
      out->set_ratio_to_median(d.ratio);
    }
  }
  if (wait_.ready()) window->set_data_wait_fraction(wait_.MedianFraction());
  const GoodputTotals t = goodput_.totals();
  v1::Goodput* g = response->mutable_goodput();
  g->set_ratio(t.ratio);
  g->set_wall_seconds(t.wall_seconds);
  g->set_productive_steps(t.productive_steps);
  g->set_skipped_steps(t.skipped_steps);
  g->set_rewound_steps(t.rewound_steps);
  g->set_skipped_seconds(t.skipped_seconds);
  g->set_rewound_seconds(t.rewound_seconds);
  g->set_silent_seconds(t.silent_seconds);
}

size_t RunTiming::MemoryBytes() const {
  return sizeof(*this) + times_.MemoryBytes() +
         pending_.size() * sizeof(PendingTimes);
}

}  // namespace trainwatch
