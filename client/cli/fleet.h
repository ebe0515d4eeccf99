// trainwatchctl across a fleet (docs/fleet.md): `--server A,B,C`
// names every server; `runs` and `alerts` ask them all at once and merge, and
// a run-scoped command finds the one server that holds its run.
#ifndef TRAINWATCH_CLIENT_CLI_FLEET_H_
#define TRAINWATCH_CLIENT_CLI_FLEET_H_

#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cli/commands.h"

namespace trainwatch::cli {

// The answer of one server to a fanned-out call.
template <typename T>
struct ServerAnswer {
  std::string server;
  absl::StatusOr<T> answer;
};

// Calls `call(global_for_that_server)` on every server of global.servers at
// once, one thread each (so `call` must be safe to run concurrently), and
// returns the answers in the order of the list.
template <typename T>
std::vector<ServerAnswer<T>> FanOut(
    const GlobalOptions& global,
    const std::function<absl::StatusOr<T>(const GlobalOptions&)>& call) {
  std::vector<ServerAnswer<T>> answers;
  for (const std::string& server : global.servers) {
    answers.push_back({server, absl::UnknownError("not asked")});
  }
  std::vector<std::thread> threads;
  for (ServerAnswer<T>& a : answers) {
    threads.emplace_back([&global, &call, &a] {
      GlobalOptions one = global;
      one.server = a.server;
      one.servers = {a.server};
      a.answer = call(one);
    });
  }
  for (std::thread& t : threads) t.join();
  return answers;
}

// Prints "trainwatchctl: server ADDR: <message>" on stderr for each server
// whose status is not OK, and returns the status a fan-out command ends with:
// OK when all answered, else UNAVAILABLE "<command>: N of M servers did not
// answer" (the others' answers are printed all the same).
absl::Status ReportUnansweredStatuses(
    absl::string_view command,
    const std::vector<std::pair<std::string, absl::Status>>& statuses);

// ReportUnansweredStatuses for the answers of FanOut.
template <typename T>
absl::Status ReportUnanswered(absl::string_view command,
                              const std::vector<ServerAnswer<T>>& answers) {
  std::vector<std::pair<std::string, absl::Status>> statuses;
  for (const ServerAnswer<T>& a : answers) {
    statuses.emplace_back(a.server, a.answer.status());
  }
  return ReportUnansweredStatuses(command, statuses);
}

// `global` aimed at the server that holds `run_id`, with global.run set so
// that every call carries `x-trainwatch-run` (a proxy routes by it). With one
// address that is the address itself (a server or the fleet's proxy). With
// several, each is asked for its runs: the one that holds the run is chosen;
// if the run moved when the fleet changed and several hold part of it, the
// one with the latest step, named on stderr. NOT_FOUND when none holds it.
absl::StatusOr<GlobalOptions> ForRun(const GlobalOptions& global,
                                     absl::string_view command,
                                     const std::string& run_id);

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLIENT_CLI_FLEET_H_
