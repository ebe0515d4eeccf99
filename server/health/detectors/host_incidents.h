// Lemon hosts (HostSuspect, docs/detectors.md): the same machine named by
// NonFiniteUpdate, LossSpike or RankStraggler alerts of at least two
// different runs within a day. Server-wide and pure: HostSuspectDetector is
// fed every run's alerts as they fire (and the stored incidents at start),
// and raises HostSuspect when a host just became suspect.
//
// Not thread-safe: the caller serializes.
#ifndef TRAINWATCH_SERVER_HEALTH_DETECTORS_HOST_INCIDENTS_H_
#define TRAINWATCH_SERVER_HEALTH_DETECTORS_HOST_INCIDENTS_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "health/alert_catalog.h"
#include "health/health_config.h"

namespace trainwatch {

struct HostIncident {
  std::string host;
  std::string alertname;
  std::string run;
  int64_t unix_nanos = 0;
  // What the alert said (its name, step, rank and description; "" unknown,
  // as for incidents read back from the store): another run's incident
  // with the same fingerprint is that run's records replayed under another
  // run id (an import, a scenario replayed), not another run failing on the
  // host, and does not count as one.
  std::string fingerprint;
};

// A host that `min_runs` runs named within the window.
struct HostSuspicion {
  std::string host;
  std::vector<std::string> runs;        // distinct, sorted
  std::vector<std::string> alertnames;  // distinct, sorted
  int64_t first_unix_nanos = 0;
  int64_t last_unix_nanos = 0;
};

class HostIncidents {
 public:
  explicit HostIncidents(HostSuspectConfig config) : config_(config) {}

  // Whether an alert of this kind implicates the host it names.
  static bool Implicates(AlertKind kind);

  // Records an incident (an empty host is ignored). Returns the host's
  // suspicion when this incident makes it suspect and it was not already
  // (one HostSuspect per host until its incidents age out).
  std::optional<HostSuspicion> Add(const HostIncident& incident);
  // The host's suspicion now, if it is suspect.
  std::optional<HostSuspicion> Suspicion(const std::string& host,
                                         int64_t now_unix_nanos) const;
  // Forgets incidents older than the window; returns the hosts that stop
  // being suspect (their HostSuspect may resolve).
  std::vector<std::string> Expire(int64_t now_unix_nanos);

  // Forgets every incident of `run` (a deleted run: nothing of it may name
  // a host later). Returns how many it forgot per (host, alertname); a host
  // no longer suspect stops being so.
  std::map<std::pair<std::string, std::string>, size_t> ForgetRun(
      const std::string& run);

  size_t hosts() const { return hosts_.size(); }

 private:
  struct Host {
    std::deque<HostIncident> incidents;  // oldest first
    bool suspect = false;
    int64_t touched = 0;
  };
  std::optional<HostSuspicion> Summarize(const std::string& host,
                                         const Host& h, int64_t since) const;

  const HostSuspectConfig config_;
  absl::flat_hash_map<std::string, Host> hosts_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_DETECTORS_HOST_INCIDENTS_H_
