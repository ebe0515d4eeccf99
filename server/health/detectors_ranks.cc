// Cross-rank detectors (DESIGN.md §4): RankNormMismatch, ShardNormMismatch.
// They read every rank's records (OnRankRecord), in arrival order, and compare
// ranks step by step whatever the order the ranks arrive in.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "health/detectors_internal.h"
#include "health/step_digests.h"

namespace trainwatch {
namespace {

// Relative spread of two values: |a - b| / max(|a|, |b|) (0 when equal).
double Spread(double a, double b) {
  constexpr double kTiny = 1e-30;
  return std::abs(a - b) / std::max({std::abs(a), std::abs(b), kTiny});
}

// Catches per-shard clipping: each rank clips with its own local norm, so
// ranks report different grad_norm or clip_coef for one step. Every rank's
// report of a step is compared with the first report of that step (kept in a
// 12-byte digest until all world_size ranks reported it, however far apart
// their streams arrive: StepDigests); holds at the step once the relative
// spread exceeds rank_mismatch.relative_spread.
class RankNormMismatch final : public Detector {
 public:
  explicit RankNormMismatch(const HealthConfig& config)
      : digests_(config.rank_mismatch.horizon_steps) {}

  void OnRankRecord(const RankRecordContext& ctx, AlertSink& sink) override {
    const v1::StepRecord& r = ctx.record;
    Digest* d = digests_.Get(ctx.attempt, r.step());
    if (d == nullptr) return;
    const float norm = static_cast<float>(r.grad_norm());
    const float coef = r.has_clip_coef() ? static_cast<float>(r.clip_coef())
                                         : std::nanf("");
    if (d->ranks++ == 0) {
      *d = Digest{.norm = norm, .coef = coef, .ranks = 1,
                  .first_rank = static_cast<uint16_t>(ctx.rank)};
      digests_.Trim(ctx.run.world_size);  // a single rank: nothing to keep
      return;
    }
    // Non-finite values (an fp16 overflow) have nothing to compare.
    const double norm_spread = std::isfinite(norm) && std::isfinite(d->norm)
                                   ? Spread(norm, d->norm)
                                   : 0.0;
    const double coef_spread = std::isfinite(coef) && std::isfinite(d->coef)
                                   ? Spread(coef, d->coef)
                                   : 0.0;
    const Digest first = *d;
    digests_.Trim(ctx.run.world_size);
    const double threshold = ctx.config.rank_mismatch.relative_spread;
    const bool holds = norm_spread > threshold || coef_spread > threshold;
    const double spread = std::max(norm_spread, coef_spread);
    sink.Condition(AlertKind::kRankNormMismatch, r.step(), holds, spread, [&] {
      return AlertText{
          "Ranks disagree on the gradient norm",
          absl::StrFormat("step %d: rank %d reported grad_norm %s, rank %d "
                          "reported %s: spread %.3g%%",
                          r.step(), first.first_rank,
                          Describe(first.norm, first.coef), ctx.rank,
                          Describe(norm, coef), 100 * spread)};
    });
  }

  void OnRewind(uint64_t step) override { digests_.RewindTo(step); }

 private:
  struct Digest {
    float norm = 0.0f;
    float coef = 0.0f;  // NaN: not reported
    uint16_t ranks = 0;
    uint16_t first_rank = 0;
  };

  static std::string Describe(float norm, float coef) {
    std::string s = absl::StrFormat("%.3g", norm);
    if (!std::isnan(coef)) s += absl::StrFormat(" (clip_coef %.3g)", coef);
    return s;
  }

  StepDigests<Digest> digests_;
};

// Catches a global norm rebuilt wrongly under sharding: squares not reduced
// across a process group, or replicated parameters counted on every rank.
// Once all world_size ranks sent shard_sq_sum for a step (however far apart
// they arrive: StepDigests), holds when sqrt(sum) differs from the lowest
// rank's reported grad_norm by more than shard_mismatch.relative_error.
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
      shards->norm_rank = static_cast<uint16_t>(ctx.rank);
      shards->norm = r.grad_norm();
    }
    if (++shards->ranks < ctx.run.world_size) return;

    const Shards s = *shards;
    digests_.Trim(ctx.run.world_size);
    const double total = std::sqrt(s.sq_sum);
    const double norm = s.norm;
    // Overflowed (fp16) or empty steps have nothing to compare.
    if (!std::isfinite(total) || !std::isfinite(norm) || !(norm > 0)) return;
    const bool holds = std::abs(total - norm) / norm >
                       ctx.config.shard_mismatch.relative_error;
    sink.Condition(AlertKind::kShardNormMismatch, r.step(), holds,
                   total / norm, [&] {
                     return AlertText{
                         "Shard norms do not add up to the reported norm",
                         absl::StrFormat(
                             "step %d: sqrt(sum of shard_sq_sum over %d ranks) "
                             "= %.4g but rank %d reported grad_norm %.4g "
                             "(ratio %.3g)",
                             r.step(), s.ranks, total, s.norm_rank, norm,
                             total / norm)};
                   });
  }

  void OnRewind(uint64_t step) override { digests_.RewindTo(step); }

 private:
  struct Shards {
    double sq_sum = 0.0;
    double norm = 0.0;        // the lowest rank's reported grad_norm
    uint16_t ranks = 0;       // ranks that sent shard_sq_sum
    uint16_t norm_rank = 0;   // the lowest of them
  };

  StepDigests<Shards> digests_;
};

}  // namespace

void AddRankDetectors(const HealthConfig& config, Detectors* out) {
  out->push_back(std::make_unique<RankNormMismatch>(config));
  out->push_back(std::make_unique<ShardNormMismatch>(config));
}

}  // namespace trainwatch
