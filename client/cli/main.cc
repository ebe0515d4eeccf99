// trainwatchctl: replays step logs into a trainwatch server and queries it
// (docs/contracts.md). The command line is parsed in cli.cc; the commands live in
// replay.cc and query.cc.
#include <string>
#include <vector>

#include "cli/cli.h"

int main(int argc, char** argv) {
  return trainwatch::cli::RunCli(
      std::vector<std::string>(argv + 1, argv + argc));
}
