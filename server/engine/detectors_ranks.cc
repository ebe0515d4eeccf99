#include "engine/detectors_internal.h"

namespace trainwatch {

void AddRankDetectors(const HealthConfig& config, Detectors* out) {}

}  // namespace trainwatch
