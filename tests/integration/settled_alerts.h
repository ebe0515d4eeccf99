// A run's alert history through trainwatchctl, once the server has stored
// every alert the replays before it raised: what the scenario tests compare.
#ifndef TRAINWATCH_TESTS_INTEGRATION_SETTLED_ALERTS_H_
#define TRAINWATCH_TESTS_INTEGRATION_SETTLED_ALERTS_H_

#include <atomic>
#include <optional>
#include <string>

#include "harness.h"
#include <nlohmann/json.hpp>

namespace trainwatch::testing {

// `trainwatchctl alerts --run RUN --json` once what the server took in
// before this call is stored; nullopt with `error` saying why not.
//
// Each replay before this exited on its last ack, and by then every alert
// its records or events raised is queued in the store (a batch's alerts
// before the batch itself; an event's before its ack). The store commits its
// one queue in order, so once a marker record sent now (a run of its own,
// one step) is acknowledged, those alerts are committed: a server-side
// signal, not a wait for two reads to agree.
inline std::optional<nlohmann::json> SettledAlerts(const std::string& address,
                                                   const std::string& run,
                                                   std::string* error) {
  static std::atomic<int> markers{0};
  const std::string marker = "store-marker-" + std::to_string(markers++);
  CommandResult acked = RunCommand(
      {BinDir() + "/trainwatchctl", "--server", address, "replay", "-"},
      nlohmann::json{{"run_start", {{"run_id", marker}, {"precision", "BF16"}}}}
              .dump() +
          "\n" + nlohmann::json{{"step", 0}, {"grad_norm", 0.5}}.dump() + "\n");
  if (acked.exit_code != 0) {
    *error = "the marker replay: " + acked.out + acked.err;
    return std::nullopt;
  }
  CommandResult r = RunCommand({BinDir() + "/trainwatchctl", "--server",
                                address, "alerts", "--run", run, "--json"});
  if (r.exit_code != 0) {
    *error = r.out + r.err;
    return std::nullopt;
  }
  nlohmann::json alerts =
      nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  if (!alerts.is_array()) {
    *error = "not a JSON array: " + r.out;
    return std::nullopt;
  }
  return alerts;
}

}  // namespace trainwatch::testing

#endif  // TRAINWATCH_TESTS_INTEGRATION_SETTLED_ALERTS_H_
