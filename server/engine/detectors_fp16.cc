#include "engine/detectors_internal.h"

namespace trainwatch {

void AddFp16Detectors(const HealthConfig& config, Detectors* out) {}

}  // namespace trainwatch
