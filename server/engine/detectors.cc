#include "engine/detector.h"
#include "engine/detectors_internal.h"

namespace trainwatch {

std::vector<std::unique_ptr<Detector>> MakeDetectors(const HealthConfig& config) {
  Detectors out;
  AddNormDetectors(config, &out);
  AddFp16Detectors(config, &out);
  AddRankDetectors(config, &out);
  AddLayerDetectors(config, &out);
  return out;
}

}  // namespace trainwatch
