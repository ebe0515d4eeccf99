#include "health/run/rank_progress.h"

#include <algorithm>
#include <limits>

namespace trainwatch {

void RankProgress::Reset(uint32_t attempt, int64_t now_unix_nanos) {
  started_ = true;
  attempt_ = attempt;
  for (Rank& r : ranks_) r = Rank{.last_nanos = now_unix_nanos};
  newest_.reset();
  through_.reset();
  Rescan();
}

void RankProgress::Grow(uint32_t world_size, int64_t now_unix_nanos) {
  if (world_size <= ranks_.size()) return;
  ranks_.resize(world_size, Rank{.last_nanos = now_unix_nanos});
  Rescan();
}

bool RankProgress::Add(uint32_t rank, uint32_t attempt, uint32_t world_size,
                       uint64_t step, int64_t now_unix_nanos) {
  if (started_ && attempt < attempt_) return false;
  if (!started_ || attempt > attempt_) Reset(attempt, now_unix_nanos);
  Grow(std::max(world_size, rank + 1), now_unix_nanos);
  const bool judged = through_.has_value() && step <= *through_;
  Rank& r = ranks_[rank];
  r.last_nanos = now_unix_nanos;
  const uint64_t next = step == std::numeric_limits<uint64_t>::max() ? step : step + 1;
  if (r.missing) {
    // Back again: it counts from here on.
    r.missing = false;
    r.next = std::max(r.next, next);
    CountPresent(r.next);
  } else if (next > r.next) {
    const uint64_t old = r.next;
    r.next = next;
    if (old == min_next_ && --at_min_ == 0) Rescan();
  }
  if (!newest_.has_value() || step > *newest_) newest_ = step;
  Advance();
  return !judged;
}

void RankProgress::DeclareMissing(int64_t now_unix_nanos,
                                  int64_t missing_after_nanos) {
  bool changed = false;
  for (Rank& r : ranks_) {
    if (!r.missing && now_unix_nanos - r.last_nanos >= missing_after_nanos) {
      r.missing = true;
      changed = true;
    }
  }
  if (!changed) return;
  Rescan();
  Advance();
}

void RankProgress::Finish(uint32_t rank, uint32_t attempt,
                          int64_t now_unix_nanos) {
  if (started_ && attempt < attempt_) return;
  if (!started_ || attempt > attempt_) Reset(attempt, now_unix_nanos);
  Grow(rank + 1, now_unix_nanos);
  Rank& r = ranks_[rank];
  r.missing = false;
  r.next = std::numeric_limits<uint64_t>::max();
  Rescan();
  Advance();
}

bool RankProgress::AllMissingBelow(uint32_t rank) const {
  if (rank == 0) return true;
  if (rank > ranks_.size()) return false;
  for (uint32_t i = 0; i < rank; ++i) {
    if (!ranks_[i].missing) return false;
  }
  return true;
}

void RankProgress::Rescan() {
  any_present_ = false;
  at_min_ = 0;
  for (const Rank& r : ranks_) {
    if (!r.missing) CountPresent(r.next);
  }
}

void RankProgress::CountPresent(uint64_t next) {
  if (!any_present_ || next < min_next_) {
    min_next_ = next;
    at_min_ = 1;
    any_present_ = true;
  } else if (next == min_next_) {
    ++at_min_;
  }
}

void RankProgress::Advance() {
  if (!newest_.has_value()) return;
  std::optional<uint64_t> to;
  if (!any_present_) {
    to = *newest_;  // every rank is missing: judge what there is
  } else if (min_next_ > 0) {
    to = std::min(min_next_ - 1, *newest_);
  }
  if (max_lag_ > 0 && *newest_ >= max_lag_) {
    const uint64_t forced = *newest_ - max_lag_;
    if (!to.has_value() || forced > *to) to = forced;
  }
  if (to.has_value() && (!through_.has_value() || *to > *through_)) through_ = to;
}

}  // namespace trainwatch
