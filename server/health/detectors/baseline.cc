// BaselineDeviation: the run left its reference runs' band (docs/baselines.md).
// A restarted attempt or a new run of a known recipe whose loss sits above its
// references' at the same tokens is the earliest sign that something changed
// (data, learning rate, a kernel), long before the loss is bad on its own.
// Per metric (the loss; in log space the grad norm and max attention logit;
// log Z), each 20-step bin's standardised residual against the band
// (signals/baseline_band.h) feeds one-sided CUSUMs, with the false-alarm rate
// of change.arl0: worse is a warning, critical once the run stays beyond
// twice the band for 5 bins in a row; better than the band is info.
// A run whose learning rate is not its references' (BandBin::lr_changed) is
// another recipe, not one more seed: the question left is whether the change
// made it worse, so its loss is also judged by a CUSUM for a 2-sd shift
// (k = 1: a seed sits within a sd of its recipe) at a hundredth of
// change.arl0, and the alert says the LR's ratio.
// Compared by step, a loss that sits below the band's centre by that same
// 2-sd shift while the grad norm is below its references' too, or a grad
// norm out of its band while the loss is within its own, is info: the run
// is not its references' recipe step for step (another batch size, most
// likely). The changed recipe's CUSUM reads the residual against the
// references' spread as estimated (BandBin::z_as_estimated), not the
// band's widened one: that widening keeps seeds quiet at the first bins,
// and a run of another LR is not a seed.
#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "health/detectors/internal.h"
#include "health/signals/baseline_band.h"
#include "health/signals/change_detection.h"

namespace trainwatch {

namespace {

// Bins in a row beyond twice the band that make a deviation critical.
constexpr uint32_t kCriticalBins = 5;
// Bins in a row out of the band before the loss has left it (40 steps).
constexpr uint32_t kLevelBins = 2;
// Bins over which the grad norm's residual is averaged for the ahead rule:
// one bin's is a coin toss for a seed and for a batch alike.
constexpr size_t kRecentBins = 3;
// The changed recipe's CUSUM: its reference value (in residual sds: half
// the 2-sd shift it looks for) and its false-alarm rate as a fraction of
// change.arl0's.
// A run whose LR differs is known not to be a seed of its references, so
// the prior that its loss moved is far higher than a seed's: read off the
// dev recipes' LR 10x (healthy-zipf's 1-3 sd for 240 steps), docs/baselines.md.
constexpr double kChangedK = 1.0;
constexpr double kChangedArlFraction = 0.01;

// 1,234,567
std::string Thousands(uint64_t v) {
  std::string digits = absl::StrCat(v);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

// 1.2B, 450M, 12k, 980.
std::string Count(double v) {
  if (v >= 1e9) return absl::StrFormat("%.3gB", v / 1e9);
  if (v >= 1e6) return absl::StrFormat("%.3gM", v / 1e6);
  if (v >= 1e4) return absl::StrFormat("%.3gk", v / 1e3);
  return absl::StrFormat("%.0f", v);
}

// The run's value against the references': "+1.51" for log Z (a log
// already), "1.15x" for the rest.
std::string Versus(BaselineMetric metric, double value, double ref) {
  return metric == BaselineMetric::kLogZ ? absl::StrFormat("%+.3g", value - ref)
                                         : absl::StrFormat("%.3gx", value / ref);
}

// "; lr 10x the baseline's" when the bin's LR is not the references'.
std::string LrRatio(const BandBin& b) {
  if (!b.lr_changed()) return "";
  return absl::StrFormat("; lr %.3gx the baseline's (another recipe, not a seed of it)",
                         b.lr_ratio);
}

// "loss 3.41 vs baseline 2.97, 1.15x, band +-0.05, at 1.2B tokens (step
// 8,420); left the band at step 8,400".
std::string Describe(BaselineMetric metric, BaselineAxis axis, const BandBin& b,
                     uint64_t onset_step, const char* onset = "left the band") {
  const double value = BaselineUnits(metric, b.value);
  const double ref = BaselineUnits(metric, b.ref_median);
  const double half = (BaselineUnits(metric, b.hi) - BaselineUnits(metric, b.lo)) / 2;
  const std::string versus = Versus(metric, value, ref);
  const std::string at =
      axis == BaselineAxis::kTokens
          ? absl::StrCat(Count(b.x), " tokens (step ", Thousands(b.last_step), ")")
          : absl::StrCat("step ", Thousands(b.last_step));
  return absl::StrFormat("%s %.4g vs baseline %.4g, %s, band +-%.3g, at %s; %s at step %s",
                         BaselineMetricName(metric), value, ref, versus, half, at, onset,
                         Thousands(onset_step));
}

class BaselineDeviation final : public Detector {
 public:
  explicit BaselineDeviation(const HealthConfig& config) : config_(config) {}

  void OnBaselines(std::shared_ptr<const BaselineReferences> refs,
                   BaselineStatus* status) override {
    refs_ = std::move(refs);
    status_ = status;
    watches_.clear();
  }

  // The last bin judged lies past the rewind: /metrics shows none until the
  // resumed run closes one.
  void OnRewind(uint64_t step) override {
    watches_.clear();
    if (status_ != nullptr) *status_ = BaselineStatus{};
  }

  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    if (refs_ == nullptr || refs_->runs.empty() || !ctx.post_warmup) return;
    if (watches_.empty()) Start(ctx.record, ctx.run.warmup_steps);
    bool judged = false;
    for (Watch& w : watches_) {
      if (w.same_step != nullptr) w.same_step->Add(ctx.record);
      w.closed = w.Add(ctx.record).has_value();
      judged |= w.closed;
    }
    if (!judged) return;
    // The grad norm's watch, for the ahead rule below: a run ahead of its
    // recipe step for step by another batch has less gradient noise too
    // (~ 1/sqrt(B)), where a seed whose loss sits low by chance (two
    // references can both be the recipe's higher seeds) does not. A bin
    // counts toward "ahead" only while the grad norm's mean residual over
    // its last kRecentBins bins is below its references' (or the run
    // records none); another bin resets it.
    const Watch* grad_norm = nullptr;
    for (const Watch& w : watches_) {
      if (w.band.metric() == BaselineMetric::kGradNorm && w.last.has_value()) grad_norm = &w;
    }
    for (Watch& w : watches_) {
      if (!w.closed) continue;
      const BandBin& bin = *w.last;
      // A run of another LR is not a seed of its references: the band's
      // widening for their spread's few degrees of freedom, there to keep
      // seeds quiet at the first bins, is not its judge's.
      w.changed.Add(bin.first_step, bin.z_as_estimated, bin.lr_changed());
      w.ahead.Add(bin.first_step, bin.z,
                  axis_ == BaselineAxis::kStep && (grad_norm == nullptr || grad_norm->RecentZ() < 0));
      if (status_ != nullptr && w.band.metric() == BaselineMetric::kLoss) Publish(bin);
    }
    Judge(ctx.record.step(), sink);
  }

 private:
  // The loss's residual on one side (`sign` +1 worse, -1 better) judged for
  // a 2-sd shift at a hundredth of change.arl0, on the bins where the run is
  // known not to be a seed of its references: a run of another LR (worse),
  // or any run compared step for step (better: ahead of its recipe at the
  // same step). Back to 0 on a bin where it does not apply.
  class ShiftCusum {
   public:
    ShiftCusum(double arl0_records, double sign)
        : sign_(sign),
          cusum_(GaussianCusumThreshold(
              kChangedK, std::max(2.0, arl0_records * kChangedArlFraction /
                                           BandOptions{}.bin_steps))) {}
    // A bin's standardised residual `z`, from its first step.
    void Add(uint64_t first_step, double z, bool applies) {
      if (!applies) {
        cusum_.Reset();
        beyond_ = 0;
        alarmed_ = false;
        return;
      }
      z *= sign_;
      const bool over = cusum_.Add(first_step, z - kChangedK);
      beyond_ = z > kChangedK ? beyond_ + 1 : 0;
      // Past its threshold with the last kLevelBins bins beyond the band's
      // centre by k on its side (a lone hard batch's bin is LossSpike's);
      // then it holds until the statistic is back at 0, as the band's
      // CUSUM does.
      if (over && beyond_ >= kLevelBins) alarmed_ = true;
      if (cusum_.statistic() == 0) alarmed_ = false;
    }
    bool alarmed() const { return alarmed_; }
    uint64_t onset_step() const { return cusum_.onset_step(); }

   private:
    double sign_;
    Cusum cusum_;
    uint32_t beyond_ = 0;
    bool alarmed_ = false;
  };
  // One metric's band on one axis, its CUSUM, and the last bin's verdict
  // with the bins in a row out of the band on each side.
  struct Track {
    Track(BaselineMetric metric, BaselineAxis axis,
          std::shared_ptr<const BaselineReferences> refs, uint64_t warmup_steps,
          const HealthConfig& config)
        : band(metric, axis, std::move(refs), warmup_steps),
          cusum(config.change.arl0, BandOptions{}.bin_steps) {}
    // The bin `record` closes, judged; none when it closes none.
    std::optional<BandBin> Add(const v1::StepRecord& record) {
      std::optional<BandBin> bin = band.Add(record);
      if (!bin.has_value()) return bin;
      last = *bin;
      recent[bins++ % kRecentBins] = bin->z;
      verdict = cusum.Add(*bin);
      above = bin->value > bin->hi ? above + 1 : 0;
      below = bin->value < bin->lo ? below + 1 : 0;
      return bin;
    }
    // A level that left, on that side: the CUSUM over its line and the last
    // kLevelBins bins out of the band there. One bin far out is a spike or
    // a hard batch's (LossSpike's to name), not the run leaving its recipe.
    bool Worse() const { return verdict.worse && above >= kLevelBins; }
    bool Better() const { return verdict.better && below >= kLevelBins; }
    // The mean z of the last kRecentBins bins (of those judged).
    double RecentZ() const {
      const size_t n = std::min<size_t>(bins, kRecentBins);
      double sum = 0;
      for (size_t i = 0; i < n; ++i) sum += recent[i];
      return n == 0 ? 0 : sum / static_cast<double>(n);
    }
    BaselineBand band;
    ResidualCusum cusum;
    std::optional<BandBin> last;
    std::array<double, kRecentBins> recent{};  // the last kRecentBins bins' z, a ring
    size_t bins = 0;                            // judged so far
    ResidualCusum::Verdict verdict;
    uint32_t above = 0, below = 0;
  };

  struct Watch : Track {
    Watch(BaselineMetric metric, BaselineAxis axis, std::shared_ptr<const BaselineReferences> refs,
          uint64_t warmup_steps, const HealthConfig& config)
        : Track(metric, axis, std::move(refs), warmup_steps, config),
          changed(config.change.arl0, 1.0),
          ahead(config.change.arl0, -1.0) {}
    ShiftCusum changed;  // worse, while the LR is not the references'
    // Better, on the step axis, while the grad norm is below its
    // references' too (OnStep).
    ShiftCusum ahead;
    bool closed = false;  // the last record closed a bin
    // Another batch size than the references', compared by tokens: at the
    // same tokens the run has taken fewer (or more) steps than they had,
    // and early on a larger batch learns less per token (its loss above
    // theirs until the critical batch size has grown past it); at the same
    // step it has seen more data than they had, and is no worse than them.
    // Between the two is its recipe: it is worse only where it is worse at
    // the same step too, so the loss's band on the step axis is kept
    // beside.
    std::unique_ptr<Track> same_step;
  };

  // The axis is chosen on the run's first post-warmup record.
  void Start(const v1::StepRecord& first, uint64_t warmup_steps) {
    axis_ = ChooseAxis(first, *refs_);
    batch_ratio_ = axis_ == BaselineAxis::kTokens ? BatchRatio(first) : 1.0;
    for (BaselineMetric m : kBaselineMetrics) {
      Watch& w = watches_.emplace_back(m, axis_, refs_, warmup_steps, config_);
      if (m == BaselineMetric::kLoss && AnotherBatch()) {
        w.same_step = std::make_unique<Track>(m, BaselineAxis::kStep, refs_, warmup_steps, config_);
      }
    }
  }

  // The run's tokens a step over its references' (the median's), each
  // from its first post-warmup record; 1 when unknown.
  double BatchRatio(const v1::StepRecord& first) const {
    std::vector<double> refs;
    for (const ReferenceRun& r : refs_->runs) {
      if (r.points.empty() || !r.points.front().tokens.has_value()) continue;
      refs.push_back(static_cast<double>(*r.points.front().tokens) /
                     static_cast<double>(r.points.front().step + 1));
    }
    if (refs.empty() || !first.has_tokens()) return 1.0;
    std::sort(refs.begin(), refs.end());
    const double ref = refs[refs.size() / 2];
    const double run = static_cast<double>(first.tokens()) / static_cast<double>(first.step() + 1);
    return ref > 0 && run > 0 ? run / ref : 1.0;
  }
  // Beyond the LR's own tolerance.
  bool AnotherBatch() const { return RatioChanged(batch_ratio_); }

  // The loss decides: it is the recipe's outcome, where another seed or
  // batch size of the same recipe lands in the band. The grad norm moves
  // with the batch (its noise ~ 1/sqrt(B)) and across a restart, log Z and
  // the attention logit with the seed: alone they page nothing (compare
  // --metric shows them; by step the grad norm is info, below); when the
  // loss left too, the alert names those out of their band as well.
  void Judge(uint64_t step, AlertSink& sink) {
    // A level that left (Track::Worse, Better). A run of another LR whose
    // loss moved up is worse too (changed), and a
    // run compared by step whose loss sits below the band's centre is
    // ahead of its recipe at the same step (ahead: info).
    Watch* judged = nullptr;  // the loss's watch, or the grad norm's (kGradNorm)
    Reason reason = Reason::kBand;
    for (Watch& w : watches_) {
      if (w.band.metric() != BaselineMetric::kLoss || !w.last.has_value()) continue;
      const bool band_worse = w.Worse() && (w.same_step == nullptr || w.same_step->Worse());
      const bool changed_worse = !band_worse && w.changed.alarmed();
      // A run with another batch, better than its band at the same tokens,
      // is its batch's doing (a larger batch at the same LR reaches a lower
      // loss where the smaller one's gradient noise set its floor), not a
      // deviation of the recipe: compare and the report show it; nothing
      // is raised. Worse is still judged (above).
      const bool band_better = w.Better() && !AnotherBatch();
      const bool ahead = !band_worse && !changed_worse && !band_better && w.ahead.alarmed();
      if (band_worse || changed_worse || band_better || ahead) {
        if (changed_worse) {
          w.verdict.worse = true;
          w.verdict.onset_step = w.changed.onset_step();
        } else if (!band_worse) {
          // The better side decides, whatever the upward CUSUM still holds
          // of bins above the band before (it decays over a few bins).
          w.verdict.worse = false;
          w.verdict.better = true;
          w.verdict.onset_step = band_better ? w.verdict.better_onset_step : w.ahead.onset_step();
          if (ahead) reason = Reason::kAhead;
        }
        judged = &w;
      }
    }
    // On the step axis, a grad norm out of its band on either side while
    // the loss is within its own says the run is not its references'
    // recipe step for step (another batch size: its gradient noise moves
    // as 1/sqrt(B)): info, never a page. On the token axis another batch
    // size is compared where it is the same recipe, and its grad norm
    // differs as it must.
    if (judged == nullptr && axis_ == BaselineAxis::kStep) {
      for (Watch& w : watches_) {
        if (w.band.metric() != BaselineMetric::kGradNorm || !w.last.has_value()) continue;
        if (w.Worse() || w.Better()) {
          judged = &w;
          reason = Reason::kGradNorm;
        }
      }
    }
    if (judged == nullptr) return;
    const v1::Severity wanted = !judged->verdict.worse || reason == Reason::kGradNorm
                                    ? v1::SEVERITY_INFO
                                : judged->verdict.beyond_twice >= kCriticalBins
                                    ? v1::SEVERITY_CRITICAL
                                    : v1::SEVERITY_WARNING;
    const auto text = [&] { return Text(*judged, wanted, reason); };
    // The episode's own severity, not the last verdict's: an episode holds
    // for resolve_after_steps after its last verdict, and a worse verdict
    // within them raises it (warning to critical). A run better than its
    // band that turns worse (an LR too high learns fast, then falls behind)
    // is another episode: the info one resolves, and the page starts now.
    const std::optional<v1::Severity> before =
        sink.FiringSeverity(AlertKind::kBaselineDeviation);
    const v1::Severity was = before.value_or(v1::SEVERITY_UNSPECIFIED);
    bool firing = before.has_value();
    if (firing && was == v1::SEVERITY_INFO && wanted != v1::SEVERITY_INFO) {
      sink.Resolve(AlertKind::kBaselineDeviation, step);
      firing = false;
    }
    sink.Condition(AlertKind::kBaselineDeviation, step, true, std::abs(judged->last->z), text);
    if (firing && Rank(wanted) > Rank(was)) {
      sink.Amend(AlertKind::kBaselineDeviation, text(), wanted);
    }
  }

  // The loss's last bin, as ratios to the references' median.
  void Publish(const BandBin& b) {
    status_->judged = true;
    status_->step = b.last_step;
    status_->ratio = std::exp(b.value - b.ref_median);
    status_->lower = std::exp(b.lo - b.ref_median);
    status_->upper = std::exp(b.hi - b.ref_median);
  }

  static int Rank(v1::Severity s) {
    return s == v1::SEVERITY_CRITICAL ? 3 : s == v1::SEVERITY_WARNING ? 2 : s == v1::SEVERITY_INFO;
  }

  // Why a run is judged: its loss out of the band (or, at another LR, above
  // its centre: the band's reason too), its loss below the band's centre
  // step for step (kAhead), or its grad norm out of its band while the
  // loss is within its own (kGradNorm). The last two only on the step axis.
  enum class Reason { kBand, kAhead, kGradNorm };

  AlertText Text(const Watch& w, v1::Severity severity, Reason reason) const {
    const BaselineMetric metric = w.band.metric();
    const bool better = !w.verdict.worse;
    // What either step-axis reason tells the user to do.
    constexpr char kByTokens[] =
        "give StepRecord.tokens to compare by tokens; recorded, not paged";
    AlertText t;
    t.summary = absl::StrCat("Run ", better ? "is better than" : "left", " its baseline's band (",
                             BaselineMetricName(metric), ")");
    std::string why;
    switch (reason) {
      case Reason::kGradNorm:
        why = absl::StrCat(
            "; the loss is within its band: at the same step the run is not its "
            "baseline's recipe (another batch size?); ",
            kByTokens);
        break;
      case Reason::kAhead:
        why = absl::StrCat(
            "; within the band, below its centre by over a band sd bin after bin: at the "
            "same step the run is ahead of its baseline's recipe (another batch size?); ",
            kByTokens);
        break;
      case Reason::kBand:
        if (better) why = "; better than the band: recorded, not paged";
        break;
    }
    t.description = absl::StrCat(
        Describe(metric, axis_, *w.last, w.verdict.onset_step,
                 reason == Reason::kAhead ? "below the band's centre" : "left the band"),
        LrRatio(*w.last), "; baseline ",
        DescribeRefs(*refs_), " (", refs_->source, "), by ", BaselineAxisName(axis_),
        severity == v1::SEVERITY_CRITICAL ? "; beyond twice the band for 5 bins in a row" : "",
        why, AnotherBatch() && !better && metric == BaselineMetric::kLoss
                 ? absl::StrFormat("; %.3gx the baseline's tokens a step, and worse at the same "
                                   "step too",
                                   batch_ratio_)
                 : "",
        AlsoOut(w));
    t.onset_step = w.verdict.onset_step;
    t.severity = severity == v1::SEVERITY_WARNING ? v1::SEVERITY_UNSPECIFIED : severity;
    return t;
  }

  // "; also out of their band: grad_norm 1.61x, log_z +1.51" (the other
  // metrics whose CUSUM holds on the same side as `w`'s).
  std::string AlsoOut(const Watch& w) const {
    std::string out;
    for (const Watch& o : watches_) {
      if (&o == &w || !o.last.has_value() ||
          !(w.verdict.worse ? o.verdict.worse : o.verdict.better)) {
        continue;
      }
      const BaselineMetric metric = o.band.metric();
      absl::StrAppend(&out, out.empty() ? "; also out of their band: " : ", ",
                      BaselineMetricName(metric), " ",
                      Versus(metric, BaselineUnits(metric, o.last->value),
                             BaselineUnits(metric, o.last->ref_median)));
    }
    return out;
  }

  const HealthConfig& config_;
  std::shared_ptr<const BaselineReferences> refs_;
  BaselineStatus* status_ = nullptr;  // the run health's
  BaselineAxis axis_ = BaselineAxis::kStep;
  double batch_ratio_ = 1.0;  // the run's tokens a step over its references'
  std::vector<Watch> watches_;
};

}  // namespace

std::unique_ptr<Detector> MakeBaselineDeviation(const HealthConfig& config) {
  return std::make_unique<BaselineDeviation>(config);
}

}  // namespace trainwatch
