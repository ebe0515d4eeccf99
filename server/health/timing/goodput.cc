#include "health/timing/goodput.h"

#include <algorithm>
#include <cmath>

namespace trainwatch {
namespace {
constexpr double kTypicalAlpha = 0.05;
}  // namespace

void Goodput::OnLeadRecord(uint64_t step, bool skipped, int64_t unix_nanos,
                           std::optional<double> step_time_s) {
  std::optional<double> gap;
  if (records_ > 0 && unix_nanos > last_nanos_) {
    gap = static_cast<double>(unix_nanos - last_nanos_) * 1e-9;
  }
  // This step's own time: what the trainer measured, else the gap since the
  // previous record when that is no longer than a few steps.
  std::optional<double> own;
  if (step_time_s.has_value() && std::isfinite(*step_time_s) && *step_time_s >= 0) {
    own = *step_time_s;
  }
  if (gap.has_value() && typical_ > 0) {
    const double limit =
        std::max(config_.gap_factor * typical_, config_.min_gap_seconds);
    if (*gap > limit) silent_seconds_ += *gap - own.value_or(typical_);
    else if (!own.has_value()) own = *gap;
  } else if (gap.has_value() && !own.has_value() && *gap < config_.min_gap_seconds) {
    own = *gap;
  }
  if (own.has_value()) {
    typical_ = typical_ == 0 ? *own : typical_ + kTypicalAlpha * (*own - typical_);
  }
  if (skipped) {
    ++skipped_;
    skipped_seconds_ += own.value_or(typical_);
  }
  if (records_ == 0 || unix_nanos < first_nanos_) first_nanos_ = unix_nanos;
  last_nanos_ = std::max(last_nanos_, unix_nanos);
  ++records_;
}

void Goodput::OnRewind(uint64_t first_step, uint64_t last_step) {
  if (last_step < first_step) return;
  const uint64_t redone = last_step - first_step + 1;
  rewound_ += redone;
  rewound_seconds_ += static_cast<double>(redone) * typical_;
}

GoodputTotals Goodput::totals() const {
  GoodputTotals t;
  t.skipped_steps = skipped_;
  t.rewound_steps = rewound_;
  t.productive_steps = records_ - std::min(records_, skipped_ + rewound_);
  t.skipped_seconds = skipped_seconds_;
  t.rewound_seconds = rewound_seconds_;
  t.silent_seconds = silent_seconds_;
  t.wall_seconds = records_ > 1
                       ? static_cast<double>(last_nanos_ - first_nanos_) * 1e-9
                       : 0.0;
  if (t.wall_seconds > 0) {
    const double lost = skipped_seconds_ + rewound_seconds_ + silent_seconds_;
    t.ratio = std::clamp((t.wall_seconds - lost) / t.wall_seconds, 0.0, 1.0);
  }
  return t;
}

}  // namespace trainwatch
