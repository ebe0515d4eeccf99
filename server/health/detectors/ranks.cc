// Cross-rank detectors (docs/detectors.md): RankNormMismatch, ShardNormMismatch.
// They keep a small digest of what the ranks reported for each step
// (OnRankRecord, in arrival order) and judge a step once every rank's record
// of it is in (OnRanksThrough, in step order), so a step is judged once, with
// all its ranks, whatever the order the ranks' streams arrive in.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "health/detectors/internal.h"
#include "health/signals/step_digests.h"

namespace trainwatch {
namespace {

// Catches per-shard clipping: each rank clips with its own local norm, so
// ranks report different grad_norm or clip_coef for one step. A step's
// digest keeps the least and largest finite norm and clip_coef over its
// ranks (and which ranks reported them); the step holds once the relative
// spread of either exceeds rank_mismatch.relative_spread.
class RankNormMismatch final : public Detector {
 public:
  explicit RankNormMismatch(const HealthConfig& config)
      : digests_(config.rank_mismatch.horizon_steps) {}

  void OnRankRecord(const RankRecordContext& ctx, AlertSink& sink) override {
    const v1::StepRecord& r = ctx.record;
    Digest* d = digests_.Get(ctx.attempt, r.step());
    if (d == nullptr) return;
    ++d->ranks;
    const Report report{.norm = static_cast<float>(r.grad_norm()),
                        .coef = r.has_clip_coef()
                                    ? static_cast<float>(r.clip_coef())
                                    : std::nanf(""),
                        .rank = ctx.rank};
    d->norm.Take(report, report.norm);
    d->coef.Take(report, report.coef);
  }

  void OnRanksThrough(const RanksThroughContext& ctx, AlertSink& sink) override {
    const double threshold = ctx.config.rank_mismatch.relative_spread;
    digests_.JudgeThrough(ctx.through, [&](uint64_t step, const Digest& d) {
      const double norm_spread = d.norm.Spread(), coef_spread = d.coef.Spread();
      const bool holds = norm_spread > threshold || coef_spread > threshold;
      const double spread = std::max(norm_spread, coef_spread);
      const Range& by = norm_spread >= coef_spread ? d.norm : d.coef;
      // The two reports that disagree most, the lower rank first.
      const bool lo_first = by.lo.rank <= by.hi.rank;
      const Report& a = lo_first ? by.lo : by.hi;
      const Report& b = lo_first ? by.hi : by.lo;
      sink.Condition(AlertKind::kRankNormMismatch, step, holds, spread, [&] {
        return AlertText{
            "Ranks disagree on the gradient norm",
            absl::StrFormat("step %d: rank %d reported grad_norm %s, rank %d "
                            "reported %s: spread %.3g%% over %d ranks",
                            step, a.rank, Describe(a), b.rank, Describe(b),
                            100 * spread, d.ranks)};
      });
    });
  }

 private:
  struct Report {
    float norm = 0.0f;
    float coef = 0.0f;  // NaN: not reported
    uint32_t rank = 0;
  };
  // The reports with the least and the largest finite value of one field.
  using Range = RankExtremes<Report, float>;
  struct Digest {
    Range norm, coef;
    uint32_t ranks = 0;
  };

  static std::string Describe(const Report& r) {
    std::string s = absl::StrFormat("%.3g", r.norm);
    if (!std::isnan(r.coef)) s += absl::StrFormat(" (clip_coef %.3g)", r.coef);
    return s;
  }

  StepDigests<Digest> digests_;
};

// Catches a global norm rebuilt wrongly under sharding: squares not reduced
// across a process group, or replicated parameters counted on every rank.
// Once all world_size ranks sent shard_sq_sum for a step, holds when
// sqrt(sum) differs from the lowest rank's reported grad_norm by more than
// shard_mismatch.relative_error. A step some rank did not send it for says
// nothing.
class ShardNormMismatch final : public Detector {
 public:
  explicit ShardNormMismatch(const HealthConfig& config)
      : digests_(config.rank_mismatch.horizon_steps) {}

  void OnRankRecord(const RankRecordContext& ctx, AlertSink& sink) override {
    const v1::StepRecord& r = ctx.record;
    if (!r.has_shard_sq_sum()) return;
    Shards* shards = digests_.Get(ctx.attempt, r.step());
    if (shards == nullptr) return;
    shards->sq_sum += r.shard_sq_sum();
    if (shards->ranks == 0 || ctx.rank < shards->norm_rank) {
      shards->norm_rank = ctx.rank;
      shards->norm = r.grad_norm();
    }
    ++shards->ranks;
  }

  void OnRanksThrough(const RanksThroughContext& ctx, AlertSink& sink) override {
    digests_.JudgeThrough(ctx.through, [&](uint64_t step, const Shards& s) {
      if (s.ranks < ctx.run.world_size) return;
      const double total = std::sqrt(s.sq_sum);
      const double norm = s.norm;
      // Overflowed (fp16) or empty steps have nothing to compare.
      if (!std::isfinite(total) || !std::isfinite(norm) || !(norm > 0)) return;
      const bool holds = std::abs(total - norm) / norm >
                         ctx.config.shard_mismatch.relative_error;
      sink.Condition(AlertKind::kShardNormMismatch, step, holds, total / norm, [&] {
        return AlertText{
            "Shard norms do not add up to the reported norm",
            absl::StrFormat("step %d: sqrt(sum of shard_sq_sum over %d ranks) "
                            "= %.4g but rank %d reported grad_norm %.4g "
                            "(ratio %.3g)",
                            step, s.ranks, total, s.norm_rank, norm, total / norm)};
      });
    });
  }

 private:
  struct Shards {
    // Summed in arrival order: the rounding differs by ~1e-16 relative
    // between orders, far below relative_error.
    double sq_sum = 0.0;
    double norm = 0.0;       // the lowest rank's reported grad_norm
    uint32_t ranks = 0;      // ranks that sent shard_sq_sum
    uint32_t norm_rank = 0;  // the lowest of them
  };

  StepDigests<Shards> digests_;
};

}  // namespace

void AddRankDetectors(const HealthConfig& config, Detectors* out) {
  out->push_back(std::make_unique<RankNormMismatch>(config));
  out->push_back(std::make_unique<ShardNormMismatch>(config));
}

}  // namespace trainwatch
