// The flags of trainwatch-server as one table: each entry holds a flag's
// name, its value's placeholder, its help text and how it sets the options;
// the same table parses a command line and prints --help.
//
// trainwatchctl's flags (client/cli/flags.h) are parsed differently: they
// take positional arguments, single-dash names and `--`, and are read after
// parsing; the server's are all `--name VALUE` or `--name=VALUE` (but
// --help, and --print-config whose value may be left out), each checked and
// applied as it comes, so the first bad one is the one reported.
#ifndef TRAINWATCH_SERVER_SERVER_FLAGS_H_
#define TRAINWATCH_SERVER_SERVER_FLAGS_H_

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "health/health_config.h"
#include "server.h"

namespace trainwatch {

// What a command line sets.
struct ServerFlags {
  ServerOptions options;
  // --config: the detector thresholds' YAML file, which main() loads once
  // every flag is checked; "" = the built-in thresholds.
  std::string config_path;
  // --closed-loop: replaces the config's closed_loop.mode when given.
  std::optional<ClosedLoopConfig::Mode> closed_loop_mode;
  // --print-catalog: print that text of the alert catalog
  // (health/catalog_print.h) and exit 0; "" = serve.
  std::string print_catalog;
  // --print-config [WHAT]: print the configuration (--config's, else the
  // defaults) as PrintHealthConfigAs(WHAT) prints it (config/config.h), and
  // exit 0.
  bool print_config = false;
  std::string print_config_what = "values";
  // --help or -h was given: print ServerUsage() and exit 0.
  bool help = false;
};

// One row of the table: "--name PLACEHOLDER  help (default VALUE)".
struct ServerFlag {
  absl::string_view name;         // with its dashes: "--listen"
  absl::string_view placeholder;  // of the value: "ADDR"; "" for --help
  // Lines after the first are continuation lines of --help's text. No help
  // text types a default: --help prints it from ServerOptions.
  absl::string_view help;
  // The option the flag sets, as the flag takes it (a duration in seconds):
  // --help prints it from a default ServerOptions after the help text, so
  // the two cannot disagree. Null for a flag with no default to print (a
  // file or URL that is off unless given, --help itself).
  std::string (*default_of)(const ServerOptions& options);
  // Printed after the default, inside its parentheses: ": keep everything"
  // makes "(default 0: keep everything)". With an empty default, ": the
  // --db's directory" makes "(default: the --db's directory)".
  absl::string_view default_note;
  // Parses `value` into `flags`; a usage error naming `flag` (this row's
  // name) when it does not parse. Null for --help, which takes no value.
  absl::Status (*set)(absl::string_view flag, const std::string& value,
                      ServerFlags& flags);
};

// Every flag, in the order --help lists them.
std::span<const ServerFlag> ServerFlagTable();

// Parses the arguments after the program name. `--help` or `-h` stops the
// parse with `help` set. An error (unknown flag, missing or bad value, flags
// that go together given apart) is InvalidArgument with a message naming the
// flag; the caller prints it with ServerUsage() and exits 2.
absl::StatusOr<ServerFlags> ParseServerFlags(
    const std::vector<std::string>& args);

// --help's text, printed from the table: each flag's help, then its default
// from ServerOptions{} where it has one.
std::string ServerUsage();

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_SERVER_FLAGS_H_
