#include "health/detectors/host_incidents.h"

#include <algorithm>
#include <map>
#include <set>

namespace trainwatch {
namespace {
constexpr int64_t kNanos = 1'000'000'000;
}  // namespace

bool HostIncidents::Implicates(AlertKind kind) { return Spec(kind).implicates_host; }

std::optional<HostSuspicion> HostIncidents::Summarize(const std::string& host,
                                                      const Host& h,
                                                      int64_t since) const {
  std::set<std::string> runs, names;
  std::map<std::string, std::string> run_of;  // fingerprint -> first run
  HostSuspicion s{.host = host};
  for (const HostIncident& i : h.incidents) {
    if (i.unix_nanos < since) continue;
    if (!i.fingerprint.empty()) {
      auto [it, added] = run_of.try_emplace(i.fingerprint, i.run);
      if (!added && it->second != i.run) continue;  // a replay of that run
    }
    if (runs.empty() && names.empty()) s.first_unix_nanos = i.unix_nanos;
    runs.insert(i.run);
    names.insert(i.alertname);
    s.first_unix_nanos = std::min(s.first_unix_nanos, i.unix_nanos);
    s.last_unix_nanos = std::max(s.last_unix_nanos, i.unix_nanos);
  }
  if (runs.size() < config_.min_runs) return std::nullopt;
  s.runs.assign(runs.begin(), runs.end());
  s.alertnames.assign(names.begin(), names.end());
  return s;
}

std::optional<HostSuspicion> HostIncidents::Add(const HostIncident& incident) {
  if (incident.host.empty()) return std::nullopt;
  auto it = hosts_.find(incident.host);
  if (it == hosts_.end()) {
    if (hosts_.size() >= config_.max_hosts) {
      // Bounded: drop the host touched longest ago.
      auto oldest = std::min_element(
          hosts_.begin(), hosts_.end(), [](const auto& a, const auto& b) {
            return a.second.touched < b.second.touched;
          });
      hosts_.erase(oldest);
    }
    it = hosts_.try_emplace(incident.host).first;
  }
  Host& h = it->second;
  // Kept in time order: a stored incident loaded at start may be older.
  auto pos = std::upper_bound(
      h.incidents.begin(), h.incidents.end(), incident.unix_nanos,
      [](int64_t t, const HostIncident& i) { return t < i.unix_nanos; });
  h.incidents.insert(pos, incident);
  while (h.incidents.size() > config_.max_incidents_per_host) {
    h.incidents.pop_front();
  }
  h.touched = std::max(h.touched, incident.unix_nanos);
  const int64_t since = h.touched - config_.window_seconds * kNanos;
  std::optional<HostSuspicion> s = Summarize(incident.host, h, since);
  if (!s.has_value() || h.suspect) return std::nullopt;
  h.suspect = true;
  return s;
}

std::optional<HostSuspicion> HostIncidents::Suspicion(
    const std::string& host, int64_t now_unix_nanos) const {
  auto it = hosts_.find(host);
  if (it == hosts_.end()) return std::nullopt;
  return Summarize(host, it->second,
                   now_unix_nanos - config_.window_seconds * kNanos);
}

std::vector<std::string> HostIncidents::Expire(int64_t now_unix_nanos) {
  const int64_t since = now_unix_nanos - config_.window_seconds * kNanos;
  std::vector<std::string> cleared;
  for (auto it = hosts_.begin(); it != hosts_.end();) {
    Host& h = it->second;
    while (!h.incidents.empty() && h.incidents.front().unix_nanos < since) {
      h.incidents.pop_front();
    }
    if (h.suspect && !Summarize(it->first, h, since).has_value()) {
      h.suspect = false;
      cleared.push_back(it->first);
    }
    if (h.incidents.empty()) {
      hosts_.erase(it++);
    } else {
      ++it;
    }
  }
  return cleared;
}

std::map<std::pair<std::string, std::string>, size_t> HostIncidents::ForgetRun(
    const std::string& run) {
  std::map<std::pair<std::string, std::string>, size_t> forgot;
  for (auto it = hosts_.begin(); it != hosts_.end();) {
    Host& h = it->second;
    std::erase_if(h.incidents, [&](const HostIncident& i) {
      if (i.run != run) return false;
      ++forgot[{it->first, i.alertname}];
      return true;
    });
    // Suspect again only through runs that are still there.
    if (h.suspect) h.suspect = Summarize(it->first, h, h.touched - config_.window_seconds * kNanos).has_value();
    if (h.incidents.empty()) {
      hosts_.erase(it++);
    } else {
      ++it;
    }
  }
  return forgot;
}

}  // namespace trainwatch
