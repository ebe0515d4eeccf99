// The detector thresholds of a deployment, read from the YAML file given to
// trainwatch-server --config (docs/detectors.md). deploy/trainwatch.yaml lists
// every key with its default and doubles as the reference:
//
//   window_steps: 1000
//   disabled: [RunSilent]
//   clip_fraction:
//     threshold: 0.05
//
// A key left out keeps its default (HealthConfig's initializers). Anything
// the server would otherwise silently ignore or misread is an error that
// names the file, the line and the key: an unknown key, a value of the wrong
// type, a value out of range, an alertname not in the catalog, a key given
// twice.
//
// Thread-safe: free functions without shared state.
#ifndef TRAINWATCH_SERVER_CONFIG_CONFIG_H_
#define TRAINWATCH_SERVER_CONFIG_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "health/health_config.h"

namespace trainwatch {

// Reads and parses the file at `path`. NOT_FOUND when it cannot be read,
// INVALID_ARGUMENT ("PATH:LINE: what is wrong") when it is not a valid config.
absl::StatusOr<HealthConfig> LoadHealthConfig(const std::string& path);

// Parses YAML text; errors start with "NAME_FOR_ERRORS:LINE: ". Empty text
// (or a document holding only comments) gives the defaults.
absl::StatusOr<HealthConfig> ParseHealthConfig(
    const std::string& yaml_text, const std::string& name_for_errors);

// Every key of `config` with its value, as a YAML file the parser reads back
// to the same config (trainwatch-server --print-config): the top-level keys,
// `disabled`, then each group in HealthConfig's order.
std::string PrintHealthConfig(const HealthConfig& config);

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_CONFIG_CONFIG_H_
