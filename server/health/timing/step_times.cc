#include "health/timing/step_times.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "health/signals/select.h"

namespace trainwatch {

void RankStepTimes::SetHost(uint32_t rank, std::string_view host) {
  if (rank >= ranks_.size()) ranks_.resize(size_t{rank} + 1);
  if (host.empty()) {
    ranks_[rank].host = 0;
    return;
  }
  auto [it, added] = host_index_.try_emplace(
      std::string(host), static_cast<uint32_t>(hosts_.size()));
  if (added) hosts_.emplace_back(host);
  ranks_[rank].host = it->second;
}

void RankStepTimes::Add(uint32_t rank, double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds)) return;
  if (rank >= ranks_.size()) ranks_.resize(size_t{rank} + 1);
  Rank& r = ranks_[rank];
  const float x = static_cast<float>(std::log(seconds));
  const float clip = static_cast<float>(std::log(config_.clip));
  if (r.records == 0) {
    r.level = x;
    ++leveled_;
  } else {
    if (median_.has_value() && r.records >= config_.warmup_records) {
      // Judged against the median before this record moves the rank's level.
      const float d = std::min(x - *median_, clip);
      const float limit = static_cast<float>(2 * config_.threshold);
      r.cusum = std::clamp(
          r.cusum + d - static_cast<float>(std::log(config_.slack)), 0.0f, limit);
      if (r.cusum >= config_.threshold &&
          (!worst_.has_value() || r.cusum > ranks_[*worst_].cusum)) {
        worst_ = rank;
      }
    }
    r.level += static_cast<float>(config_.ema_alpha) *
               std::clamp(x - r.level, -clip, clip);
  }
  if (r.records < std::numeric_limits<uint32_t>::max()) ++r.records;
  if (++since_recompute_ >= std::max<uint32_t>(leveled_, 1)) Recompute();
}

void RankStepTimes::Recompute() {
  since_recompute_ = 0;
  scratch_.clear();
  float max_level = -std::numeric_limits<float>::infinity();
  std::optional<uint32_t> worst;
  for (uint32_t i = 0; i < ranks_.size(); ++i) {
    const Rank& r = ranks_[i];
    if (r.records == 0) continue;
    scratch_.push_back(r.level);
    max_level = std::max(max_level, r.level);
    if (r.cusum >= config_.threshold &&
        (!worst.has_value() || r.cusum > ranks_[*worst].cusum)) {
      worst = i;
    }
  }
  worst_ = worst;
  if (scratch_.size() < config_.min_ranks) {
    median_.reset();
    return;
  }
  median_ = MedianOf(scratch_.data(), scratch_.size());
  max_level_ = max_level;
}

double RankStepTimes::median_seconds() const {
  return median_.has_value() ? std::exp(static_cast<double>(*median_)) : 0.0;
}

double RankStepTimes::max_seconds() const {
  return median_.has_value() ? std::exp(static_cast<double>(max_level_)) : 0.0;
}

double RankStepTimes::lost_fraction() const {
  if (!median_.has_value()) return 0.0;
  return 1.0 - std::exp(static_cast<double>(*median_ - max_level_));
}

std::optional<uint32_t> RankStepTimes::Suspect() const {
  if (!median_.has_value() || !worst_.has_value()) return std::nullopt;
  if (ranks_[*worst_].cusum < config_.threshold) return std::nullopt;
  return worst_;
}

double RankStepTimes::Ratio(uint32_t rank) const {
  if (!median_.has_value() || rank >= ranks_.size() ||
      ranks_[rank].records == 0) {
    return 1.0;
  }
  return std::exp(static_cast<double>(ranks_[rank].level - *median_));
}

uint32_t RankStepTimes::RanksAtLeast(double ratio) const {
  if (!median_.has_value()) return 0;
  const float bound = *median_ + static_cast<float>(std::log(ratio));
  uint32_t n = 0;
  for (const Rank& r : ranks_) n += r.records > 0 && r.level >= bound;
  return n;
}

const std::string& RankStepTimes::HostOf(uint32_t rank) const {
  return rank < ranks_.size() ? hosts_[ranks_[rank].host] : hosts_[0];
}

std::vector<RankStepTimes::RankDetail> RankStepTimes::Slowest(size_t n) const {
  std::vector<uint32_t> order;
  for (uint32_t i = 0; i < ranks_.size(); ++i) {
    if (ranks_[i].records > 0) order.push_back(i);
  }
  n = std::min(n, order.size());
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n),
                    order.end(), [&](uint32_t a, uint32_t b) {
                      return ranks_[a].level > ranks_[b].level;
                    });
  std::vector<RankDetail> out;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t rank = order[i];
    out.push_back({.rank = rank,
                   .host = HostOf(rank),
                   .seconds = std::exp(static_cast<double>(ranks_[rank].level)),
                   .ratio = Ratio(rank)});
  }
  return out;
}

size_t RankStepTimes::MemoryBytes() const {
  size_t bytes = ranks_.capacity() * sizeof(Rank) +
                 scratch_.capacity() * sizeof(float) +
                 hosts_.capacity() * sizeof(std::string);
  for (const std::string& h : hosts_) {
    if (h.capacity() > 15) bytes += h.capacity() + 1;  // beyond the SSO buffer
  }
  // The index: a control byte and a slot (a string and an index) a bucket.
  bytes += host_index_.capacity() *
           (1 + sizeof(std::pair<std::string, uint32_t>));
  for (const auto& [h, i] : host_index_) {
    if (h.capacity() > 15) bytes += h.capacity() + 1;
  }
  return bytes;
}

void InputWait::Add(double step_time_s, double data_wait_s) {
  if (!(step_time_s > 0) || !std::isfinite(step_time_s) ||
      !std::isfinite(data_wait_s)) {
    return;
  }
  last_ = static_cast<float>(std::clamp(data_wait_s / step_time_s, 0.0, 1.0));
  fractions_[next_] = last_;
  next_ = (next_ + 1) % kSteps;
  if (count_ < kSteps) ++count_;
}

double InputWait::MedianFraction() const {
  if (count_ == 0) return 0.0;
  return MedianOf(fractions_.data(), count_);
}

}  // namespace trainwatch
