// The configuration's one descriptor table: every key of the YAML file, with
// its place in HealthConfig, its range, its tier and what it sets. The
// parser (config.cc) reads a file through it; the printers (config_print.cc)
// print the values, the documented YAML of deploy/trainwatch.yaml and
// docs/config.md's table from it. Private to tw_config.
//
// Thread-safe: constant tables and free functions.
#ifndef TRAINWATCH_SERVER_CONFIG_CONFIG_FIELDS_H_
#define TRAINWATCH_SERVER_CONFIG_CONFIG_FIELDS_H_

#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "config/config.h"
#include "health/health_config.h"

namespace trainwatch {

// The values a setting may take. `lo`/`hi` are inclusive unless `*_open`.
struct Range {
  double lo;
  bool lo_open;
  double hi;
  bool hi_open;
  const char* text;  // as the error message says it
};

bool InRange(double v, const Range& r);

using FieldRef = std::variant<double*, uint32_t*, int64_t*, bool*>;

// One numeric or true/false setting: its place in the YAML file and in the
// struct, and its documentation.
struct Field {
  absl::string_view group;  // "" at the top level
  absl::string_view key;
  Range range;
  FieldRef ref;
  ConfigTier tier;
  absl::string_view doc;  // what it sets, a sentence or two, for the YAML and the docs

  std::string Dotted() const {
    return group.empty() ? std::string(key) : absl::StrCat(group, ".", key);
  }
};

// Every numeric setting of HealthConfig, in the struct's order. A field added
// to HealthConfig without a line here is not settable; config_test checks
// each one.
std::vector<Field> Fields(HealthConfig& c);

// The settings that are words or lists (`disabled`, closed_loop's `mode` and
// `auto`): parsed and printed by their own code, documented here. Each is
// printed after its group's Fields, in this order.
struct WordKey {
  absl::string_view group;  // "" at the top level
  absl::string_view key;
  const char* range;        // the values it takes, for the docs
  ConfigTier tier;
  absl::string_view doc;
  std::string (*print)(const HealthConfig& c);  // its value, as YAML
};
std::span<const WordKey> WordKeys();

// What a group of keys is about: its alerts, or the part it tunes.
absl::string_view GroupDoc(absl::string_view group);

// The groups of `fields`, in the order they first appear.
std::vector<absl::string_view> Groups(const std::vector<Field>& fields);

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_CONFIG_CONFIG_FIELDS_H_
