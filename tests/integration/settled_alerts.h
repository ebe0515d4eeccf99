// A run's alert history through trainwatchctl, once it has settled: what the
// scenario tests compare.
#ifndef TRAINWATCH_TESTS_INTEGRATION_SETTLED_ALERTS_H_
#define TRAINWATCH_TESTS_INTEGRATION_SETTLED_ALERTS_H_

#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "harness.h"
#include <nlohmann/json.hpp>

namespace trainwatch::testing {

// `trainwatchctl alerts --run RUN --json` once two reads 100 ms apart agree
// (the engine has taken everything in before the last ack; this only waits
// out the store); nullopt with `error` saying why not.
inline std::optional<nlohmann::json> SettledAlerts(const std::string& address,
                                                   const std::string& run,
                                                   std::string* error) {
  std::string last;
  for (int i = 0; i < 50; ++i) {
    CommandResult r = RunCommand({BinDir() + "/trainwatchctl", "--server",
                                  address, "alerts", "--run", run, "--json"});
    if (r.exit_code != 0) {
      *error = r.out + r.err;
      return std::nullopt;
    }
    if (r.out == last) {
      nlohmann::json alerts =
          nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
      if (!alerts.is_array()) {
        *error = "not a JSON array: " + r.out;
        return std::nullopt;
      }
      return alerts;
    }
    last = r.out;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  *error = "alerts did not settle within 5 s";
  return std::nullopt;
}

}  // namespace trainwatch::testing

#endif  // TRAINWATCH_TESTS_INTEGRATION_SETTLED_ALERTS_H_
