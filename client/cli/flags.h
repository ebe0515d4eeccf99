// Command-line parsing for trainwatchctl: `--name VALUE`, `--name=VALUE`,
// boolean `--name`, positional arguments, and `--` to end the flags.
#ifndef TRAINWATCH_CLIENT_CLI_FLAGS_H_
#define TRAINWATCH_CLIENT_CLI_FLAGS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainwatch::cli {

// A flag a command accepts, named without the leading dashes.
struct FlagSpec {
  absl::string_view name;
  bool takes_value = true;
};

// A usage error (unknown flag, missing argument, malformed number): the tool
// prints usage and exits 2 rather than 1. Carried as a status payload so that
// it survives being returned through a command.
absl::Status UsageError(absl::string_view message);
bool IsUsageError(const absl::Status& status);

// The flags and positional arguments of one command line, checked against the
// flags the command accepts. A flag given twice keeps its last value, as
// shells and wrappers that append overrides expect.
//
// Thread-compatible; immutable after Parse().
class ParsedArgs {
 public:
  static absl::StatusOr<ParsedArgs> Parse(std::span<const std::string> args,
                                          std::span<const FlagSpec> specs);

  bool Has(absl::string_view name) const;
  std::optional<std::string> Get(absl::string_view name) const;
  // Every value of a flag that may be repeated (--map A=x --map B=y), in
  // order.
  std::vector<std::string> GetAll(absl::string_view name) const;

  // Typed values; std::nullopt when the flag is absent, a usage error when
  // its value does not parse (a negative number for an unsigned one too).
  absl::StatusOr<std::optional<uint32_t>> GetUint32(
      absl::string_view name) const;
  absl::StatusOr<std::optional<uint64_t>> GetUint64(
      absl::string_view name) const;
  absl::StatusOr<std::optional<double>> GetDouble(absl::string_view name) const;

  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string, std::less<>> values_;
  std::vector<std::string> positional_;
  std::vector<std::pair<std::string, std::string>> every_;
};

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLIENT_CLI_FLAGS_H_
