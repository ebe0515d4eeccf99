#include "health/signals/scale_bleed.h"

#include <cmath>

namespace trainwatch {

void ScaleBleed::Add(uint64_t step, double scale, bool counts) {
  if (!std::isfinite(scale) || !(scale > 0)) return;
  if (last_scale_.has_value()) {
    if (scale > *last_scale_) {
      count_ = 0;
    } else if (scale < *last_scale_ && counts) {
      if (count_ == 0) {
        first_step_ = step;
        first_scale_ = *last_scale_;
      }
      ++count_;
      last_halving_step_ = step;
    }
  }
  last_scale_ = scale;
  last_step_ = step;
  scale_ = scale;
}

std::optional<ScaleBleed::Bleed> ScaleBleed::bleed(uint32_t halvings,
                                                   double min_scale) const {
  if (count_ < halvings || count_ < 2) return std::nullopt;
  Bleed b{.halvings = count_,
          .first_step = first_step_,
          .first_scale = first_scale_,
          .steps_per_halving = 0.0,
          .forecast_step = std::nullopt};
  b.steps_per_halving =
      static_cast<double>(last_halving_step_ - first_step_) / (count_ - 1);
  if (scale_ < min_scale) {
    b.forecast_step = last_step_;
  } else {
    // Halvings until the scale is below min_scale.
    const double left = std::floor(std::log2(scale_ / min_scale)) + 1;
    b.forecast_step = last_halving_step_ +
                      static_cast<uint64_t>(left * b.steps_per_halving);
  }
  return b;
}

void ScaleBleed::Reset() {
  last_scale_.reset();
  count_ = 0;
}

}  // namespace trainwatch
