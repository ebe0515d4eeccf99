#include "server_flags.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace trainwatch {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using ::testing::Not;

std::string ErrorOf(const std::vector<std::string>& args) {
  absl::StatusOr<ServerFlags> flags = ParseServerFlags(args);
  EXPECT_FALSE(flags.ok());
  if (flags.ok()) return "";
  EXPECT_EQ(flags.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(flags.status().message());
}

TEST(ServerFlags, NoFlagsKeepTheOptionsDefaults) {
  absl::StatusOr<ServerFlags> flags = ParseServerFlags({});
  ASSERT_TRUE(flags.ok()) << flags.status();
  const ServerOptions defaults;
  EXPECT_EQ(flags->options.grpc.listen, defaults.grpc.listen);
  EXPECT_EQ(flags->options.store.db, defaults.store.db);
  EXPECT_EQ(flags->options.engine.threads, defaults.engine.threads);
  EXPECT_EQ(flags->options.alerts.resend_interval,
            defaults.alerts.resend_interval);
  EXPECT_EQ(flags->config_path, "");
  EXPECT_FALSE(flags->help);
}

TEST(ServerFlags, EveryFlagSetsItsOption) {
  // A flag and its value on a line.
  // clang-format off
  absl::StatusOr<ServerFlags> flags = ParseServerFlags({
      "--listen", "0.0.0.0:1",
      "--metrics-listen=127.0.0.1:2",
      "--web-config-file", "web.yml",
      "--db", "x.db",
      "--synchronous", "FULL",
      "--rank-records", "full",
      "--rank-retention-steps", "5",
      "--engine-threads", "3",
      "--max-active-runs", "7",
      "--run-idle-timeout", "2.5",
      "--retention-days", "4",
      "--config", "t.yaml",
      "--alertmanager-url", "http://am:9093",
      "--alertmanager-resend-interval", "0.5",
      "--webhook-url", "https://hook/x",
      "--keepalive-time", "3",
      "--keepalive-timeout", "0.25",
      "--auth-token-file", "tokens",
      "--tls-cert", "c.pem",
      "--tls-key", "k.pem",
      "--tls-client-ca", "ca.pem",
  });
  // clang-format on
  ASSERT_TRUE(flags.ok()) << flags.status();
  const ServerOptions& o = flags->options;
  EXPECT_EQ(o.grpc.listen, "0.0.0.0:1");
  EXPECT_EQ(o.metrics.listen, "127.0.0.1:2");
  EXPECT_EQ(o.metrics.web_config_file, "web.yml");
  EXPECT_EQ(o.store.db, "x.db");
  EXPECT_EQ(o.store.synchronous, "FULL");
  EXPECT_EQ(o.store.rank_records, StoreOptions::RankRecords::kFull);
  EXPECT_EQ(o.store.rank_retention_steps, 5u);
  EXPECT_EQ(o.engine.threads, 3u);
  EXPECT_EQ(o.engine.max_active_runs, 7u);
  EXPECT_EQ(o.engine.run_idle_timeout, milliseconds(2500));
  EXPECT_EQ(o.engine.retention_days, 4u);
  EXPECT_EQ(flags->config_path, "t.yaml");
  EXPECT_EQ(o.alerts.alertmanager_url, "http://am:9093");
  EXPECT_EQ(o.alerts.resend_interval, milliseconds(500));
  EXPECT_EQ(o.alerts.webhook_url, "https://hook/x");
  EXPECT_EQ(o.grpc.keepalive_time, milliseconds(3000));
  EXPECT_EQ(o.grpc.keepalive_timeout, milliseconds(250));
  EXPECT_EQ(o.grpc.auth_token_file, "tokens");
  EXPECT_EQ(o.grpc.tls.cert_file, "c.pem");
  EXPECT_EQ(o.grpc.tls.key_file, "k.pem");
  EXPECT_EQ(o.grpc.tls.client_ca_file, "ca.pem");
}

TEST(ServerFlags, GivenTwiceTheLastWins) {
  absl::StatusOr<ServerFlags> flags =
      ParseServerFlags({"--engine-threads", "1", "--engine-threads=4"});
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(flags->options.engine.threads, 4u);
}

TEST(ServerFlags, HelpStopsTheParse) {
  for (const char* help : {"--help", "-h"}) {
    absl::StatusOr<ServerFlags> flags =
        ParseServerFlags({"--db", "x.db", help, "--bogus"});
    ASSERT_TRUE(flags.ok()) << flags.status();
    EXPECT_TRUE(flags->help);
  }
  EXPECT_EQ(ErrorOf({"--help=yes"}), "unknown flag --help");
}

TEST(ServerFlags, ErrorsNameTheFlag) {
  EXPECT_EQ(ErrorOf({"--bogus=1"}), "unknown flag --bogus");
  EXPECT_EQ(ErrorOf({"-listen", "x"}), "unknown flag -listen");
  EXPECT_EQ(ErrorOf({"--db"}), "--db needs a value");
  EXPECT_EQ(ErrorOf({"--engine-threads", "0"}),
            "--engine-threads wants an integer in [1, 1024], got \"0\"");
  EXPECT_EQ(ErrorOf({"--max-active-runs=-1"}),
            "--max-active-runs wants an integer in [1, 10000000], got \"-1\"");
  EXPECT_EQ(ErrorOf({"--keepalive-time", "1e9"}),
            "--keepalive-time wants seconds in [0.001, 86400], got \"1e9\"");
  EXPECT_EQ(ErrorOf({"--alertmanager-resend-interval", "nan"}),
            "--alertmanager-resend-interval wants seconds in [0.001, 86400], "
            "got \"nan\"");
  EXPECT_EQ(ErrorOf({"--rank-records", "FULL"}),
            "--rank-records must be digest or full, got \"FULL\"");
  EXPECT_EQ(ErrorOf({"--rank-retention-steps", "-3"}),
            "--rank-retention-steps wants a step count (0 = as long as the "
            "run) in [0, 4611686018427387904], got \"-3\"");
  EXPECT_EQ(ErrorOf({"--retention-days", "1.5"}),
            "--retention-days wants a number of days (0 = keep everything) "
            "in [0, 36525], got \"1.5\"");
  EXPECT_EQ(ErrorOf({"--synchronous", "normal"}),
            "--synchronous must be NORMAL or FULL");
  EXPECT_THAT(ErrorOf({"--webhook-url", "notaurl"}),
              HasSubstr("--webhook-url wants an http:// or https:// URL"));
}

// Every count and day flag has an upper bound, so nothing computed from it
// overflows: --retention-days 200000 once made the retention cutoff (days x
// nanoseconds a day) wrap and delete every run.
TEST(ServerFlags, CountsAndDaysAreBounded) {
  const struct {
    const char* flag;
    const char* last_good;
    const char* first_bad;
  } kBounds[] = {
      {"--retention-days", "36525", "36526"},
      {"--retention-days", "36525", "200000"},
      {"--rank-retention-steps", "4611686018427387904", "4611686018427387905"},
      {"--engine-threads", "1024", "1025"},
      {"--max-active-runs", "10000000", "10000001"},
      {"--retention-days", "36525", "18446744073709551616"},  // 2^64
  };
  for (const auto& b : kBounds) {
    EXPECT_TRUE(ParseServerFlags({b.flag, b.last_good}).ok()) << b.flag;
    EXPECT_THAT(ErrorOf({b.flag, b.first_bad}),
                HasSubstr(absl::StrCat(b.flag, " wants ")))
        << b.flag << " " << b.first_bad;
  }
  absl::StatusOr<ServerFlags> flags = ParseServerFlags({"--retention-days", "36525"});
  ASSERT_TRUE(flags.ok());
  EXPECT_EQ(flags->options.engine.retention_days, 36525u);
}

TEST(ServerFlags, TheFirstBadFlagIsTheOneReported) {
  EXPECT_EQ(ErrorOf({"--engine-threads", "0", "--bogus", "x"}),
            "--engine-threads wants an integer in [1, 1024], got \"0\"");
  EXPECT_EQ(ErrorOf({"--bogus", "x", "--engine-threads", "0"}),
            "unknown flag --bogus");
  // Checks that need every flag come after every flag's own.
  EXPECT_EQ(ErrorOf({"--synchronous", "OFF", "--bogus", "x"}),
            "unknown flag --bogus");
  EXPECT_EQ(ErrorOf({"--synchronous", "OFF", "--tls-cert", "c.pem"}),
            "--tls-cert and --tls-key go together: give both or neither");
}

TEST(ServerFlags, TlsFilesGoTogether) {
  EXPECT_EQ(ErrorOf({"--tls-key", "k.pem"}),
            "--tls-cert and --tls-key go together: give both or neither");
  EXPECT_EQ(ErrorOf({"--tls-client-ca", "ca.pem"}),
            "--tls-client-ca needs --tls-cert and --tls-key");
}

TEST(ServerFlags, PrintCatalogTakesWhatTheCatalogPrints) {
  for (const char* what : {"rules", "inhibit", "docs", "charts", "json"}) {
    absl::StatusOr<ServerFlags> flags =
        ParseServerFlags({"--print-catalog", what});
    ASSERT_TRUE(flags.ok()) << flags.status();
    EXPECT_EQ(flags->print_catalog, what);
  }
  EXPECT_THAT(ErrorOf({"--print-catalog", "yaml"}),
              HasSubstr("--print-catalog must be rules, inhibit, docs, charts or json"));
}

TEST(ServerFlags, PrintConfigTakesNoValueAndKeepsTheOtherFlags) {
  absl::StatusOr<ServerFlags> flags =
      ParseServerFlags({"--print-config", "--config", "my.yaml"});
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_TRUE(flags->print_config);
  EXPECT_EQ(flags->config_path, "my.yaml");
  EXPECT_FALSE(ParseServerFlags({})->print_config);
}

TEST(ServerFlags, PrintConfigTakesWhatToPrintInlineOrNext) {
  EXPECT_EQ(ParseServerFlags({"--print-config"})->print_config_what, "values");
  for (const char* what : {"values", "documented", "tuned", "docs"}) {
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"--print-config", what, "--config", "my.yaml"},
          std::vector<std::string>{std::string("--print-config=") + what}}) {
      absl::StatusOr<ServerFlags> flags = ParseServerFlags(args);
      ASSERT_TRUE(flags.ok()) << flags.status();
      EXPECT_TRUE(flags->print_config);
      EXPECT_EQ(flags->print_config_what, what);
    }
  }
  EXPECT_THAT(ErrorOf({"--print-config", "yaml"}),
              HasSubstr("--print-config must be values, documented, tuned or docs, got \"yaml\""));
  EXPECT_THAT(ErrorOf({"--print-config="}), HasSubstr("--print-config must be values"));
}

TEST(ServerFlags, UsageListsEveryFlagOfTheTable) {
  const std::string usage = ServerUsage();
  EXPECT_EQ(usage.rfind("usage: trainwatch-server [flags]\n\n", 0), 0u);
  for (const ServerFlag& flag : ServerFlagTable()) {
    std::string line = "\n  " + std::string(flag.name);
    if (!flag.placeholder.empty()) line += " " + std::string(flag.placeholder);
    EXPECT_THAT(usage, HasSubstr(line)) << flag.name;
  }
  // The help text's column, and its continuation lines under it.
  EXPECT_THAT(usage, HasSubstr("\n  --db PATH                SQLite database "
                               "(default trainwatch.db)\n"));
  EXPECT_THAT(usage, HasSubstr("\n  --rank-retention-steps N keep those ranks' "
                               "records for the last N steps of\n"
                               "                           each (default 0: "
                               "as long as the run)\n"));
  EXPECT_THAT(usage, HasSubstr("\n  --run-idle-timeout SECONDS\n"
                               "                           a run with no "
                               "step this long leaves the active runs;\n"));
  EXPECT_THAT(usage, HasSubstr("\n  --help                   this text\n"));
}

// The options a command line leaves the server with: --closed-loop replaces
// the config's closed_loop.mode, as main() applies it.
ServerOptions Effective(const ServerFlags& flags) {
  ServerOptions options = flags.options;
  if (flags.closed_loop_mode.has_value()) {
    options.engine.health.closed_loop.mode = *flags.closed_loop_mode;
  }
  return options;
}

// Every flag's printed default from `options`, by flag.
std::map<std::string, std::string> PrintedDefaults(const ServerOptions& options) {
  std::map<std::string, std::string> printed;
  for (const ServerFlag& flag : ServerFlagTable()) {
    if (flag.default_of != nullptr) printed[std::string(flag.name)] = flag.default_of(options);
  }
  return printed;
}

// --help prints each default from ServerOptions; no help text types one.
TEST(ServerFlags, UsagePrintsTheDefaultsOfServerOptions) {
  const std::string usage = ServerUsage();
  for (const ServerFlag& flag : ServerFlagTable()) {
    EXPECT_THAT(flag.help, Not(HasSubstr("(default"))) << flag.name;
    EXPECT_THAT(flag.help, Not(HasSubstr("; default"))) << flag.name;
    EXPECT_THAT(flag.default_note, Not(HasSubstr("default"))) << flag.name;
    if (flag.default_of == nullptr) {
      EXPECT_EQ(flag.default_note, "") << flag.name;
      continue;
    }
    const std::string value = flag.default_of(ServerOptions{});
    EXPECT_THAT(usage, HasSubstr(value.empty() ? "(default:" : "(default " + value)) << flag.name;
  }
  EXPECT_THAT(usage, HasSubstr("(default 127.0.0.1:50051; port 0 = any free port)\n"));
  EXPECT_THAT(usage, HasSubstr("(default 3600)\n"));  // --run-idle-timeout, in seconds
  EXPECT_THAT(usage, HasSubstr("(default 0: keep everything; at most 36525)\n"));
  EXPECT_THAT(usage, HasSubstr("(default propose;\n"));
  EXPECT_THAT(usage, HasSubstr("(default: the --db's directory;"));
}

// The printed default is what no flag gives, and given to its flag it
// changes nothing: --help cannot disagree with ServerOptions.
TEST(ServerFlags, EachPrintedDefaultIsWhatNoFlagGives) {
  const std::map<std::string, std::string> defaults = PrintedDefaults(ServerOptions{});
  EXPECT_GE(defaults.size(), 14u);
  absl::StatusOr<ServerFlags> none = ParseServerFlags({});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(PrintedDefaults(Effective(*none)), defaults);
  for (const auto& [name, value] : defaults) {
    absl::StatusOr<ServerFlags> given = ParseServerFlags({name + "=" + value});
    ASSERT_TRUE(given.ok()) << name << "=" << value << ": " << given.status();
    EXPECT_EQ(PrintedDefaults(Effective(*given)), defaults) << name << "=" << value;
  }
}

// Each flag's default is printed from the option the flag sets: a value
// given prints back as given.
TEST(ServerFlags, EachDefaultIsReadFromTheOptionItsFlagSets) {
  const std::map<std::string, std::string> given = {
      {"--listen", "0.0.0.0:1"},
      {"--metrics-listen", ""},
      {"--db", "x.db"},
      {"--backup-dir", "/tmp/b"},
      {"--synchronous", "FULL"},
      {"--rank-records", "full"},
      {"--rank-retention-steps", "5"},
      {"--engine-threads", "3"},
      {"--max-active-runs", "7"},
      {"--run-idle-timeout", "2.5"},
      {"--retention-days", "4"},
      {"--closed-loop", "auto"},
      {"--alertmanager-resend-interval", "0.05"},
      {"--keepalive-time", "3"},
      {"--keepalive-timeout", "0.001"},
  };
  const std::map<std::string, std::string> defaults = PrintedDefaults(ServerOptions{});
  for (const auto& [name, default_value] : defaults) {
    auto it = given.find(name);
    ASSERT_NE(it, given.end()) << name << " has a default: give it a value here";
    ASSERT_NE(it->second, default_value) << name;
    absl::StatusOr<ServerFlags> flags = ParseServerFlags({name + "=" + it->second});
    ASSERT_TRUE(flags.ok()) << name << ": " << flags.status();
    std::map<std::string, std::string> expected = defaults;
    expected[name] = it->second;
    EXPECT_EQ(PrintedDefaults(Effective(*flags)), expected) << name;
  }
}

}  // namespace
}  // namespace trainwatch
