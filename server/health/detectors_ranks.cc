// Cross-rank detectors (DESIGN.md §4): RankNormMismatch, ShardNormMismatch.
// They read every rank's records (OnRankRecord); all ranks of a run are
// processed on the run's shard thread, in arrival order.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "health/detectors_internal.h"

namespace trainwatch {
namespace {

// What the ranks said so far about each recent step, as one accumulator per
// step. Holds only the latest attempt (records of an older one are stale),
// and at most `horizon` steps waiting for more ranks, evicting the oldest.
template <typename PerStep>
class PendingSteps {
 public:
  explicit PendingSteps(size_t horizon) : horizon_(horizon) {}

  // The accumulator of `step`, created if needed; nullptr for a record of an
  // older attempt, or of a step older than every pending one when full.
  PerStep* Get(uint32_t attempt, uint64_t step) {
    if (attempt < attempt_) return nullptr;
    if (attempt > attempt_) {
      attempt_ = attempt;
      steps_.clear();
    }
    auto it = steps_.find(step);
    if (it != steps_.end()) return &it->second;
    if (horizon_ == 0) return nullptr;
    if (steps_.size() >= horizon_) {
      if (step < steps_.begin()->first) return nullptr;
      steps_.erase(steps_.begin());
    }
    return &steps_[step];
  }

  // All ranks reported `step`.
  void Done(uint64_t step) { steps_.erase(step); }

  void RewindTo(uint64_t step) {
    steps_.erase(steps_.lower_bound(step), steps_.end());
  }

 private:
  size_t horizon_;
  uint32_t attempt_ = 0;
  std::map<uint64_t, PerStep> steps_;
};

// One rank's report of a step.
struct RankReport {
  uint32_t rank = 0;
  double grad_norm = 0.0;
  std::optional<double> clip_coef;
};

// The ranks that reported the smallest and the largest finite value of one
// quantity for a step.
class Extremes {
 public:
  void Add(double value, const RankReport& report) {
    if (!std::isfinite(value)) return;
    if (!low_.has_value() || value < low_value_) {
      low_ = report;
      low_value_ = value;
    }
    if (!high_.has_value() || value > high_value_) {
      high_ = report;
      high_value_ = value;
    }
  }

  // (max - min) / |max| (0 when fewer than two ranks reported a finite value).
  double RelativeSpread() const {
    if (!low_.has_value()) return 0.0;
    constexpr double kTiny = 1e-30;
    return (high_value_ - low_value_) / std::max(std::abs(high_value_), kTiny);
  }

  // The two reports, the lower rank first.
  std::pair<const RankReport&, const RankReport&> ByRank() const {
    if (low_->rank < high_->rank) return {*low_, *high_};
    return {*high_, *low_};
  }

 private:
  std::optional<RankReport> low_;
  std::optional<RankReport> high_;
  double low_value_ = 0.0;
  double high_value_ = 0.0;
};

// Catches per-shard clipping: each rank clips with its own local norm, so
// ranks report different grad_norm or clip_coef for one step. Holds at a
// step once two ranks' values differ by a relative spread (max - min) / |max|
// above rank_mismatch.relative_spread.
class RankNormMismatch final : public Detector {
 public:
  explicit RankNormMismatch(const HealthConfig& config)
      : pending_(config.rank_mismatch.horizon_steps) {}

  void OnRankRecord(const RankRecordContext& ctx, AlertSink& sink) override {
    const v1::StepRecord& r = ctx.record;
    StepReports* reports = pending_.Get(ctx.attempt, r.step());
    if (reports == nullptr) return;
    RankReport report{.rank = ctx.rank, .grad_norm = r.grad_norm()};
    if (r.has_clip_coef()) report.clip_coef = r.clip_coef();
    ++reports->ranks;
    reports->norm.Add(report.grad_norm, report);
    if (report.clip_coef.has_value()) {
      reports->coef.Add(*report.clip_coef, report);
    }

    const double norm_spread = reports->norm.RelativeSpread();
    const double coef_spread = reports->coef.RelativeSpread();
    const double threshold = ctx.config.rank_mismatch.relative_spread;
    const bool holds = norm_spread > threshold || coef_spread > threshold;
    const double spread = std::max(norm_spread, coef_spread);
    sink.Condition(AlertKind::kRankNormMismatch, r.step(), holds, spread, [&] {
      const Extremes& differ =
          norm_spread > threshold ? reports->norm : reports->coef;
      auto [a, b] = differ.ByRank();
      return AlertText{
          "Ranks disagree on the gradient norm",
          absl::StrFormat("step %d: rank %d reported grad_norm %s, rank %d "
                          "reported %s: spread %.3g%%",
                          r.step(), a.rank, Describe(a), b.rank, Describe(b),
                          100 * spread)};
    });
    if (reports->ranks >= ctx.run.world_size) pending_.Done(r.step());
  }

  void OnRewind(uint64_t step) override { pending_.RewindTo(step); }

 private:
  struct StepReports {
    uint32_t ranks = 0;
    Extremes norm;
    Extremes coef;
  };

  static std::string Describe(const RankReport& report) {
    std::string s = absl::StrFormat("%.3g", report.grad_norm);
    if (report.clip_coef.has_value()) {
      s += absl::StrFormat(" (clip_coef %.3g)", *report.clip_coef);
    }
    return s;
  }

  PendingSteps<StepReports> pending_;
};

// Catches a global norm rebuilt wrongly under sharding: squares not reduced
// across a process group, or replicated parameters counted on every rank.
// Once all world_size ranks sent shard_sq_sum for a step, holds when
// sqrt(sum) differs from the lowest rank's reported grad_norm by more than
// shard_mismatch.relative_error.
class ShardNormMismatch final : public Detector {
 public:
  explicit ShardNormMismatch(const HealthConfig& config)
      : pending_(config.rank_mismatch.horizon_steps) {}

  void OnRankRecord(const RankRecordContext& ctx, AlertSink& sink) override {
    const v1::StepRecord& r = ctx.record;
    if (!r.has_shard_sq_sum()) return;
    Shards* shards = pending_.Get(ctx.attempt, r.step());
    if (shards == nullptr) return;
    ++shards->count;
    shards->sq_sum += r.shard_sq_sum();
    if (!shards->norm_rank.has_value() || ctx.rank < *shards->norm_rank) {
      shards->norm_rank = ctx.rank;
      shards->norm = r.grad_norm();
    }
    if (shards->count < ctx.run.world_size) return;

    const Shards s = *shards;
    pending_.Done(r.step());
    const double total = std::sqrt(s.sq_sum);
    // Overflowed (fp16) or empty steps have nothing to compare.
    if (!std::isfinite(total) || !std::isfinite(s.norm) || !(s.norm > 0)) {
      return;
    }
    const bool holds = std::abs(total - s.norm) / s.norm >
                       ctx.config.shard_mismatch.relative_error;
    sink.Condition(AlertKind::kShardNormMismatch, r.step(), holds,
                   total / s.norm, [&] {
                     return AlertText{
                         "Shard norms do not add up to the reported norm",
                         absl::StrFormat(
                             "step %d: sqrt(sum of shard_sq_sum over %d ranks) "
                             "= %.4g but rank %d reported grad_norm %.4g "
                             "(ratio %.3g)",
                             r.step(), s.count, total, *s.norm_rank, s.norm,
                             total / s.norm)};
                   });
  }

  void OnRewind(uint64_t step) override { pending_.RewindTo(step); }

 private:
  struct Shards {
    uint32_t count = 0;  // ranks that sent shard_sq_sum
    double sq_sum = 0.0;
    std::optional<uint32_t> norm_rank;  // the lowest of them
    double norm = 0.0;                  // its reported grad_norm
  };

  PendingSteps<Shards> pending_;
};

}  // namespace

void AddRankDetectors(const HealthConfig& config, Detectors* out) {
  out->push_back(std::make_unique<RankNormMismatch>(config));
  out->push_back(std::make_unique<ShardNormMismatch>(config));
}

}  // namespace trainwatch
