#include "server_flags.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "alerting/notifier.h"
#include "config/config.h"
#include "health/catalog_print.h"

namespace trainwatch {
namespace {

using Value = const std::string&;

// The flags' upper bounds (docs/errors-and-limits.md).
constexpr uint64_t kMaxRetentionDays = 36'525;  // 100 years
constexpr uint64_t kMaxStepCount = uint64_t{1} << 62;  // steps are below 2^63
constexpr uint64_t kMaxEngineThreads = 1024;
constexpr uint64_t kMaxActiveRuns = 10'000'000;

absl::Status UsageError(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

absl::Status Wants(absl::string_view flag, absl::string_view what,
                   Value value) {
  return UsageError(
      absl::StrCat(flag, " wants ", what, ", got \"", value, "\""));
}

absl::Status Text(Value value, std::string& field) {
  field = value;
  return absl::OkStatus();
}

// A whole number in [lo, hi] into `field`: every count and duration a flag
// takes has a bound, so no arithmetic on it can overflow (a day count times
// nanoseconds a day, a thread count the machine cannot start).
template <typename T>
absl::Status Bounded(absl::string_view flag, absl::string_view what, Value value,
                     uint64_t lo, uint64_t hi, T& field) {
  uint64_t n = 0;
  if (!absl::SimpleAtoi(value, &n) || n < lo || n > hi) {
    return Wants(flag, absl::StrCat(what, " in [", lo, ", ", hi, "]"), value);
  }
  field = static_cast<T>(n);
  return absl::OkStatus();
}

absl::Status Count(absl::string_view flag, Value value, uint64_t hi, size_t& field) {
  return Bounded(flag, "an integer", value, 1, hi, field);
}

absl::Status Seconds(absl::string_view flag, Value value,
                     std::chrono::milliseconds& field) {
  double seconds = 0;
  if (!absl::SimpleAtod(value, &seconds) || !(seconds >= 0.001) ||
      seconds > 86400) {
    return Wants(flag, "seconds in [0.001, 86400]", value);
  }
  field = std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  return absl::OkStatus();
}

absl::Status RankRecords(absl::string_view flag, Value value,
                         StoreOptions::RankRecords& field) {
  if (value == "digest") {
    field = StoreOptions::RankRecords::kDigest;
  } else if (value == "full") {
    field = StoreOptions::RankRecords::kFull;
  } else {
    return UsageError(
        absl::StrCat(flag, " must be digest or full, got \"", value, "\""));
  }
  return absl::OkStatus();
}

// The flags' defaults, as the flags take them.
std::string SecondsOf(std::chrono::milliseconds d) {
  std::string text = absl::StrCat(d.count() / 1000);
  if (int64_t ms = d.count() % 1000; ms != 0) {
    std::string fraction = absl::StrCat(1000 + ms).substr(1);  // "050"
    absl::StrAppend(&text, ".", absl::StripSuffix(absl::StripSuffix(fraction, "0"), "0"));
  }
  return text;
}

std::string RankRecordsOf(StoreOptions::RankRecords mode) {
  return mode == StoreOptions::RankRecords::kFull ? "full" : "digest";
}

// Each row: name, placeholder, help, its default from ServerOptions (null:
// none to print) and what follows the default, and how it sets the options.
constexpr ServerFlag kFlags[] = {
    {"--listen", "ADDR", "gRPC address",
     [](const ServerOptions& o) { return o.grpc.listen; }, "; port 0 = any free port",
     [](absl::string_view, Value v, ServerFlags& f) {
       return Text(v, f.options.grpc.listen);
     }},
    {"--metrics-listen", "ADDR", "Prometheus /metrics address",
     [](const ServerOptions& o) { return o.metrics.listen; }, "",
     [](absl::string_view, Value v, ServerFlags& f) {
       return Text(v, f.options.metrics.listen);
     }},
    {"--web-config-file", "FILE",
     "TLS and basic auth for /metrics, in the Prometheus\n"
     "exporters' web config format (tls_server_config,\n"
     "basic_auth_users; docs/fleet.md)",
     nullptr, "",
     [](absl::string_view, Value v, ServerFlags& f) {
       return Text(v, f.options.metrics.web_config_file);
     }},
    {"--db", "PATH", "SQLite database",
     [](const ServerOptions& o) { return o.store.db; }, "",
     [](absl::string_view, Value v, ServerFlags& f) {
       return Text(v, f.options.store.db);
     }},
    {"--backup-dir", "DIR",
     "where a backup stages its copy of the database\n"
     "before streaming it",
     [](const ServerOptions& o) { return o.store.backup_dir; },
     ": the --db's directory; it needs room for one copy per backup running",
     [](absl::string_view, Value v, ServerFlags& f) {
       return Text(v, f.options.store.backup_dir);
     }},
    {"--synchronous", "MODE", "SQLite synchronous: NORMAL or FULL",
     [](const ServerOptions& o) { return o.store.synchronous; }, "",
     [](absl::string_view, Value v, ServerFlags& f) {
       return Text(v, f.options.store.synchronous);
     }},
    {"--rank-records", "MODE",
     "what is stored of ranks other than a run's lead: full\n"
     "(every field) or digest (step, time, norms, step time,\n"
     "data wait, to 5 significant digits)",
     [](const ServerOptions& o) { return RankRecordsOf(o.store.rank_records); }, "",
     [](absl::string_view flag, Value v, ServerFlags& f) {
       return RankRecords(flag, v, f.options.store.rank_records);
     }},
    {"--rank-retention-steps", "N",
     "keep those ranks' records for the last N steps of\n"
     "each",
     [](const ServerOptions& o) { return absl::StrCat(o.store.rank_retention_steps); },
     ": as long as the run",
     [](absl::string_view flag, Value v, ServerFlags& f) {
       return Bounded(flag, "a step count (0 = as long as the run)", v, 0,
                      kMaxStepCount, f.options.store.rank_retention_steps);
     }},
    {"--engine-threads", "N", "health-engine threads",
     [](const ServerOptions& o) { return absl::StrCat(o.engine.threads); }, "",
     [](absl::string_view flag, Value v, ServerFlags& f) {
       return Count(flag, v, kMaxEngineThreads, f.options.engine.threads);
     }},
    {"--max-active-runs", "N", "runs that have not finished, at most",
     [](const ServerOptions& o) { return absl::StrCat(o.engine.max_active_runs); }, "",
     [](absl::string_view flag, Value v, ServerFlags& f) {
       return Count(flag, v, kMaxActiveRuns, f.options.engine.max_active_runs);
     }},
    {"--run-idle-timeout", "SECONDS",
     "a run with no step this long leaves the active runs;\n"
     "its history stays, and it can come back",
     [](const ServerOptions& o) { return SecondsOf(o.engine.run_idle_timeout); }, "",
     [](absl::string_view flag, Value v, ServerFlags& f) {
       return Seconds(flag, v, f.options.engine.run_idle_timeout);
     }},
    {"--retention-days", "N",
     "delete runs whose last record is N days old, with\n"
     "their records, alerts and spikes, giving the space\n"
     "back",
     [](const ServerOptions& o) { return absl::StrCat(o.engine.retention_days); },
     ": keep everything; at most 36525",
     [](absl::string_view flag, Value v, ServerFlags& f) {
       return Bounded(flag, "a number of days (0 = keep everything)", v, 0,
                      kMaxRetentionDays, f.options.engine.retention_days);
     }},
    {"--config", "FILE",
     "YAML detector thresholds (see deploy/trainwatch.yaml)",
     nullptr, "",
     [](absl::string_view, Value v, ServerFlags& f) {
       return Text(v, f.config_path);
     }},
    {"--closed-loop", "off|propose|auto",
     "directives to the trainer for critical alerts with a\n"
     "restart plan: none, proposed for trainwatchctl approve,\n"
     "or closed_loop.auto's approved at once",
     // The default is the config's closed_loop.mode, which the flag replaces.
     [](const ServerOptions& o) -> std::string {
       return ClosedLoopModeName(o.engine.health.closed_loop.mode);
     },
     "; docs/closed-loop.md",
     [](absl::string_view flag, Value v, ServerFlags& f) -> absl::Status {
       std::optional<ClosedLoopConfig::Mode> mode = ParseClosedLoopMode(std::string(v));
       if (!mode.has_value()) {
         return absl::InvalidArgumentError(
             absl::StrCat(flag, ": expected off, propose or auto, got \"", v, "\""));
       }
       f.closed_loop_mode = mode;
       return absl::OkStatus();
     }},
    {"--alertmanager-url", "URL",
     "send alerts to Alertmanager (POST URL/api/v2/alerts)",
     nullptr, "",
     [](absl::string_view, Value v, ServerFlags& f) {
       return Text(v, f.options.alerts.alertmanager_url);
     }},
    {"--alertmanager-resend-interval", "SECONDS",
     "re-send firing alerts this often",
     [](const ServerOptions& o) { return SecondsOf(o.alerts.resend_interval); }, "",
     [](absl::string_view flag, Value v, ServerFlags& f) {
       return Seconds(flag, v, f.options.alerts.resend_interval);
     }},
    {"--webhook-url", "URL", "POST each alert fire and resolve as JSON to URL",
     nullptr, "",
     [](absl::string_view, Value v, ServerFlags& f) {
       return Text(v, f.options.alerts.webhook_url);
     }},
    {"--keepalive-time", "SECONDS", "ping a connection quiet this long",
     [](const ServerOptions& o) { return SecondsOf(o.grpc.keepalive_time); }, "",
     [](absl::string_view flag, Value v, ServerFlags& f) {
       return Seconds(flag, v, f.options.grpc.keepalive_time);
     }},
    {"--keepalive-timeout", "SECONDS",
     "drop it (ending its streams) when the ping is not\n"
     "answered this fast: a dead or stopped trainer's\n"
     "stream ends; an idle live one stays",
     [](const ServerOptions& o) { return SecondsOf(o.grpc.keepalive_timeout); }, "",
     [](absl::string_view flag, Value v, ServerFlags& f) {
       return Seconds(flag, v, f.options.grpc.keepalive_timeout);
     }},
    {"--auth-token-file", "FILE",
     "require bearer tokens: lines \"TOKEN SCOPE[,SCOPE...]\",\n"
     "scopes read, write:PREFIX, write:*, runs:N\n"
     "(docs/security.md)",
     nullptr, "",
     [](absl::string_view, Value v, ServerFlags& f) {
       return Text(v, f.options.grpc.auth_token_file);
     }},
    {"--tls-cert", "FILE",
     "serve gRPC over TLS with this PEM certificate chain",
     nullptr, "",
     [](absl::string_view, Value v, ServerFlags& f) {
       return Text(v, f.options.grpc.tls.cert_file);
     }},
    {"--tls-key", "FILE", "... and this PEM private key (both or neither)",
     nullptr, "",
     [](absl::string_view, Value v, ServerFlags& f) {
       return Text(v, f.options.grpc.tls.key_file);
     }},
    {"--tls-client-ca", "FILE",
     "also require client certificates signed by these\n"
     "PEM CAs (mutual TLS; needs --tls-cert/--tls-key)",
     nullptr, "",
     [](absl::string_view, Value v, ServerFlags& f) {
       return Text(v, f.options.grpc.tls.client_ca_file);
     }},
    {"--print-catalog", "WHAT",
     "print rules, inhibit, docs, charts or json from\n"
     "the alert catalog and exit (the generated blocks\n"
     "of the deploy files, docs tables and report)",
     nullptr, "",
     [](absl::string_view flag, Value v, ServerFlags& f) {
       if (!PrintCatalog(v).has_value()) {
         return UsageError(absl::StrCat(
             flag, " must be rules, inhibit, docs, charts or json, got \"", v, "\""));
       }
       return Text(v, f.print_catalog);
     }},
    {"--print-config", "[WHAT]",
     "print the configuration (the defaults, or --config's\n"
     "file applied) and exit: every key with its value, or\n"
     "WHAT: values (the same), documented (each key with\n"
     "what it sets, as deploy/trainwatch.yaml), tuned (the\n"
     "keys a user tunes first, and internals not at their\n"
     "default) or docs (docs/config.md's table)",
     nullptr, "",
     [](absl::string_view flag, Value v, ServerFlags& f) {
       if (!PrintHealthConfigAs(v, HealthConfig{}).has_value()) {
         return UsageError(absl::StrCat(
             flag, " must be values, documented, tuned or docs, got \"", v, "\""));
       }
       f.print_config = true;
       return Text(v, f.print_config_what);
     }},
    {"--help", "", "this text", nullptr, "", nullptr},
};

const ServerFlag* FindFlag(absl::string_view name) {
  auto it = std::find_if(std::begin(kFlags), std::end(kFlags),
                         [&](const ServerFlag& f) { return f.name == name; });
  return it == std::end(kFlags) ? nullptr : &*it;
}

// The checks made once every flag is in, in this order: with several wrong,
// the first here is the one reported.
absl::Status CheckParsed(const ServerOptions& options) {
  const TlsFiles& tls = options.grpc.tls;
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return UsageError(
        "--tls-cert and --tls-key go together: give both or neither");
  }
  if (!tls.client_ca_file.empty() && tls.cert_file.empty()) {
    return UsageError("--tls-client-ca needs --tls-cert and --tls-key");
  }
  if (options.store.synchronous != "NORMAL" &&
      options.store.synchronous != "FULL") {
    return UsageError("--synchronous must be NORMAL or FULL");
  }
  for (const auto& [flag, url] :
       {std::pair{"--alertmanager-url", &options.alerts.alertmanager_url},
        std::pair{"--webhook-url", &options.alerts.webhook_url}}) {
    if (url->empty()) continue;
    if (absl::Status s = Notifier::CheckUrl(flag, *url); !s.ok()) {
      return UsageError(s.message());
    }
  }
  return absl::OkStatus();
}

// "(default VALUE<note>)" as the words --help wraps: the first,
// "(default VALUE" with the note's leading punctuation, is never split.
std::vector<std::string> DefaultWords(const ServerFlag& flag, const ServerOptions& options) {
  std::string value = flag.default_of(options);
  std::string head = value.empty() ? "(default" : absl::StrCat("(default ", value);
  absl::string_view note = flag.default_note;
  size_t space = note.find(' ');
  absl::StrAppend(&head, note.substr(0, space));
  std::vector<std::string> words = {head};
  if (space != absl::string_view::npos) {
    for (absl::string_view word : absl::StrSplit(note.substr(space + 1), ' ', absl::SkipEmpty())) {
      words.emplace_back(word);
    }
  }
  words.back() += ")";
  return words;
}

}  // namespace

std::span<const ServerFlag> ServerFlagTable() { return kFlags; }

absl::StatusOr<ServerFlags> ParseServerFlags(
    const std::vector<std::string>& args) {
  ServerFlags flags;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (arg == "--help" || arg == "-h") {
      flags.help = true;
      return flags;
    }
    // The one flag whose value may be left out: the next argument is its
    // WHAT unless it is a flag.
    if (arg == "--print-config" && (i + 1 == args.size() || args[i + 1].starts_with("-"))) {
      flags.print_config = true;
      continue;
    }
    // Every other flag takes a value, inline or as the next argument.
    std::string value;
    if (size_t eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg.resize(eq);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return UsageError(arg + " needs a value");
    }
    const ServerFlag* flag = FindFlag(arg);
    if (flag == nullptr || flag->set == nullptr) {
      return UsageError("unknown flag " + arg);
    }
    if (absl::Status s = flag->set(flag->name, value, flags); !s.ok()) return s;
  }
  if (absl::Status s = CheckParsed(flags.options); !s.ok()) return s;
  return flags;
}

std::string ServerUsage() {
  // Help text starts in this column, on the flag's line when it fits there,
  // and a default appended to it wraps before this width.
  constexpr size_t kHelpColumn = 27;
  constexpr size_t kHelpWidth = 63;
  const ServerOptions defaults;
  std::string usage = "usage: trainwatch-server [flags]\n\n";
  for (const ServerFlag& flag : kFlags) {
    std::string margin =
        absl::StrCat("  ", flag.name, flag.placeholder.empty() ? "" : " ",
                     flag.placeholder, " ");
    if (margin.size() > kHelpColumn) {
      margin.pop_back();
      absl::StrAppend(&usage, margin, "\n");
      margin.clear();
    }
    margin.resize(kHelpColumn, ' ');
    std::vector<std::string> lines = absl::StrSplit(flag.help, '\n');
    if (flag.default_of != nullptr) {
      for (const std::string& word : DefaultWords(flag, defaults)) {
        if (lines.back().size() + 1 + word.size() <= kHelpWidth) {
          absl::StrAppend(&lines.back(), " ", word);
        } else {
          lines.push_back(word);
        }
      }
    }
    for (const std::string& line : lines) {
      absl::StrAppend(&usage, margin, line, "\n");
      margin.assign(kHelpColumn, ' ');
    }
  }
  return usage;
}

}  // namespace trainwatch
