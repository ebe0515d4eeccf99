// The detector thresholds of a deployment, read from the YAML file given to
// trainwatch-server --config (docs/config.md):
//
//   window_steps: 1000
//   disabled: [RunSilent]
//   clip_fraction:
//     threshold: 0.05
//
// Every key is one row of a descriptor table (config_fields.cc): its place
// in HealthConfig, its range, its tier (what a user tunes first, or an
// internal) and what it sets. The parser reads through it, and the printers
// print from it the values (--print-config), deploy/trainwatch.yaml (every
// key with its default, documented) and docs/config.md's table.
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

#include <optional>
#include <string>
#include <string_view>

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

// A key's tier, as leveldb's options keep what users tune apart from the
// internals. kTuned: the line an alert fires at, and the deployment's shape
// (the window, the alerts switched off, how long a run may be silent).
// kInternal: how a rule gets to its line (persistence, warmup, baselines,
// EMA decays, horizons, hysteresis, the CUSUM) and memory bounds, calibrated
// together: change with care.
enum class ConfigTier { kTuned, kInternal };

// Every key of `config` with its value, as a YAML file the parser reads back
// to the same config (trainwatch-server --print-config): the top-level keys,
// `disabled`, then each group in HealthConfig's order.
std::string PrintHealthConfig(const HealthConfig& config);

// `config` as a documented YAML file (deploy/trainwatch.yaml's block): each
// group's line and each key with what it sets, after its value; in each
// group the kTuned keys, then the kInternal ones under "# internals:".
// Without `internals`, only the internal keys whose value is not the default
// are printed: a short file that still reads back to `config`.
std::string PrintHealthConfigDocumented(const HealthConfig& config, bool internals);

// docs/config.md's table (markdown): every key with its default, its range,
// its tier and what it sets, in the documented file's order.
std::string PrintHealthConfigTable();

// trainwatch-server --print-config WHAT: "values" (PrintHealthConfig),
// "documented", "tuned" (PrintHealthConfigDocumented with and without the
// internals) or "docs" (the table, of the defaults); nullopt for another.
std::optional<std::string> PrintHealthConfigAs(std::string_view what,
                                               const HealthConfig& config);

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_CONFIG_CONFIG_H_
