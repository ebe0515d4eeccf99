// trainwatchctl's command line (docs/contracts.md), separate from main() so that
// tests can run whole invocations in-process.
#ifndef TRAINWATCH_CLIENT_CLI_CLI_H_
#define TRAINWATCH_CLIENT_CLI_CLI_H_

#include <string>
#include <vector>

namespace trainwatch::cli {

// Runs one invocation; `args` excludes the program name. Writes results to
// stdout and errors to stderr; returns the exit code: 0 success, 1 failure
// (server, file or data), 2 usage error.
int RunCli(std::vector<std::string> args);

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLIENT_CLI_CLI_H_
