#include "engine/detectors_internal.h"

namespace trainwatch {

void AddNormDetectors(const HealthConfig& config, Detectors* out) {}

}  // namespace trainwatch
