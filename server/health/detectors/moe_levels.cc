#include "health/detectors/moe_levels.h"

#include <algorithm>
#include <cmath>

#include "health/signals/moe_load.h"

namespace trainwatch::moe {
namespace {

// Layers tracked at once, at most (the wire allows no more).
constexpr size_t kMaxLayers = 1024;

// A starved stretch may hold a few reports with an assignment or two (an
// expert the router has all but left still catches a stray token: the MoE
// lab's 16-expert top-1 runs fed their dead experts 1-2 tokens on a report
// in five or so): up to this share of its reports.
constexpr double kStarvedFedShare = 0.1;

void TrackEmpty(const v1::MoeLayerStats& layer, uint32_t empty, uint64_t step, LayerState& s) {
  const auto& counts = layer.tokens_per_expert();
  if (s.empty_since.size() != static_cast<size_t>(counts.size())) {
    s.empty_since.assign(counts.size(), 0);
    s.empty_reports.assign(counts.size(), 0);
    s.fed_reports.assign(counts.size(), 0);
  }
  // No expert empty now or starving before: nothing to count.
  if (empty == 0 && s.starving == 0) return;
  uint32_t starving = 0;
  for (int e = 0; e < counts.size(); ++e) {
    if (counts[e] == 0) {
      if (s.empty_reports[e]++ == 0) {
        s.empty_since[e] = step;
        s.fed_reports[e] = 0;
      }
    } else if (s.empty_reports[e] > 0) {
      ++s.empty_reports[e];
      if (++s.fed_reports[e] > kStarvedFedShare * s.empty_reports[e]) {
        s.empty_reports[e] = 0;
      }
    }
    starving += s.empty_reports[e] > 0 ? 1 : 0;
  }
  s.starving = starving;
}

void TrackBias(const v1::MoeLayerStats& layer, LayerState& s, uint32_t n, double flip_share) {
  const auto& bias = layer.expert_bias();
  if (bias.empty()) return;
  double sum = 0, sq = 0;
  for (float b : bias) sum += b;
  const double mean = sum / bias.size();
  for (float b : bias) sq += (b - mean) * (b - mean);
  s.bias_mean = mean;
  const double sd = std::sqrt(sq / bias.size());
  s.bias_mean_over_sd.Add(std::abs(mean) / std::max(sd, 1e-12), n);
  // Flips: the change's sign against the last change's, on consecutive
  // reports of the same experts.
  if (s.bias.size() == static_cast<size_t>(bias.size())) {
    std::vector<float> delta(bias.size());
    size_t flips = 0;
    for (int e = 0; e < bias.size(); ++e) {
      delta[e] = bias[e] - s.bias[e];
      if (s.bias_delta.size() == delta.size() && delta[e] * s.bias_delta[e] < 0) ++flips;
    }
    const bool flipped = s.bias_delta.size() == delta.size() &&
                         flips >= flip_share * static_cast<double>(bias.size());
    if (flipped) {
      if (s.flip_reports++ == 0) s.flip_start_imbalance = s.last_max_over_mean;
    } else {
      s.flip_reports = 0;
    }
    s.bias_delta = std::move(delta);
  }
  s.bias.assign(bias.begin(), bias.end());
}

// The load per expert-parallel block's hottest over the mean block's.
void TrackBlocks(const v1::MoeLayerStats& layer, uint32_t ep_size, uint32_t n, LayerState& s) {
  const std::vector<uint64_t> blocks = BlockLoads(layer, ep_size);
  s.blocks_now = !blocks.empty();
  if (blocks.empty()) return;
  const auto max = std::max_element(blocks.begin(), blocks.end());
  double sum = 0;
  for (uint64_t b : blocks) sum += static_cast<double>(b);
  if (sum > 0) {
    s.blocks.Add(*max / (sum / blocks.size()), n);
    s.hottest_block = static_cast<uint32_t>(max - blocks.begin());
  }
}

}  // namespace

// The sorted copy moves a value out and one in (n is 10 by default): a
// select over every level of every layer on each report was a sixth of the
// detectors' time on a 48-layer report. The median is the same value
// (MedianOf's: index n / 2 in order).
void Level::Add(double v, uint32_t n, uint64_t step) {
  if (!std::isfinite(v)) return;
  if (values_.size() < n) {
    values_.push_back(v);
    steps_.push_back(step);
    sorted_.insert(std::upper_bound(sorted_.begin(), sorted_.end(), v), v);
  } else {
    const double old = values_[next_];
    values_[next_] = v;
    steps_[next_] = step;
    if (++next_ >= n) next_ = 0;  // not %: a division on every report's every level
    // The new value takes the old one's place in order, the values between
    // them moving by one: one pass, where an erase and an insert were two.
    auto at = std::lower_bound(sorted_.begin(), sorted_.end(), old);
    if (v > old) {
      for (auto next = at + 1; next != sorted_.end() && *next < v; ++at, ++next) *at = *next;
    } else {
      for (; at != sorted_.begin() && *(at - 1) > v; --at) *at = *(at - 1);
    }
    *at = v;
  }
  if (values_.size() >= n) median_ = sorted_[sorted_.size() / 2];
}

void Level::Clear() {
  values_.clear();
  steps_.clear();
  sorted_.clear();
  next_ = 0;
}

bool Persistent::Update(bool holds, uint64_t step, uint64_t onset, uint32_t steps,
                        uint32_t reports) {
  if (!holds) {
    reports_ = 0;
    return false;
  }
  if (reports_++ == 0) {
    since_ = step;
    onset_ = onset;
  }
  return step - since_ >= steps && reports_ >= reports;
}

ReportLayers MoeLevels::Update(const v1::MoeStats& report, uint64_t step,
                               const HealthConfig& config, uint32_t top_k, uint32_t ep_size) {
  const uint32_t n = config.moe.level_reports;
  ReportLayers out;
  MoeDrops drops;
  for (const v1::MoeLayerStats& layer : report.layers()) {
    auto it = layers_.find(layer.layer());
    if (it == layers_.end()) {
      if (layers_.size() >= kMaxLayers) continue;
      it = layers_.emplace(layer.layer(), LayerState{}).first;
    }
    LayerState& s = it->second;
    s.counts_now = s.blocks_now = false;
    if (std::optional<MoeLayerLoad> load = LoadOf(layer)) {
      drops.Add(layer, *load);
      s.reports_counts = s.counts_now = true;
      s.experts = layer.tokens_per_expert_size();
      // n90, exact up to the collapse rule's highest line (its hysteresis
      // line while firing): above it, only "above" matters.
      const double experts = s.experts;
      const double limit = CollapseLimit(top_k, config.moe.collapse_top_k_multiple, s.experts);
      const auto at_most = static_cast<uint32_t>(
          std::floor(experts - config.change.resolve_ratio * (experts - limit)));
      s.n90.Add(ExpertsFor90(layer, *load, at_most), n, step);
      s.max_over_mean.Add(load->max_over_mean, n, step);
      s.last_max_over_mean = load->max_over_mean;
      TrackEmpty(layer, load->dead, step, s);
      TrackBlocks(layer, ep_size, n, s);
    }
    if (layer.has_aux_loss()) s.aux.Add(layer.aux_loss(), n);
    if (layer.has_z_loss()) {
      s.z.Add(layer.z_loss(), n, step);
      s.reports_z = true;
    }
    if (layer.has_router_logit_max()) s.logit.Add(layer.router_logit_max(), n, step);
    TrackBias(layer, s, n, config.moe.bias_flip_share);
    out.emplace_back(&it->first, &s);
  }
  if (const std::optional<double> share = drops.fraction()) dropped_.Add(*share, n);
  return out;
}

void MoeLevels::Clear() {
  layers_.clear();
  dropped_.Clear();
}

double Worst(const Named& layers, bool largest) {
  double w = largest ? 0.0 : INFINITY;
  for (const auto& [name, v] : layers) w = largest ? std::max(w, v) : std::min(w, v);
  return w;
}

bool Held::Firing(AlertKind kind, uint64_t step, const HealthConfig& config) const {
  const auto it = last_held_.find(kind);
  return it != last_held_.end() && step < it->second + config.resolve_after_steps;
}

double Held::Line(AlertKind kind, uint64_t step, double neutral, double fire,
                  const HealthConfig& config) const {
  return Firing(kind, step, config) ? neutral + config.change.resolve_ratio * (fire - neutral)
                                    : fire;
}

void Held::Condition(AlertSink& sink, AlertKind kind, uint64_t step, bool holds, double value,
                     const std::function<AlertText()>& text) {
  if (holds) last_held_[kind] = step;
  sink.Condition(kind, step, holds, value, text);
}

}  // namespace trainwatch::moe
