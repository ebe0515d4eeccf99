#include "engine/detectors_internal.h"

namespace trainwatch {

void AddLayerDetectors(const HealthConfig& config, Detectors* out) {}

}  // namespace trainwatch
