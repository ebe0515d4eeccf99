// Per-layer Adam detectors (docs/detectors.md): AdamStaleSecondMoment,
// LayerUpdateStall. They read the layer_stats the clients send every N steps
// on the lead stream; records without layer_stats leave them unchanged.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "health/detectors/internal.h"
#include "health/signals/layer_kind.h"
#include "health/signals/select.h"

namespace trainwatch {
namespace {

// Layers named in a description, at most.
constexpr size_t kLayersNamed = 5;

// Catches a layer whose Adam second moment is out of date: its gradient is
// far above what v has seen (RMS of g/sqrt(v) >= adam.g_over_sqrt_v, ~1 in
// steady state), and a loss spike tends to follow within a few steps. A layer
// counts on a post-warmup report once it also jumped: its value is at least
// adam.jump_ratio x its median over its previous post-warmup reports (at
// least adam.min_reports of them). In warmup v is still filling up from 0,
// and for a while after it Adam is still adapting to the new LR (values of
// 5 and more that fall back by themselves); a layer whose g/sqrt(v) is
// always high has not gone stale either. Embeddings are left out: a rare
// token's row, whose v decayed for hundreds of steps, meets a gradient
// on every healthy run (the lab: 25-4,100 on the token embedding, nothing
// after). With reports on consecutive steps (layer_stats every step) the
// layer must be stale on kStaleInARow in a row: a hard batch refreshes v
// within a step or two (v takes (1 - beta2) g^2 of it), while the
// out-of-date v of an instability stays behind a gradient that stays large.
class AdamStaleSecondMoment final : public Detector {
 public:
  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    const v1::StepRecord& r = ctx.record;
    if (r.layer_stats().empty() || !ctx.post_warmup) return;
    const auto& cfg = ctx.config.adam;
    std::vector<std::pair<std::string, double>> stale;
    for (const auto& [layer, stats] : r.layer_stats()) {
      if (IsTokenRowLayer(kinds_.Of(layer, stats))) continue;
      const double value = stats.g_over_sqrt_v_rms();
      // NaN: no evidence either way. +Inf: v is zero under a non-zero
      // gradient, out of date whatever the layer's history; it stays out of
      // the history, whose median it would break.
      if (std::isnan(value) || value == -INFINITY) continue;
      auto it = history_.find(layer);
      if (it == history_.end()) {
        if (history_.size() >= kMaxLayers) continue;
        it = history_.emplace(layer, History{}).first;
      }
      History& h = it->second;
      const bool consecutive = h.any && r.step() == h.last_step + 1;
      const bool candidate =
          std::isinf(value) || (value >= cfg.g_over_sqrt_v && h.size >= cfg.min_reports &&
                                value >= cfg.jump_ratio * h.Median());
      h.candidates_in_a_row = candidate ? (consecutive ? h.candidates_in_a_row + 1 : 1) : 0;
      // +Inf (v zero under a gradient) is out of date at once.
      if (std::isinf(value) ||
          (candidate && (!consecutive || h.candidates_in_a_row >= kStaleInARow))) {
        stale.emplace_back(layer, value);
      }
      h.last_step = r.step();
      h.any = true;
      if (!std::isinf(value)) h.Push(value);
    }
    std::sort(stale.begin(), stale.end(), [](const auto& a, const auto& b) {
      return a.second != b.second ? a.second > b.second : a.first < b.first;
    });
    const double largest = stale.empty() ? 0.0 : stale.front().second;
    sink.Condition(
        AlertKind::kAdamStaleSecondMoment, r.step(), !stale.empty(), largest,
        [&] {
          return AlertText{
              "Adam second moment out of date",
              absl::StrFormat("step %d: g/sqrt(v) RMS >= %g and >= %gx the "
                              "layer's recent median in %d layer(s): %s",
                              r.step(), cfg.g_over_sqrt_v, cfg.jump_ratio,
                              stale.size(), NameLayers(stale, kLayersNamed))};
        });
  }

  // Reports of a layer before the restart still describe its typical value.
  void OnRewind(uint64_t step) override {}

 private:
  static constexpr size_t kMaxLayers = 4096;
  // With reports a step apart, stale on this many in a row: a hard batch
  // leaves g/sqrt(v) high for a step or two (healthy lab runs of held-out
  // families: 5-8 in up to 11 layers for two steps), an out-of-date v
  // stays behind a gradient that stays large.
  static constexpr uint32_t kStaleInARow = 3;

  // A layer's last post-warmup values, for its median.
  struct History {
    static constexpr size_t kSize = 8;
    std::array<float, kSize> values{};
    size_t size = 0;
    size_t next = 0;
    uint64_t last_step = 0;  // the last report's step
    bool any = false;
    uint32_t candidates_in_a_row = 0;  // reports a step apart that were stale

    void Push(double v) {
      values[next] = static_cast<float>(v);
      next = (next + 1) % kSize;
      if (size < kSize) ++size;
    }
    double Median() const {
      return MedianOf(values.data(), size);
    }
  };
  std::map<std::string, History> history_;
  LayerKinds kinds_;
};

// Catches updates that vanish, by two rules under one alert.
// The eps rule: layers whose gradients are so small that Adam's eps
// dominates sqrt(v). Holds while some layer's grad RMS is in (0,
// adam.eps_multiple x adam_eps] on adam.stall_reports reports of it in a
// row (a zero gradient is a frozen or unused layer, not an eps problem).
// The collapse rule (any optimizer, whatever the cause): the median layer's
// update/weight RMS fell adam.collapse_ratio x below where it started after
// warmup and stayed there for adam.collapse_fraction of the run so far. The
// lab's held-out runs with an LR decayed 10x every 50 steps reach 1e-8 of
// their start; a healthy run's update ratio falls 10x as its LR decays to a
// floor and its weights grow.
class LayerUpdateStall final : public Detector {
 public:
  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    const v1::StepRecord& r = ctx.record;
    if (r.layer_stats().empty()) return;
    const auto& cfg = ctx.config.adam;
    if (ctx.post_warmup && r.has_lr() && std::isfinite(r.lr())) {
      peak_lr_ = std::max(peak_lr_, r.lr());
    }
    std::vector<double> updates;  // the judged layers' update_rms_ratio
    for (const auto& [layer, stats] : r.layer_stats()) {
      // An embedding's RMS is over every row, most of which a step's tokens
      // leave at zero: small on every healthy run. A norm's bias under
      // qk-layernorm has a gradient of ~0 by construction (the softmax does
      // not see a shift shared by every key: 4e-11 on healthy lab runs).
      const v1::LayerKind kind = kinds_.Of(layer, stats);
      if (IsTokenRowLayer(kind) || kind == v1::NORM) continue;
      const double update = stats.update_rms_ratio();
      if (std::isfinite(update) && update > 0) updates.push_back(update);
      if (ctx.run.adam_eps.has_value()) TrackEps(layer, stats, ctx);
    }
    std::vector<std::pair<std::string, double>> stalled;
    for (const auto& [layer, stall] : stalls_) {
      if (stall.reports >= cfg.stall_reports) {
        stalled.emplace_back(layer, stall.last_rms);
      }
    }
    const bool collapsed = ctx.post_warmup && !updates.empty() &&
                           Collapsed(r.step(), MedianOf(updates.data(), updates.size()), ctx);
    sink.Condition(
        AlertKind::kLayerUpdateStall, r.step(), !stalled.empty() || collapsed,
        !stalled.empty() ? static_cast<double>(stalled.size())
                         : collapsed ? collapse_.start / collapse_.level : 0.0,
        [&] {
          if (!stalled.empty()) {
            return AlertText{
                "Layer updates vanish under Adam eps",
                absl::StrFormat("step %d: %d layer(s) with grad RMS <= %g x "
                                "adam_eps (%g) on %d reports in a row: %s",
                                r.step(), stalled.size(), cfg.eps_multiple,
                                *ctx.run.adam_eps, cfg.stall_reports,
                                NameLayers(stalled, kLayersNamed))};
          }
          return CollapseText(r, ctx);
        });
  }

  // Reports are not kept, so the runs of them restart after a rewind.
  void OnRewind(uint64_t step) override {
    stalls_.clear();
    collapse_ = Collapse{};
    peak_lr_ = 0.0;
  }

 private:
  // Layers tracked at once, at most (bounds memory on huge models).
  static constexpr size_t kMaxLayers = 4096;
  // g/(sqrt(v)+eps) at least this share of min(1, grad_rms / eps): eps,
  // not an out-of-date v, sets the layer's update.
  static constexpr double kEpsShare = 0.5;
  // The collapse rule's start (its first post-warmup reports), its level
  // (its last reports) and the least time it must hold.
  static constexpr size_t kStartReports = 50;
  static constexpr size_t kLevelReports = 10;
  static constexpr uint64_t kMinCollapseSteps = 20;

  void TrackEps(const std::string& layer, const v1::LayerStats& stats,
                const StepContext& ctx) {
    const double limit = ctx.config.adam.eps_multiple * *ctx.run.adam_eps;
    const double eps = *ctx.run.adam_eps;
    const double rms = stats.grad_rms();
    // eps, not v, must set the update: then g / (sqrt(v) + eps) is about
    // min(1, g / eps). A layer whose gradient collapsed while v still
    // holds its old values has g/(sqrt(v)+eps) below that (the lab: 3e-4 -
    // 4e-3 where grad_rms / eps is 1.4 - 11; 0.26 of it at 1e-14): v sets
    // that update, and a smaller eps is not the fix (the collapse rule's).
    const double ratio = stats.g_over_sqrt_v_rms();
    const bool eps_dominates = !std::isfinite(ratio) || !(ratio > 0) ||
                               ratio >= kEpsShare * std::min(1.0, rms / eps);
    if (!(rms > 0 && rms <= limit) || !eps_dominates) {
      stalls_.erase(layer);
      return;
    }
    auto it = stalls_.find(layer);
    if (it == stalls_.end()) {
      if (stalls_.size() >= kMaxLayers) return;
      it = stalls_.emplace(layer, Stall{}).first;
    }
    ++it->second.reports;
    it->second.last_rms = rms;
  }

  // Adds this report's median update ratio; true while the collapse holds.
  bool Collapsed(uint64_t step, double update, const StepContext& ctx) {
    Collapse& c = collapse_;
    if (!c.first_step.has_value()) c.first_step = step;
    if (c.start_values.size() < kStartReports) {
      c.start_values.push_back(update);
      if (c.start_values.size() == kStartReports) {
        c.start = MedianOf(c.start_values.data(), c.start_values.size());
      }
      return false;
    }
    c.recent[c.next] = update;
    c.next = (c.next + 1) % kLevelReports;
    c.size = std::min(c.size + 1, kLevelReports);
    c.level = MedianOf(c.recent.data(), c.size);
    if (c.level * ctx.config.adam.collapse_ratio > c.start) {
      c.since.reset();
      return false;
    }
    if (!c.since.has_value()) c.since = step;
    const double needed = std::max<double>(
        kMinCollapseSteps, ctx.config.adam.collapse_fraction * (step - *c.first_step));
    return static_cast<double>(step - *c.since) >= needed;
  }

  AlertText CollapseText(const v1::StepRecord& r, const StepContext& ctx) const {
    const Collapse& c = collapse_;
    std::string why;
    // The LR explains the collapse when it fell at least half as far (in
    // log terms) as the updates did.
    const double fall = c.start / c.level;
    if (r.has_lr() && std::isfinite(r.lr()) && peak_lr_ > 0 &&
        r.lr() * std::sqrt(fall) <= peak_lr_) {
      why = absl::StrFormat(
          "; the LR is %.3g, %.3gx below its post-warmup peak %.3g: the "
          "schedule took it to ~0 (if the run is not at its end, check the "
          "schedule's length, its decay and min_lr)",
          r.lr(), peak_lr_ / r.lr(), peak_lr_);
    } else {
      why = "; the LR has not fallen as far: the gradients or the optimizer's "
            "state set it (a loss that stopped moving, frozen layers, Adam eps "
            "or weight decay too large)";
    }
    return AlertText{
        absl::StrFormat("Updates vanished: %.3gx below their start", fall),
        absl::StrFormat(
            "step %d: the median layer's update/weight RMS is %.3g (its last "
            "%d reports), %.3gx below its median %.3g over the first %d "
            "post-warmup reports, since step %d%s",
            r.step(), c.level, c.size, fall, c.start, kStartReports,
            *c.since, why),
        *c.since};
  }

  struct Stall {
    uint32_t reports = 0;  // in a row at or below the limit
    double last_rms = 0.0;
  };
  struct Collapse {
    std::optional<uint64_t> first_step;  // the first post-warmup report
    std::vector<double> start_values;    // until kStartReports
    double start = 0.0;
    std::array<double, kLevelReports> recent{};
    size_t next = 0, size = 0;
    double level = 0.0;
    std::optional<uint64_t> since;  // the first report under the line
  };
  std::map<std::string, Stall> stalls_;  // only layers currently at the limit
  Collapse collapse_;
  double peak_lr_ = 0.0;
  LayerKinds kinds_;
};

}  // namespace

void AddLayerDetectors(const HealthConfig& config, Detectors* out) {
  out->push_back(std::make_unique<AdamStaleSecondMoment>());
  out->push_back(std::make_unique<LayerUpdateStall>());
}

}  // namespace trainwatch
