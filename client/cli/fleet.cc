#include "cli/fleet.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainwatch::cli {
namespace {

constexpr std::chrono::milliseconds kListDeadline{30'000};

}  // namespace

absl::Status ReportUnansweredStatuses(
    absl::string_view command,
    const std::vector<std::pair<std::string, absl::Status>>& statuses) {
  size_t failed = 0;
  for (const auto& [server, status] : statuses) {
    if (status.ok()) continue;
    ++failed;
    std::fprintf(stderr, "trainwatchctl: server %s: %.*s\n", server.c_str(),
                 static_cast<int>(status.message().size()),
                 status.message().data());
  }
  if (failed == 0) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(command, ": ", failed, " of ",
                                             statuses.size(),
                                             " servers did not answer"));
}

absl::StatusOr<GlobalOptions> ForRun(const GlobalOptions& global,
                                     absl::string_view command,
                                     const std::string& run_id) {
  GlobalOptions aimed = global;
  aimed.run = run_id;
  if (global.servers.size() <= 1) return aimed;

  std::function<absl::StatusOr<v1::ListRunsResponse>(const GlobalOptions&)>
      list = [command](const GlobalOptions& one)
      -> absl::StatusOr<v1::ListRunsResponse> {
    v1::ListRunsResponse response;
    auto context = NewContext(one, kListDeadline);
    grpc::Status status =
        NewStub(one)->ListRuns(context.get(), v1::ListRunsRequest(), &response);
    if (!status.ok()) return RpcError(command, "ListRuns", status);
    return response;
  };
  std::vector<ServerAnswer<v1::ListRunsResponse>> answers =
      FanOut(global, list);

  const std::string* holder = nullptr;
  uint64_t holder_last_step = 0;
  std::vector<std::string> holders;
  std::vector<std::string> unanswered;
  for (const ServerAnswer<v1::ListRunsResponse>& a : answers) {
    if (!a.answer.ok()) {
      unanswered.push_back(absl::StrCat(a.server, " (",
                                        a.answer.status().message(), ")"));
      continue;
    }
    for (const v1::RunSummary& run : a.answer->runs()) {
      if (run.run_id() != run_id) continue;
      holders.push_back(a.server);
      if (holder == nullptr || run.last_step() > holder_last_step) {
        holder = &a.server;
        holder_last_step = run.last_step();
      }
    }
  }
  if (holder == nullptr) {
    std::string message = absl::StrCat(
        command, ": run ", run_id, " is on none of the servers that answered (",
        global.server, "); a new run goes through the fleet's proxy (one "
        "--server address) so that it lands where the proxy routes it");
    if (!unanswered.empty()) {
      absl::StrAppend(&message, "; did not answer: ",
                      absl::StrJoin(unanswered, "; "));
      return absl::UnavailableError(message);
    }
    return absl::NotFoundError(message);
  }
  if (holders.size() > 1) {
    // After a server was added, the proxy sends a run's next streams to its
    // new server while its history stays where it was (docs/fleet.md).
    std::fprintf(stderr,
                 "trainwatchctl: run %s is on %s (it moved when the fleet "
                 "changed); using %s, which has its latest step %llu\n",
                 run_id.c_str(), absl::StrJoin(holders, " and ").c_str(),
                 holder->c_str(),
                 static_cast<unsigned long long>(holder_last_step));
  }
  if (!unanswered.empty()) {
    std::fprintf(stderr, "trainwatchctl: did not answer: %s\n",
                 absl::StrJoin(unanswered, "; ").c_str());
  }
  aimed.server = *holder;
  aimed.servers = {*holder};
  return aimed;
}

}  // namespace trainwatch::cli
