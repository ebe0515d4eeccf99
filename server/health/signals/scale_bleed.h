// LossScaleCollapse's slow-bleed rule (docs/detectors.md): an fp16 loss scale that
// keeps halving without ever growing back. GradScaler grows the scale only
// after growth_interval clean steps in a row, so overflows that keep coming
// sooner than that walk the scale down to nothing, however slowly; the
// healthy sawtooth (a growth, an overflow soon after, a halving back, a stray
// overflow now and then) grows back between its few halvings.
//
// Counts the halvings since the last growth; enough of them make a bleed,
// and their mean spacing forecasts the step at which the scale falls below a
// minimum.
//
// Pure and not thread-safe: one instance per run.
#ifndef TRAINWATCH_SERVER_HEALTH_SIGNALS_SCALE_BLEED_H_
#define TRAINWATCH_SERVER_HEALTH_SIGNALS_SCALE_BLEED_H_

#include <cstdint>
#include <optional>

namespace trainwatch {

class ScaleBleed {
 public:
  struct Bleed {
    uint32_t halvings = 0;       // since the last growth
    uint64_t first_step = 0;     // of the first of them
    double first_scale = 0.0;    // the scale before it
    double steps_per_halving = 0.0;
    std::optional<uint64_t> forecast_step;  // scale < min_scale, at this pace
  };

  // The scale after `step`'s update; `counts` false for decreases that are
  // not a bleed (the scaler searching its starting scale in warmup).
  void Add(uint64_t step, double scale, bool counts = true);
  // Whether the scale bled at least `halvings` times since it last grew, and
  // when it falls below `min_scale` at that pace.
  std::optional<Bleed> bleed(uint32_t halvings, double min_scale) const;
  void Reset();

 private:
  std::optional<double> last_scale_;
  uint64_t last_step_ = 0;
  double scale_ = 0.0;
  uint32_t count_ = 0;
  uint64_t first_step_ = 0;
  uint64_t last_halving_step_ = 0;
  double first_scale_ = 0.0;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_SIGNALS_SCALE_BLEED_H_
