// FP8 per-tensor scaling detectors (docs/detectors.md Fp8*): Fp8Overflow,
// Fp8Underflow, Fp8ScaleMismatch and Fp8AmaxGrowth read the fp8 reports of
// the lead stream (every N steps); Fp8AmaxDesync compares, step by step, the
// ranks that report one tensor in one amax_group (arrival-order free, like
// the other cross-rank checks).
//
// The recipe they check is per-tensor delayed scaling (Transformer Engine's
// DelayedScaling): fp8 = cast(x * scale), with the scale of step t computed
// after step t-1 from the amax history (the last amax_history_len amaxes):
// scale = fmt_max / amax / 2^margin, amax = max(history) ("max") or the
// latest one ("most_recent").
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "health/detectors/internal.h"
#include "health/signals/select.h"
#include "health/signals/step_digests.h"
#include "health/signals/trend_forecast.h"
#include "trainwatch/v1/fp8_format.h"

namespace trainwatch {

using v1::Fp8FormatMax;

namespace {

// Tensors tracked per run, at most (bounds memory on huge models).
constexpr size_t kMaxTensors = 4096;
// Tensors named in a description, at most.
constexpr size_t kNamed = 4;

// A verdict on reports keeps holding between reports (they come every N
// steps, the alert resolves after resolve_after_steps without one), for up
// to this many report intervals: a run that stops sending fp8 stops being
// judged.
constexpr uint64_t kHoldIntervals = 2;
// Before the second report the interval is unknown: the verdict holds until
// the next report, for at most this many steps.
constexpr uint64_t kHoldUnknownSteps = 100000;

// The steps between a tensor's reports, as first seen (0 until two).
struct Cadence {
  uint64_t last_step = 0;
  uint64_t interval = 0;
  bool any = false;

  void Take(uint64_t step) {
    if (any && step > last_step && interval == 0) interval = step - last_step;
    last_step = step;
    any = true;
  }
};

// The state of tensor `name` in `tensors`, created if needed; nullptr past
// kMaxTensors.
template <typename Map>
typename Map::mapped_type* Tracked(Map& tensors, const std::string& name) {
  auto it = tensors.find(name);
  if (it == tensors.end()) {
    if (tensors.size() >= kMaxTensors) return nullptr;
    it = tensors.emplace(name, typename Map::mapped_type{}).first;
  }
  return &it->second;
}

// Carries a report's verdict (and its text) to the steps up to the next
// report, so that a condition reported every N steps does not resolve
// between reports.
class HeldVerdict {
 public:
  void Set(uint64_t step, bool holds, double value, uint64_t interval,
           const std::function<AlertText()>& text) {
    step_ = step;
    holds_ = holds;
    value_ = value;
    interval_ = interval;
    text_ = holds ? text() : AlertText{};
  }
  // Reports `kind` as holding at `step` if the last report's verdict still
  // covers it.
  void Assert(AlertKind kind, uint64_t step, AlertSink& sink) const {
    const uint64_t hold = interval_ > 0 ? kHoldIntervals * interval_ : kHoldUnknownSteps;
    if (!holds_ || step <= step_ || step - step_ > hold) return;
    sink.Condition(kind, step, true, value_, [this] { return text_; });
  }
  void Clear() { holds_ = false; }
  bool holds() const { return holds_; }

 private:
  uint64_t step_ = 0;
  bool holds_ = false;
  double value_ = 0.0;
  uint64_t interval_ = 0;  // 0: unknown
  AlertText text_;
};

// "name <prefix>value, ..." for the first kNamed of `named`, then "and N more".
std::string Name(const std::vector<std::pair<std::string, double>>& named,
                 const char* prefix) {
  std::string out;
  for (size_t i = 0; i < named.size() && i < kNamed; ++i) {
    if (i > 0) out += ", ";
    out += absl::StrFormat("%s %s%.3g", named[i].first, prefix, named[i].second);
  }
  if (named.size() > kNamed) out += absl::StrFormat(" and %d more", named.size() - kNamed);
  return out;
}

void SortWorstFirst(std::vector<std::pair<std::string, double>>& v) {
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
}

// v1::ScaledAmax, NaN when it says nothing.
double ScaledAmaxOrNan(const v1::Fp8TensorStats& f) {
  return v1::ScaledAmax(f).value_or(std::nan(""));
}

// Fp8Overflow and Fp8Underflow: a tensor's saturated (flushed) share is above
// its threshold on most of its last fp8.reports reports. Without an
// overflow_fraction, a report overflows when amax x scale is above the
// format's max (at least its largest value saturates); without an
// underflow_fraction a report says nothing of underflow.
class Fp8ShareAlert final : public Detector {
 public:
  enum class Share { kOverflow, kUnderflow };

  explicit Fp8ShareAlert(Share share) : share_(share) {}

  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    const v1::StepRecord& r = ctx.record;
    const AlertKind kind = share_ == Share::kOverflow ? AlertKind::kFp8Overflow
                                                      : AlertKind::kFp8Underflow;
    if (r.fp8().empty()) {
      held_.Assert(kind, r.step(), sink);
      return;
    }
    const auto& cfg = ctx.config.fp8;
    const uint32_t n = cfg.reports;
    const uint64_t mask = n >= 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1;
    std::vector<std::pair<std::string, double>> holding;
    uint64_t interval = 0;
    for (const auto& [name, f] : r.fp8()) {
      std::optional<bool> flag;
      double value = std::nan("");
      if (share_ == Share::kOverflow) {
        if (f.has_overflow_fraction()) {
          value = f.overflow_fraction();
          flag = value > cfg.overflow_fraction;
        } else if (const double s = ScaledAmaxOrNan(f); !std::isnan(s)) {
          value = s;
          flag = s > 1.0;
        }
      } else if (f.has_underflow_fraction()) {
        value = f.underflow_fraction();
        flag = value > cfg.underflow_fraction;
      }
      if (!flag.has_value()) continue;
      Tensor* tracked = Tracked(tensors_, name);
      if (tracked == nullptr) continue;
      Tensor& t = *tracked;
      t.cadence.Take(r.step());
      interval = std::max(interval, t.cadence.interval);
      t.bits = ((t.bits << 1) | (*flag ? 1 : 0)) & mask;
      if (2 * static_cast<uint32_t>(std::popcount(t.bits)) > n) {
        holding.emplace_back(name, value);
      }
    }
    SortWorstFirst(holding);
    const bool holds = !holding.empty();
    const double worst = holds ? holding.front().second : 0.0;
    const auto text = [&] {
      const bool over = share_ == Share::kOverflow;
      return AlertText{
          over ? "FP8 values saturate" : "FP8 values flush to zero",
          absl::StrFormat(
              "step %d: %d tensor(s) %s on most of their last %d fp8 reports "
              "(%s > %g%s): %s",
              r.step(), holding.size(), over ? "overflow" : "underflow", n,
              over ? "overflow_fraction" : "underflow_fraction",
              over ? cfg.overflow_fraction : cfg.underflow_fraction,
              over ? ", or amax x scale above the format max" : "",
              Name(holding, ""))};
    };
    held_.Set(r.step(), holds, worst, interval, text);
    sink.Condition(kind, r.step(), holds, worst, text);
  }

  void OnRewind(uint64_t step) override { held_.Clear(); }

 private:
  struct Tensor {
    uint64_t bits = 0;  // the last reports' flags, newest in bit 0
    Cadence cadence;
  };
  Share share_;
  absl::flat_hash_map<std::string, Tensor> tensors_;
  HeldVerdict held_;
};

// Fp8ScaleMismatch: a tensor's scale is off the recipe by more than
// fp8.scale_ratio either way. The server sees the amaxes of the reported
// steps only, so it bounds what the recipe allows:
//  - too large: the scale of step t can be at most target / amax(t-1)
//    (target = fmt_max / 2^margin; amax(t-1) is in the history, "max" or
//    "most_recent"); without the previous step's report, this step's amax
//    stands in for it (the amax moves little between steps);
//  - too small: the scale is at least target / max(history), which the
//    server knows once it has the reports of every step of the history
//    (fp8 sent every step).
// It holds when most of the tensors of one format break an exact bound, or,
// judged by this step's amax (which sits below the history's max, so the
// ratio reads low), more than a quarter of them: a wrong format max moves
// every tensor of that format, one unusual tensor does not.
class Fp8ScaleMismatch final : public Detector {
 public:
  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    const v1::StepRecord& r = ctx.record;
    if (r.fp8().empty()) {
      held_.Assert(AlertKind::kFp8ScaleMismatch, r.step(), sink);
      return;
    }
    const double limit = ctx.config.fp8.scale_ratio;
    // Per format, the ratios of each kind of evidence (Judge()).
    struct Tally {
      std::vector<std::pair<std::string, double>> hi_exact, hi_estimate, lo;
    };
    std::map<v1::Fp8Format, Tally> by_format;
    uint64_t interval = 0;
    for (const auto& [name, f] : r.fp8()) {
      Tensor* tracked = Tracked(tensors_, name);
      if (tracked == nullptr) continue;
      Tensor& t = *tracked;
      const Evidence e = Judge(t, r.step(), f);
      interval = std::max(interval, t.cadence.interval);
      t.Take(r.step(), f);
      Tally& tally = by_format[f.format()];
      if (e.hi.has_value()) {
        (e.hi_exact ? tally.hi_exact : tally.hi_estimate).emplace_back(name, *e.hi);
      }
      if (e.lo.has_value()) tally.lo.emplace_back(name, *e.lo);
    }
    // A format holds when most of its tensors with an exact bound break it
    // by `limit`. With only this step's amax to go by (it sits below the
    // history's max, so the ratio reads low), when more than a quarter of
    // them do and most cast past the format's max (ratio > 1). Once firing,
    // the median past 1 + (limit - 1) x resolve_ratio keeps it (hysteresis;
    // for an estimate, most casts past the format's max).
    const bool firing = held_.holds();
    const double relaxed = 1 + (limit - 1) * ctx.config.change.resolve_ratio;
    const auto off = [&](const std::vector<std::pair<std::string, double>>& v,
                         bool high, bool estimate) {
      std::vector<std::pair<std::string, double>> out;
      if (v.empty()) return out;
      std::vector<double> x;
      for (const auto& p : v) {
        x.push_back(p.second);
        if (high ? p.second > limit : p.second < 1.0 / limit) out.push_back(p);
      }
      const double median = MedianOf(x.data(), x.size());
      // An estimate reads low: most casts past the format's max keep it.
      const double keep = estimate ? 1.0 : relaxed;
      const bool over = high ? median > keep : median < 1.0 / keep;
      bool holds;
      if (firing) {
        holds = over;
      } else if (estimate) {
        holds = 4 * out.size() > v.size() && median > 1.0;
      } else {
        holds = 2 * out.size() > v.size();
      }
      if (!holds) out.clear();
      if (holds && out.empty()) out = v;  // held by the median: name them all
      return out;
    };
    std::vector<std::pair<std::string, double>> offending;
    size_t judged = 0;
    v1::Fp8Format format = v1::FP8_FORMAT_UNSPECIFIED;
    for (auto& [fmt, tally] : by_format) {
      for (auto [group, high, estimate] :
           {std::tuple{&tally.hi_exact, true, false}, std::tuple{&tally.lo, false, false},
            std::tuple{&tally.hi_estimate, true, true}}) {
        std::vector<std::pair<std::string, double>> o = off(*group, high, estimate);
        if (o.size() > offending.size()) {
          offending = std::move(o);
          judged = group->size();
          format = fmt;
        }
      }
    }
    const bool holds = !offending.empty();
    double peak = 0.0;
    for (const auto& [name, ratio] : offending) peak = std::max({peak, ratio, 1.0 / ratio});
    SortWorstFirst(offending);
    const auto text = [&] {
      const double median = MedianOfPairs(offending);
      return AlertText{
          .summary = "FP8 scales do not match the recipe",
          .description = absl::StrFormat(
              "step %d: %d of %d %s tensors have a scale %.3gx (median) what "
              "fmt_max %g / amax / 2^margin allows: %s. %s",
              r.step(), offending.size(), judged, v1::Fp8Format_Name(format),
              median, Fp8FormatMax(format), Name(offending, "x"),
              median > 1 ? (format == v1::E4M3_FNUZ && median > 1.3
                                ? "448/240 = 1.87: the E4M3 max used for E4M3_FNUZ?"
                                : "The casts saturate.")
                         : (format == v1::E4M3 && median < 0.7
                                ? "240/448 = 0.54: the E4M3_FNUZ max used for E4M3?"
                                : "The casts waste range (underflow).")),
          .onset_step = r.step()};
    };
    held_.Set(r.step(), holds, peak, interval, text);
    sink.Condition(AlertKind::kFp8ScaleMismatch, r.step(), holds, peak, text);
  }

  void OnRewind(uint64_t step) override {
    held_.Clear();
    for (auto& [name, t] : tensors_) t.Restart();
  }

 private:
  // The median of the ratios (for the description).
  static double MedianOfPairs(const std::vector<std::pair<std::string, double>>& v) {
    std::vector<double> x;
    x.reserve(v.size());
    for (const auto& p : v) x.push_back(p.second);
    return x.empty() ? 0.0 : MedianOf(x.data(), x.size());
  }

  // The amaxes a tensor reported over its recent steps: a max-queue of
  // (step, amax) within amax_history_len steps (oldest first, decreasing
  // amax), bounded; `since` is the first step of the run of consecutive
  // steps that ends at the last report.
  struct Tensor {
    static constexpr size_t kMaxQueue = 256;
    std::deque<std::pair<uint64_t, double>> queue;
    bool truncated = false;  // the queue lost entries: its max is a lower bound
    bool any = false;
    uint64_t first_step = 0;
    uint64_t since = 0;
    uint64_t last_step = 0;
    double last_amax = 0.0;
    Cadence cadence;

    void Take(uint64_t step, const v1::Fp8TensorStats& f) {
      cadence.Take(step);
      if (!any) {
        first_step = since = step;
      } else if (step != last_step + 1) {
        since = step;
      }
      any = true;
      last_step = step;
      last_amax = f.amax();
      const uint64_t len = f.amax_history_len();
      while (!queue.empty() && len > 0 && queue.front().first + len < step + 1) {
        queue.pop_front();
      }
      if (!(std::isfinite(f.amax()) && f.amax() >= 0)) return;
      while (!queue.empty() && queue.back().second <= f.amax()) queue.pop_back();
      queue.emplace_back(step, f.amax());
      if (queue.size() > kMaxQueue) {
        queue.pop_front();
        truncated = true;
      }
    }
    void Restart() {
      queue.clear();
      truncated = false;
      any = false;
    }
  };

  // What one report says of its scale against the recipe.
  struct Evidence {
    // scale x amax / target, where amax is the previous step's (exact: the
    // recipe keeps it <= 1) or, without its report, this step's (an
    // estimate); target = fmt_max / 2^margin.
    std::optional<double> hi;
    bool hi_exact = false;
    // scale x max(history) / target (the recipe keeps it >= 1), once every
    // step of the history was reported.
    std::optional<double> lo;
  };

  static Evidence Judge(const Tensor& t, uint64_t step, const v1::Fp8TensorStats& f) {
    Evidence e;
    const double fmt_max = Fp8FormatMax(f.format());
    const double scale = f.scale();
    if (!(fmt_max > 0) || !std::isfinite(scale) || !(scale > 0) ||
        !std::isfinite(f.margin())) {
      return e;
    }
    const double target = fmt_max / std::exp2(f.margin());
    const bool have_prev = t.any && t.last_step + 1 == step &&
                           std::isfinite(t.last_amax) && t.last_amax > 0;
    if (have_prev) {
      e.hi = scale * t.last_amax / target;
      e.hi_exact = true;
    } else if (!t.any && scale == 1.0) {
      return e;  // the recipe's initial scale, before any amax
    } else if (std::isfinite(f.amax()) && f.amax() > 0) {
      e.hi = scale * f.amax() / target;
    }
    const uint64_t len = f.amax_history_len();
    const bool from_start = t.any && t.since == t.first_step && t.first_step <= 1;
    const bool whole = have_prev && !t.truncated && len > 0 &&
                       (from_start || t.since + len <= step);
    if (whole && !t.queue.empty() && t.queue.front().second > 0) {
      e.lo = scale * t.queue.front().second / target;
    }
    return e;
  }

  absl::flat_hash_map<std::string, Tensor> tensors_;
  HeldVerdict held_;
};

// Fp8AmaxGrowth: the robust trend of a tensor's log amax over its reports
// (Theil-Sen, like AttentionLogitGrowth) forecasts it to reach
// fp8.growth_factor x its baseline (the median of its first fp8.reports
// reports) within fp8.horizon_steps, once the trend is at least halfway
// there (sqrt(growth_factor), 10x). A point is the median of ~16 steps of
// reports (one report a point when they come every 16 steps or more), and a
// trend needs 16 points.
class Fp8AmaxGrowth final : public Detector {
 public:
  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    const v1::StepRecord& r = ctx.record;
    if (r.fp8().empty()) {
      held_.Assert(AlertKind::kFp8AmaxGrowth, r.step(), sink);
      return;
    }
    const auto& cfg = ctx.config.fp8;
    struct Forecast {
      std::string name;
      double factor_now = 0.0;   // amax trend level / baseline
      double per_1000 = 0.0;     // growth factor per 1000 steps
      uint64_t reach_step = 0;
      double baseline = 0.0;
    };
    std::vector<Forecast> growing;
    uint64_t interval = 0;
    for (const auto& [name, f] : r.fp8()) {
      if (!(std::isfinite(f.amax()) && f.amax() > 0)) continue;
      Tensor* tracked = Tracked(tensors_, name);
      if (tracked == nullptr) continue;
      Tensor& t = *tracked;
      t.cadence.Take(r.step());
      interval = std::max(interval, t.cadence.interval);
      if (t.first.size() < cfg.reports) {
        t.first.push_back(f.amax());
        if (t.first.size() == cfg.reports) t.baseline = MedianOf(t.first.data(), t.first.size());
      }
      if (!t.trend.has_value()) {
        if (t.cadence.interval == 0) continue;  // the stride needs the cadence
        const uint64_t stride = std::clamp<uint64_t>((16 + t.cadence.interval - 1) / t.cadence.interval, 1, 16);
        t.trend.emplace(TrendForecaster::Options{
            .stride = static_cast<uint32_t>(stride), .points = 64, .min_points = 16});
      }
      t.trend->Add(r.step(), std::log(f.amax()));
      if (!(t.baseline > 0)) continue;
      const auto& trend = t.trend->trend();
      if (!trend.has_value() || !(trend->slope > 0)) continue;
      const double target = std::log(cfg.growth_factor * t.baseline);
      const std::optional<uint64_t> reach = t.trend->StepReaching(target);
      const bool past = trend->level >= target;
      if (!past && (!reach.has_value() || *reach > r.step() + cfg.horizon_steps)) continue;
      // Halfway there (in log space) first: a tensor that grew 2-3x early
      // in training (weights leaving their init) and levels off is not an
      // outlier outgrowing its bulk, though its early trend points far.
      if (trend->level < std::log(std::sqrt(cfg.growth_factor) * t.baseline)) continue;
      growing.push_back(Forecast{
          .name = name,
          .factor_now = std::exp(trend->level) / t.baseline,
          .per_1000 = std::exp(1000 * trend->slope),
          .reach_step = past ? r.step() : *reach,
          .baseline = t.baseline});
    }
    std::sort(growing.begin(), growing.end(), [](const Forecast& a, const Forecast& b) {
      return a.reach_step != b.reach_step ? a.reach_step < b.reach_step : a.name < b.name;
    });
    const bool holds = !growing.empty();
    const double peak = holds ? growing.front().factor_now : 0.0;
    const auto text = [&] {
      const Forecast& g = growing.front();
      std::string others;
      if (growing.size() > 1) others = absl::StrFormat(" (and %d more tensors)", growing.size() - 1);
      return AlertText{
          .summary = "FP8 amax growing",
          .description = absl::StrFormat(
              "step %d: %s amax grows x%.3g per 1000 steps (robust trend of log "
              "amax), now %.3gx its baseline %.4g; forecast to reach %gx the "
              "baseline at step %d (in %d steps)%s: its bulk will underflow",
              r.step(), g.name, g.per_1000, g.factor_now, g.baseline,
              cfg.growth_factor, g.reach_step, g.reach_step - r.step(), others)};
    };
    held_.Set(r.step(), holds, peak, interval, text);
    sink.Condition(AlertKind::kFp8AmaxGrowth, r.step(), holds, peak, text);
  }

  void OnRewind(uint64_t step) override {
    held_.Clear();
    for (auto& [name, t] : tensors_) {
      if (t.trend.has_value()) t.trend->RewindTo(step);
    }
  }

 private:
  struct Tensor {
    std::vector<double> first;  // the first reports' amaxes
    double baseline = 0.0;      // their median, once complete
    std::optional<TrendForecaster> trend;
    Cadence cadence;
  };
  absl::flat_hash_map<std::string, Tensor> tensors_;
  HeldVerdict held_;
};

// Fp8AmaxDesync: the ranks that report one tensor with one (non-empty)
// amax_group at one step must report the same amax and scale; holds when
// the relative spread of either exceeds fp8.amax_spread. Judged per step
// once every rank's record of it is in.
class Fp8AmaxDesync final : public Detector {
 public:
  explicit Fp8AmaxDesync(const HealthConfig& config)
      : digests_(config.rank_mismatch.horizon_steps) {}

  void OnRankRecord(const RankRecordContext& ctx, AlertSink& sink) override {
    const v1::StepRecord& r = ctx.record;
    if (r.fp8().empty()) return;
    Digest* d = digests_.Get(ctx.attempt, r.step());
    if (d == nullptr) return;
    ++d->ranks;
    for (const auto& [name, f] : r.fp8()) {
      if (f.amax_group().empty()) continue;
      std::string key = name;
      key.push_back('\0');
      key += f.amax_group();
      auto it = d->groups.find(key);
      if (it == d->groups.end()) {
        if (d->groups.size() >= kMaxTensors) continue;
        it = d->groups.emplace(std::move(key), Range{}).first;
      }
      it->second.Take(ctx.rank, f.amax(), f.scale());
    }
  }

  void OnRanksThrough(const RanksThroughContext& ctx, AlertSink& sink) override {
    const double threshold = ctx.config.fp8.amax_spread;
    bool judged = false;
    digests_.JudgeThrough(ctx.through, [&](uint64_t step, const Digest& d) {
      judged = true;
      const std::string* worst_key = nullptr;
      const Range* worst = nullptr;
      double spread = 0.0;
      size_t desynced = 0;
      for (const auto& [key, range] : d.groups) {
        const double s = range.Spread();
        if (s > threshold) ++desynced;
        if (s > spread || (s == spread && s > 0 && worst_key != nullptr && key < *worst_key)) {
          spread = s;
          worst = &range;
          worst_key = &key;
        }
      }
      const bool holds = spread > threshold;
      if (judged_any_ && step > last_judged_) interval_ = step - last_judged_;
      judged_any_ = true;
      last_judged_ = step;
      const auto text = [&] {
        const size_t cut = worst_key->find('\0');
        const std::string tensor = worst_key->substr(0, cut);
        const std::string group = worst_key->substr(cut + 1);
        const auto [a, b] = worst->Pair();
        return AlertText{
            .summary = "FP8 amax not synchronised across ranks",
            .description = absl::StrFormat(
                "step %d: %s in amax_group %s: rank %d reported amax %.6g "
                "scale %.6g, rank %d amax %.6g scale %.6g (spread %.3g%%); "
                "%d tensor-group(s) disagree",
                step, tensor, group, a.rank, a.amax, a.scale, b.rank, b.amax,
                b.scale, 100 * spread, desynced),
            .rank = b.rank};
      };
      held_.Set(step, holds, spread, interval_, text);
      sink.Condition(AlertKind::kFp8AmaxDesync, step, holds, spread, text);
    });
    if (!judged) held_.Assert(AlertKind::kFp8AmaxDesync, ctx.through, sink);
  }

  void OnRewind(uint64_t step) override { held_.Clear(); }

 private:
  struct Report {
    uint32_t rank = 0;
    double amax = 0.0;
    double scale = 0.0;
  };
  using Extremes = RankExtremes<Report>;
  // One tensor in one amax_group at one step: the two reports that differ
  // most (by amax or by scale), the lower rank first.
  struct Range {
    Extremes amax, scale;

    void Take(uint32_t rank, double amax_v, double scale_v) {
      const Report r{rank, amax_v, scale_v};
      amax.Take(r, amax_v);
      scale.Take(r, scale_v);
    }
    double Spread() const { return std::max(amax.Spread(), scale.Spread()); }
    // The pair that disagrees most, lower rank first (for the text).
    std::pair<Report, Report> Pair() const {
      const Extremes& by = amax.Spread() >= scale.Spread() ? amax : scale;
      return by.lo.rank <= by.hi.rank ? std::make_pair(by.lo, by.hi)
                                      : std::make_pair(by.hi, by.lo);
    }
  };
  struct Digest {
    uint32_t ranks = 0;
    absl::flat_hash_map<std::string, Range> groups;
  };

  StepDigests<Digest> digests_;
  HeldVerdict held_;
  bool judged_any_ = false;
  uint64_t last_judged_ = 0;
  uint64_t interval_ = 0;
};

}  // namespace

void AddFp8Detectors(const HealthConfig& config, Detectors* out) {
  // Causes before their consequences, so a step's transitions name them.
  out->push_back(std::make_unique<Fp8ScaleMismatch>());
  out->push_back(std::make_unique<Fp8AmaxGrowth>());
  out->push_back(std::make_unique<Fp8ShareAlert>(Fp8ShareAlert::Share::kOverflow));
  out->push_back(std::make_unique<Fp8ShareAlert>(Fp8ShareAlert::Share::kUnderflow));
}

std::unique_ptr<Detector> MakeFp8AmaxDesync(const HealthConfig& config) {
  return std::make_unique<Fp8AmaxDesync>(config);
}

}  // namespace trainwatch
