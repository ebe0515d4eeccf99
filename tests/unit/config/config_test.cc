#include "config/config.h"

#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "health/alert_catalog.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "yaml-cpp/yaml.h"

namespace trainwatch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

const std::string kShipped = TW_DEPLOY_DIR "/trainwatch.yaml";

// Every field of HealthConfig, compared one by one (operator== would hide
// which one differs).
void ExpectSameConfig(const HealthConfig& a, const HealthConfig& b) {
  EXPECT_EQ(a.window_steps, b.window_steps);
  EXPECT_EQ(a.resolve_after_steps, b.resolve_after_steps);
  EXPECT_EQ(a.disabled, b.disabled);
  EXPECT_EQ(a.change.arl0, b.change.arl0);
  EXPECT_EQ(a.change.resolve_ratio, b.change.resolve_ratio);
  EXPECT_EQ(a.change.min_steps, b.change.min_steps);
  EXPECT_EQ(a.clip_fraction.threshold, b.clip_fraction.threshold);
  EXPECT_EQ(a.clip_fraction.min_steps, b.clip_fraction.min_steps);
  EXPECT_EQ(a.spike.sigmas, b.spike.sigmas);
  EXPECT_EQ(a.spike.min_ratio, b.spike.min_ratio);
  EXPECT_EQ(a.spike.hard_ratio, b.spike.hard_ratio);
  EXPECT_EQ(a.spike.ema_beta, b.spike.ema_beta);
  EXPECT_EQ(a.spike.min_steps, b.spike.min_steps);
  EXPECT_EQ(a.drift.ratio, b.drift.ratio);
  EXPECT_EQ(a.drift.lr_decay_fraction, b.drift.lr_decay_fraction);
  EXPECT_EQ(a.loss_scale.bleed_halvings, b.loss_scale.bleed_halvings);
  EXPECT_EQ(a.loss_scale.halvings, b.loss_scale.halvings);
  EXPECT_EQ(a.loss_scale.within_steps, b.loss_scale.within_steps);
  EXPECT_EQ(a.loss_scale.min_scale, b.loss_scale.min_scale);
  EXPECT_EQ(a.skip_rate.threshold, b.skip_rate.threshold);
  EXPECT_EQ(a.skip_rate.min_steps, b.skip_rate.min_steps);
  EXPECT_EQ(a.scaler_stuck.consecutive, b.scaler_stuck.consecutive);
  EXPECT_EQ(a.clip_before_unscale.steps, b.clip_before_unscale.steps);
  EXPECT_EQ(a.clip_before_unscale.clip_fraction,
            b.clip_before_unscale.clip_fraction);
  EXPECT_EQ(a.clip_before_unscale.min_norm_to_scale,
            b.clip_before_unscale.min_norm_to_scale);
  EXPECT_EQ(a.post_clip.min_steps, b.post_clip.min_steps);
  EXPECT_EQ(a.post_clip.pile_fraction, b.post_clip.pile_fraction);
  EXPECT_EQ(a.post_clip.min_pile, b.post_clip.min_pile);
  EXPECT_EQ(a.attention.ratio, b.attention.ratio);
  EXPECT_EQ(a.attention.cap, b.attention.cap);
  EXPECT_EQ(a.log_z.nats, b.log_z.nats);
  EXPECT_EQ(a.attention.horizon_steps, b.attention.horizon_steps);
  EXPECT_EQ(a.log_z.horizon_steps, b.log_z.horizon_steps);
  EXPECT_EQ(a.log_z.baseline_steps, b.log_z.baseline_steps);
  EXPECT_EQ(a.loss_spike.sigmas, b.loss_spike.sigmas);
  EXPECT_EQ(a.loss_spike.min_ratio, b.loss_spike.min_ratio);
  EXPECT_EQ(a.loss_spike.stay_steps, b.loss_spike.stay_steps);
  EXPECT_EQ(a.loss_spike.recent_steps, b.loss_spike.recent_steps);
  EXPECT_EQ(a.adam.jump_ratio, b.adam.jump_ratio);
  EXPECT_EQ(a.adam.min_reports, b.adam.min_reports);
  EXPECT_EQ(a.rank_mismatch.relative_spread, b.rank_mismatch.relative_spread);
  EXPECT_EQ(a.rank_mismatch.horizon_steps, b.rank_mismatch.horizon_steps);
  EXPECT_EQ(a.shard_mismatch.relative_error, b.shard_mismatch.relative_error);
  EXPECT_EQ(a.fp16_scaler.steps, b.fp16_scaler.steps);
  EXPECT_EQ(a.adam.g_over_sqrt_v, b.adam.g_over_sqrt_v);
  EXPECT_EQ(a.adam.eps_multiple, b.adam.eps_multiple);
  EXPECT_EQ(a.adam.stall_reports, b.adam.stall_reports);
  EXPECT_EQ(a.silent.seconds, b.silent.seconds);
  EXPECT_EQ(a.closed_loop.mode, b.closed_loop.mode);
  EXPECT_EQ(a.closed_loop.auto_actions, b.closed_loop.auto_actions);
  EXPECT_EQ(a.closed_loop.max_rollbacks, b.closed_loop.max_rollbacks);
  EXPECT_EQ(a.closed_loop.min_steps_between, b.closed_loop.min_steps_between);
  EXPECT_EQ(a.closed_loop.lead_steps, b.closed_loop.lead_steps);
  const TimingConfig &ta = a.timing, &tb = b.timing;
  EXPECT_EQ(ta.straggler.slack, tb.straggler.slack);
  EXPECT_EQ(ta.straggler.threshold, tb.straggler.threshold);
  EXPECT_EQ(ta.straggler.clip, tb.straggler.clip);
  EXPECT_EQ(ta.straggler.ratio, tb.straggler.ratio);
  EXPECT_EQ(ta.straggler.resolve_ratio, tb.straggler.resolve_ratio);
  EXPECT_EQ(ta.straggler.min_ranks, tb.straggler.min_ranks);
  EXPECT_EQ(ta.straggler.warmup_records, tb.straggler.warmup_records);
  EXPECT_EQ(ta.input_stall.fraction, tb.input_stall.fraction);
  EXPECT_EQ(ta.input_stall.resolve_fraction, tb.input_stall.resolve_fraction);
  EXPECT_EQ(ta.goodput.gap_factor, tb.goodput.gap_factor);
  EXPECT_EQ(ta.goodput.min_gap_seconds, tb.goodput.min_gap_seconds);
  EXPECT_EQ(ta.spike_replay.judge_after_steps, tb.spike_replay.judge_after_steps);
  EXPECT_EQ(ta.spike_replay.tolerance_steps, tb.spike_replay.tolerance_steps);
  EXPECT_EQ(a.host_suspect.window_seconds, b.host_suspect.window_seconds);
  EXPECT_EQ(a.host_suspect.min_runs, b.host_suspect.min_runs);
}

// Each settable key, a value other than its default, and where it lands.
struct Override {
  std::string group;  // "" at the top level
  std::string key;
  std::string value;
  std::function<void(HealthConfig&)> expect;  // applies the same change
};

std::vector<Override> AllOverrides() {
  return {
      {"", "window_steps", "500", [](HealthConfig& c) { c.window_steps = 500; }},
      {"", "resolve_after_steps", "7",
       [](HealthConfig& c) { c.resolve_after_steps = 7; }},
      {"", "disabled", "[RunSilent, LogZDrift]",
       [](HealthConfig& c) { c.disabled = {"RunSilent", "LogZDrift"}; }},
      {"change", "arl0", "1e4", [](HealthConfig& c) { c.change.arl0 = 1e4; }},
      {"change", "resolve_ratio", "0.5",
       [](HealthConfig& c) { c.change.resolve_ratio = 0.5; }},
      {"change", "min_steps", "8", [](HealthConfig& c) { c.change.min_steps = 8; }},
      {"clip_fraction", "threshold", "0.2",
       [](HealthConfig& c) { c.clip_fraction.threshold = 0.2; }},
      {"clip_fraction", "min_steps", "50",
       [](HealthConfig& c) { c.clip_fraction.min_steps = 50; }},
      {"spike", "sigmas", "4.5", [](HealthConfig& c) { c.spike.sigmas = 4.5; }},
      {"spike", "min_ratio", "3", [](HealthConfig& c) { c.spike.min_ratio = 3; }},
      {"spike", "hard_ratio", "20",
       [](HealthConfig& c) { c.spike.hard_ratio = 20; }},
      {"spike", "ema_beta", "0.95",
       [](HealthConfig& c) { c.spike.ema_beta = 0.95; }},
      {"spike", "min_steps", "10", [](HealthConfig& c) { c.spike.min_steps = 10; }},
      {"drift", "ratio", "1.5", [](HealthConfig& c) { c.drift.ratio = 1.5; }},
      {"drift", "lr_decay_fraction", "0.1",
       [](HealthConfig& c) { c.drift.lr_decay_fraction = 0.1; }},
      {"loss_scale", "bleed_halvings", "7",
       [](HealthConfig& c) { c.loss_scale.bleed_halvings = 7; }},
      {"loss_scale", "halvings", "6",
       [](HealthConfig& c) { c.loss_scale.halvings = 6; }},
      {"loss_scale", "within_steps", "200",
       [](HealthConfig& c) { c.loss_scale.within_steps = 200; }},
      {"loss_scale", "min_scale", "0.5",
       [](HealthConfig& c) { c.loss_scale.min_scale = 0.5; }},
      {"skip_rate", "threshold", "0.03",
       [](HealthConfig& c) { c.skip_rate.threshold = 0.03; }},
      {"skip_rate", "min_steps", "300",
       [](HealthConfig& c) { c.skip_rate.min_steps = 300; }},
      {"scaler_stuck", "consecutive", "9",
       [](HealthConfig& c) { c.scaler_stuck.consecutive = 9; }},
      {"clip_before_unscale", "steps", "64",
       [](HealthConfig& c) { c.clip_before_unscale.steps = 64; }},
      {"clip_before_unscale", "clip_fraction", "0.8",
       [](HealthConfig& c) { c.clip_before_unscale.clip_fraction = 0.8; }},
      {"clip_before_unscale", "min_norm_to_scale", "1e-4",
       [](HealthConfig& c) { c.clip_before_unscale.min_norm_to_scale = 1e-4; }},
      {"post_clip", "min_steps", "200",
       [](HealthConfig& c) { c.post_clip.min_steps = 200; }},
      {"post_clip", "pile_fraction", "0.1",
       [](HealthConfig& c) { c.post_clip.pile_fraction = 0.1; }},
      {"post_clip", "min_pile", "20",
       [](HealthConfig& c) { c.post_clip.min_pile = 20; }},
      {"attention", "ratio", "3", [](HealthConfig& c) { c.attention.ratio = 3; }},
      {"attention", "cap", "50", [](HealthConfig& c) { c.attention.cap = 50; }},
      {"log_z", "nats", "2.5", [](HealthConfig& c) { c.log_z.nats = 2.5; }},
      {"attention", "horizon_steps", "500",
       [](HealthConfig& c) { c.attention.horizon_steps = 500; }},
      {"log_z", "horizon_steps", "800",
       [](HealthConfig& c) { c.log_z.horizon_steps = 800; }},
      {"log_z", "baseline_steps", "500",
       [](HealthConfig& c) { c.log_z.baseline_steps = 500; }},
      {"loss_spike", "sigmas", "8", [](HealthConfig& c) { c.loss_spike.sigmas = 8; }},
      {"loss_spike", "min_ratio", "1.5",
       [](HealthConfig& c) { c.loss_spike.min_ratio = 1.5; }},
      {"loss_spike", "stay_steps", "5",
       [](HealthConfig& c) { c.loss_spike.stay_steps = 5; }},
      {"loss_spike", "recent_steps", "200",
       [](HealthConfig& c) { c.loss_spike.recent_steps = 200; }},
      {"adam", "jump_ratio", "4", [](HealthConfig& c) { c.adam.jump_ratio = 4; }},
      {"adam", "min_reports", "6",
       [](HealthConfig& c) { c.adam.min_reports = 6; }},
      {"rank_mismatch", "relative_spread", "0.01",
       [](HealthConfig& c) { c.rank_mismatch.relative_spread = 0.01; }},
      {"rank_mismatch", "horizon_steps", "1024",
       [](HealthConfig& c) { c.rank_mismatch.horizon_steps = 1024; }},
      {"shard_mismatch", "relative_error", "0.05",
       [](HealthConfig& c) { c.shard_mismatch.relative_error = 0.05; }},
      {"fp16_scaler", "steps", "30",
       [](HealthConfig& c) { c.fp16_scaler.steps = 30; }},
      {"adam", "g_over_sqrt_v", "8",
       [](HealthConfig& c) { c.adam.g_over_sqrt_v = 8; }},
      {"adam", "eps_multiple", "100",
       [](HealthConfig& c) { c.adam.eps_multiple = 100; }},
      {"adam", "stall_reports", "5",
       [](HealthConfig& c) { c.adam.stall_reports = 5; }},
      {"silent", "seconds", "900", [](HealthConfig& c) { c.silent.seconds = 900; }},
      {"straggler", "slack", "1.1", [](HealthConfig& c) { c.timing.straggler.slack = 1.1; }},
      {"straggler", "threshold", "5", [](HealthConfig& c) { c.timing.straggler.threshold = 5; }},
      {"straggler", "clip", "2", [](HealthConfig& c) { c.timing.straggler.clip = 2; }},
      {"straggler", "ratio", "1.3", [](HealthConfig& c) { c.timing.straggler.ratio = 1.3; }},
      {"straggler", "resolve_ratio", "1.05",
       [](HealthConfig& c) { c.timing.straggler.resolve_ratio = 1.05; }},
      {"straggler", "min_ranks", "4", [](HealthConfig& c) { c.timing.straggler.min_ranks = 4; }},
      {"straggler", "warmup_records", "50",
       [](HealthConfig& c) { c.timing.straggler.warmup_records = 50; }},
      {"input_stall", "fraction", "0.3",
       [](HealthConfig& c) { c.timing.input_stall.fraction = 0.3; }},
      {"input_stall", "resolve_fraction", "0.2",
       [](HealthConfig& c) { c.timing.input_stall.resolve_fraction = 0.2; }},
      {"goodput", "gap_factor", "20", [](HealthConfig& c) { c.timing.goodput.gap_factor = 20; }},
      {"goodput", "min_gap_seconds", "60",
       [](HealthConfig& c) { c.timing.goodput.min_gap_seconds = 60; }},
      {"spike_replay", "judge_after_steps", "80",
       [](HealthConfig& c) { c.timing.spike_replay.judge_after_steps = 80; }},
      {"spike_replay", "tolerance_steps", "5",
       [](HealthConfig& c) { c.timing.spike_replay.tolerance_steps = 5; }},
      {"host_suspect", "window_seconds", "3600",
       [](HealthConfig& c) { c.host_suspect.window_seconds = 3600; }},
      {"host_suspect", "min_runs", "3", [](HealthConfig& c) { c.host_suspect.min_runs = 3; }},
      {"closed_loop", "mode", "auto",
       [](HealthConfig& c) { c.closed_loop.mode = ClosedLoopConfig::Mode::kAuto; }},
      {"closed_loop", "auto", "[checkpoint_now, skip, rollback]",
       [](HealthConfig& c) { c.closed_loop.auto_actions = {"checkpoint_now", "skip", "rollback"}; }},
      {"closed_loop", "max_rollbacks", "5",
       [](HealthConfig& c) { c.closed_loop.max_rollbacks = 5; }},
      {"closed_loop", "min_steps_between", "50",
       [](HealthConfig& c) { c.closed_loop.min_steps_between = 50; }},
      {"closed_loop", "lead_steps", "4", [](HealthConfig& c) { c.closed_loop.lead_steps = 4; }},
  };
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// `text` with the value of `group.key` replaced (its comment kept), or "" when
// the file has no such key: the shipped file is edited the way a user would.
std::string WithValue(const std::string& text, const Override& o) {
  std::istringstream in(text);
  std::string line, out, group;
  bool found = false;
  while (std::getline(in, line)) {
    const bool top = !line.empty() && line[0] != ' ' && line[0] != '#';
    if (top) {
      const size_t colon = line.find(':');
      const std::string name = line.substr(0, colon);
      const std::string rest =
          std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
      // A group header has nothing but a comment after its colon.
      group = rest.empty() || rest[0] == '#' ? name : "";
    }
    const std::string prefix =
        o.group.empty() ? o.key + ":" : "  " + o.key + ":";
    const bool in_place = o.group.empty() ? top : !top && group == o.group;
    if (in_place && absl::StartsWith(line, prefix)) {
      const size_t comment = line.find('#');
      line = absl::StrCat(prefix, " ", o.value, "  ",
                          comment == std::string::npos ? "" : line.substr(comment));
      found = true;
    }
    out += line + "\n";
  }
  return found ? out : "";
}

TEST(HealthConfigFile, ShippedFileParsesToExactlyTheDefaults) {
  absl::StatusOr<HealthConfig> config = LoadHealthConfig(kShipped);
  ASSERT_TRUE(config.ok()) << config.status();
  ExpectSameConfig(*config, HealthConfig{});
}

TEST(HealthConfigFile, ShippedFileListsEveryKeyAndEachSetsItsField) {
  const std::string shipped = ReadFile(kShipped);
  for (const Override& o : AllOverrides()) {
    SCOPED_TRACE(o.group + "." + o.key);
    const std::string edited = WithValue(shipped, o);
    ASSERT_FALSE(edited.empty()) << "deploy/trainwatch.yaml lacks the key";
    absl::StatusOr<HealthConfig> config = ParseHealthConfig(edited, "edited.yaml");
    ASSERT_TRUE(config.ok()) << config.status();
    HealthConfig want;
    o.expect(want);
    ExpectSameConfig(*config, want);
  }
}

// The dotted keys of a config file ("window_steps", "clip_fraction.threshold").
std::set<std::string> DottedKeys(const std::string& text) {
  std::set<std::string> keys;
  for (const auto& top : YAML::Load(text)) {
    const std::string name = top.first.Scalar();
    if (top.second.IsMap()) {
      for (const auto& inner : top.second) keys.insert(name + "." + inner.first.Scalar());
    } else {
      keys.insert(name);
    }
  }
  return keys;
}

TEST(HealthConfigFile, PrintedConfigReadsBackToTheSameConfig) {
  // trainwatch-server --print-config: every key with its value.
  absl::StatusOr<HealthConfig> changed = ParseHealthConfig(
      "window_steps: 2000\ndisabled: [RunSilent, LossSpike]\n"
      "spike: {sigmas: 5.5}\nchange: {arl0: 123456.789}\n"
      "closed_loop: {mode: auto, auto: [rollback, skip], lead_steps: 3}\n",
      "t.yaml");
  ASSERT_TRUE(changed.ok()) << changed.status();
  for (const HealthConfig& config : {HealthConfig{}, *changed}) {
    const std::string printed = PrintHealthConfig(config);
    absl::StatusOr<HealthConfig> back = ParseHealthConfig(printed, "printed.yaml");
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << printed;
    ExpectSameConfig(*back, config);
    EXPECT_EQ(PrintHealthConfig(*back), printed);
  }
}

TEST(HealthConfigFile, PrintedKeysAreTheShippedFilesKeys) {
  EXPECT_EQ(DottedKeys(PrintHealthConfig(HealthConfig{})), DottedKeys(ReadFile(kShipped)))
      << "deploy/trainwatch.yaml and trainwatch-server --print-config list other keys";
}

// Every key --print-config prints is one the parser sets: each numeric key
// given another valid value changes that key's printed line and no other.
TEST(HealthConfigFile, EveryPrintedKeyIsSetAndReadBack) {
  const std::string defaults = PrintHealthConfig(HealthConfig{});
  const auto lines = [](const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  };
  const std::vector<std::string> base = lines(defaults);
  // The printed lines of `c` that differ from the defaults' (same count).
  const auto changed_lines = [&](const HealthConfig& c) {
    const std::vector<std::string> got = lines(PrintHealthConfig(c));
    EXPECT_EQ(got.size(), base.size());
    std::vector<std::string> out;
    for (size_t i = 0; i < got.size() && i < base.size(); ++i) {
      if (got[i] != base[i]) out.push_back(got[i]);
    }
    return out;
  };
  size_t numeric = 0, bools = 0;
  for (const auto& top : YAML::Load(defaults)) {
    const std::string group = top.first.Scalar();
    if (!top.second.IsMap()) continue;  // the top-level keys: below
    for (const auto& inner : top.second) {
      const std::string key = inner.first.Scalar();
      if (!inner.second.IsScalar() || key == "mode") continue;  // words and lists
      SCOPED_TRACE(group + "." + key);
      const std::string& scalar = inner.second.Scalar();
      if (scalar == "true" || scalar == "false") {  // a bool: its other value
        const std::string other = scalar == "true" ? "false" : "true";
        absl::StatusOr<HealthConfig> c = ParseHealthConfig(
            absl::StrFormat("%s:\n  %s: %s\n", group, key, other), "one.yaml");
        ASSERT_TRUE(c.ok()) << c.status();
        EXPECT_THAT(changed_lines(*c), ElementsAre(absl::StrCat("  ", key, ": ", other)));
        ++bools;
        continue;
      }
      const double d = inner.second.as<double>();
      bool set = false;
      for (double v : {d + 1, d * 2, d / 2, d + 0.5, 0.5, 2.0, 0.0}) {
        if (v == d) continue;
        absl::StatusOr<HealthConfig> c = ParseHealthConfig(
            absl::StrFormat("%s:\n  %s: %.17g\n", group, key, v), "one.yaml");
        if (!c.ok()) continue;  // out of its range: try another
        const std::vector<std::string> changed = changed_lines(*c);
        ASSERT_EQ(changed.size(), 1u) << "set to " << v;
        const std::string prefix = absl::StrCat("  ", key, ": ");
        ASSERT_TRUE(absl::StartsWith(changed[0], prefix)) << changed[0];
        EXPECT_EQ(std::stod(changed[0].substr(prefix.size())), v) << changed[0];
        set = true;
        break;
      }
      EXPECT_TRUE(set) << "no value of the key was accepted";
      ++numeric;
    }
  }
  EXPECT_GT(numeric, 100u);
  EXPECT_EQ(bools, 2u);  // hazard.enabled, hazard.use_update_ratio
  absl::StatusOr<HealthConfig> top =
      ParseHealthConfig("window_steps: 500\nresolve_after_steps: 7\n", "top.yaml");
  ASSERT_TRUE(top.ok()) << top.status();
  EXPECT_THAT(PrintHealthConfig(*top), ::testing::StartsWith("window_steps: 500\n"
                                                             "resolve_after_steps: 7\n"));
}

// A config other than the defaults in keys of both tiers, words and lists.
HealthConfig Changed() {
  absl::StatusOr<HealthConfig> changed = ParseHealthConfig(
      "window_steps: 2000\ndisabled: [RunSilent, LossSpike]\n"
      "spike: {sigmas: 5.5}\nchange: {arl0: 123456.789}\nhazard: {use_update_ratio: false}\n"
      "closed_loop: {mode: auto, auto: [rollback, skip], lead_steps: 3}\n",
      "t.yaml");
  EXPECT_TRUE(changed.ok()) << changed.status();
  return changed.value_or(HealthConfig{});
}

// trainwatch-server --print-config documented: the same keys as the values,
// each with what it sets, and read back to the same config.
TEST(HealthConfigFile, DocumentedConfigReadsBackToTheSameConfig) {
  for (const HealthConfig& config : {HealthConfig{}, Changed()}) {
    const std::string documented = PrintHealthConfigDocumented(config, /*internals=*/true);
    absl::StatusOr<HealthConfig> back = ParseHealthConfig(documented, "documented.yaml");
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << documented;
    ExpectSameConfig(*back, config);
    EXPECT_EQ(DottedKeys(documented), DottedKeys(PrintHealthConfig(config)));
    EXPECT_THAT(documented, StartsWith("# BEGIN generated by `trainwatch-server --print-config "
                                       "documented`"));
    EXPECT_TRUE(absl::EndsWith(documented, "\n# END generated\n"));
  }
}

// Every group line and key line of the documented file says what it is for,
// and each group lists its tuned keys before the "# internals:" line.
TEST(HealthConfigFile, EveryKeyAndGroupIsDocumented) {
  std::istringstream in(PrintHealthConfigDocumented(HealthConfig{}, /*internals=*/true));
  size_t keys = 0, groups = 0, internals = 0, internal_keys = 0;
  bool in_internals = false;
  for (std::string line; std::getline(in, line);) {
    const std::string code(absl::StripLeadingAsciiWhitespace(line));
    if (code.empty() || code[0] == '#') {
      if (code == "# internals:") ++internals, in_internals = true;
      continue;
    }
    SCOPED_TRACE(line);
    const size_t comment = line.find(" # ");
    ASSERT_NE(comment, std::string::npos) << "no doc";
    EXPECT_GT(line.size(), comment + 4) << "an empty doc";
    const std::string before(absl::StripTrailingAsciiWhitespace(line.substr(0, comment)));
    if (line[0] != ' ' && absl::EndsWith(before, ":")) {  // a group's line
      ++groups;
      in_internals = false;
    } else {
      ++keys;
      if (in_internals) ++internal_keys;
    }
  }
  EXPECT_EQ(keys, DottedKeys(PrintHealthConfig(HealthConfig{})).size());
  EXPECT_GT(groups, 25u);
  EXPECT_GT(internals, 15u);  // the groups with internals
  // The keys under a group's "# internals:" line are exactly those the
  // tuned file leaves out: a tuned key is never listed after it.
  const size_t tuned =
      DottedKeys(PrintHealthConfigDocumented(HealthConfig{}, /*internals=*/false)).size();
  EXPECT_EQ(internal_keys, keys - tuned);
}

// --print-config tuned: the keys a user tunes first, and an internal key
// only where it is not its default; it reads back to the same config too.
TEST(HealthConfigFile, TunedConfigIsShortAndReadsBack) {
  const std::string defaults = PrintHealthConfigDocumented(HealthConfig{}, /*internals=*/false);
  const std::set<std::string> keys = DottedKeys(defaults);
  EXPECT_TRUE(keys.contains("window_steps") && keys.contains("clip_fraction.threshold") &&
              keys.contains("spike.sigmas") && keys.contains("disabled") &&
              keys.contains("closed_loop.mode"));
  EXPECT_FALSE(keys.contains("change.arl0") || keys.contains("spike.ema_beta") ||
               keys.contains("ranks.max_pending_values"));
  EXPECT_THAT(defaults, Not(HasSubstr("# internals:")));
  EXPECT_LT(keys.size(), DottedKeys(PrintHealthConfig(HealthConfig{})).size() * 2 / 3);
  EXPECT_GT(keys.size(), 40u);
  for (const HealthConfig& config : {HealthConfig{}, Changed()}) {
    const std::string tuned = PrintHealthConfigDocumented(config, /*internals=*/false);
    absl::StatusOr<HealthConfig> back = ParseHealthConfig(tuned, "tuned.yaml");
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << tuned;
    ExpectSameConfig(*back, config);
  }
  const std::string changed = PrintHealthConfigDocumented(Changed(), /*internals=*/false);
  EXPECT_THAT(changed, HasSubstr("  # internals:\n  arl0: 123456.789 "));
  EXPECT_THAT(changed, HasSubstr("  use_update_ratio: false "));
  EXPECT_THAT(changed, Not(HasSubstr("ema_beta")));
}

// docs/config.md's table: one row per key, with its default, range and tier.
TEST(HealthConfigFile, TableHasEveryKeyWithItsDefaultRangeAndTier) {
  const std::string table = PrintHealthConfigTable();
  std::set<std::string> rows;
  size_t tuned = 0, internal = 0;
  std::istringstream in(table);
  for (std::string line; std::getline(in, line);) {
    const std::vector<std::string> cells = absl::StrSplit(line, " | ");
    if (cells.size() != 5 || (cells[3] != "tuned" && cells[3] != "internal")) continue;
    ++(cells[3] == "tuned" ? tuned : internal);
    rows.emplace(absl::StripSuffix(absl::StripPrefix(cells[0], "| `"), "`"));
  }
  EXPECT_EQ(rows, DottedKeys(PrintHealthConfig(HealthConfig{})));
  EXPECT_EQ(tuned + internal, rows.size());
  EXPECT_GT(tuned, 40u);
  EXPECT_GT(internal, 40u);
  EXPECT_THAT(table, HasSubstr("| `clip_fraction.threshold` | 0.05 | in (0, 1] | tuned | "));
  EXPECT_THAT(table, HasSubstr("| `change.arl0` | 1e+06 | > 1 | internal | "));
  EXPECT_THAT(table, HasSubstr("| `log_z.nats` | 5 | > 0 | tuned | \\|log Z's level"));
}

TEST(HealthConfigFile, PrintAsNamesEachForm) {
  const HealthConfig c = Changed();
  EXPECT_EQ(PrintHealthConfigAs("values", c), PrintHealthConfig(c));
  EXPECT_EQ(PrintHealthConfigAs("documented", c), PrintHealthConfigDocumented(c, true));
  EXPECT_EQ(PrintHealthConfigAs("tuned", c), PrintHealthConfigDocumented(c, false));
  EXPECT_EQ(PrintHealthConfigAs("docs", c), PrintHealthConfigTable());
  EXPECT_EQ(PrintHealthConfigAs("yaml", c), std::nullopt);
  EXPECT_EQ(PrintHealthConfigAs("", c), std::nullopt);
}

TEST(HealthConfigFile, BoolsAreTrueOrFalse) {
  for (const char* on : {"true", "1"}) {
    absl::StatusOr<HealthConfig> c =
        ParseHealthConfig(absl::StrCat("hazard:\n  enabled: ", on, "\n"), "b.yaml");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(c->hazard.enabled);
  }
  absl::StatusOr<HealthConfig> off = ParseHealthConfig("hazard:\n  use_update_ratio: false\n", "b.yaml");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->hazard.use_update_ratio);
  EXPECT_THAT(PrintHealthConfig(HealthConfig{}), HasSubstr("  enabled: false\n"));
  absl::StatusOr<HealthConfig> bad = ParseHealthConfig("hazard:\n  enabled: 2\n", "b.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(),
              HasSubstr("b.yaml:2: hazard.enabled: expected true or false, got '2'"));
}

TEST(HealthConfigFile, OverridesChangeOnlyTheirKeys) {
  absl::StatusOr<HealthConfig> config = ParseHealthConfig(
      "window_steps: 2000\n"
      "disabled:\n"
      "  - RunSilent\n"
      "clip_fraction:\n"
      "  threshold: 0.1\n"
      "spike: {sigmas: 5, ema_beta: 0.995}\n",
      "t.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  HealthConfig want;
  want.window_steps = 2000;
  want.disabled = {"RunSilent"};
  want.clip_fraction.threshold = 0.1;
  want.spike.sigmas = 5;
  want.spike.ema_beta = 0.995;
  ExpectSameConfig(*config, want);
}

TEST(HealthConfigFile, EmptyOrCommentedOutTextGivesDefaults) {
  for (const char* text : {"", "# nothing here\n", "spike:\n  # sigmas: 3\n",
                           "disabled: []\n"}) {
    absl::StatusOr<HealthConfig> config = ParseHealthConfig(text, "t.yaml");
    ASSERT_TRUE(config.ok()) << text << ": " << config.status();
    ExpectSameConfig(*config, HealthConfig{});
  }
}

// The message of a parse that must fail.
std::string ErrorOf(const std::string& text) {
  absl::StatusOr<HealthConfig> config = ParseHealthConfig(text, "trainwatch.yaml");
  EXPECT_FALSE(config.ok()) << "accepted:\n" << text;
  if (config.ok()) return "";
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(config.status().message());
}

TEST(HealthConfigFile, UnknownKeyIsNamedWithItsLine) {
  EXPECT_THAT(ErrorOf("window_steps: 1000\n"
                      "clip_fraction:\n"
                      "  threshold: 0.05\n"
                      "  treshold: 0.1\n"),
              StartsWith("trainwatch.yaml:4: unknown key "
                         "'clip_fraction.treshold' (clip_fraction has: "
                         "threshold, min_steps, recent_steps, baseline_steps, "
                         "rise_ratio, settle_steps)"));
  EXPECT_THAT(ErrorOf("\nwindow_step: 1000\n"),
              StartsWith("trainwatch.yaml:2: unknown key 'window_step' (known: "
                         "window_steps,"));
  // A key of one group put in another.
  EXPECT_THAT(ErrorOf("drift:\n  sigmas: 4\n"),
              StartsWith("trainwatch.yaml:2: unknown key 'drift.sigmas'"));
}

TEST(HealthConfigFile, WrongTypeIsNamedWithItsLine) {
  EXPECT_EQ(ErrorOf("window_steps: 1000.5\n"),
            "trainwatch.yaml:1: window_steps: expected an integer, got '1000.5'");
  EXPECT_EQ(ErrorOf("spike:\n  min_ratio: 5\n  sigmas: six\n"),
            "trainwatch.yaml:3: spike.sigmas: expected a number, got 'six'");
  EXPECT_EQ(ErrorOf("spike:\n  sigmas: \"6\"\n"),
            "trainwatch.yaml:2: spike.sigmas: expected a number, got a string");
  EXPECT_EQ(ErrorOf("drift:\n  ratio: [2, 3]\n"),
            "trainwatch.yaml:2: drift.ratio: expected a number, got a list");
  EXPECT_EQ(ErrorOf("log_z:\n  nats: .nan\n"),
            "trainwatch.yaml:2: log_z.nats: expected a number, got '.nan'");
  EXPECT_EQ(ErrorOf("# groups are maps\nclip_fraction: 0.05\n"),
            "trainwatch.yaml:2: clip_fraction: expected a map of settings, "
            "got a scalar");
  EXPECT_EQ(ErrorOf("disabled: RunSilent\n"),
            "trainwatch.yaml:1: disabled: expected a list of alertnames, got a "
            "scalar");
  EXPECT_EQ(ErrorOf("resolve_after_steps:\n"),
            "trainwatch.yaml:1: resolve_after_steps: expected an integer, got "
            "nothing");
  EXPECT_THAT(ErrorOf("- window_steps\n"),
              HasSubstr("expected a map of settings at the top level, got a list"));
}

TEST(HealthConfigFile, OutOfRangeValueIsNamedWithItsLine) {
  EXPECT_EQ(ErrorOf("clip_fraction:\n  threshold: 1.5\n"),
            "trainwatch.yaml:2: clip_fraction.threshold must be in (0, 1], got 1.5");
  EXPECT_EQ(ErrorOf("clip_fraction:\n  threshold: 0\n"),
            "trainwatch.yaml:2: clip_fraction.threshold must be in (0, 1], got 0");
  EXPECT_EQ(ErrorOf("window_steps: 5\n"),
            "trainwatch.yaml:1: window_steps must be an integer in [10, "
            "1000000], got 5");
  EXPECT_EQ(ErrorOf("scaler_stuck:\n  consecutive: 0\n"),
            "trainwatch.yaml:2: scaler_stuck.consecutive must be an integer >= "
            "1, got 0");
  EXPECT_EQ(ErrorOf("loss_scale:\n  halvings: -2\n"),
            "trainwatch.yaml:2: loss_scale.halvings must be an integer >= 1, got -2");
  EXPECT_EQ(ErrorOf("spike:\n  ema_beta: 1\n"),
            "trainwatch.yaml:2: spike.ema_beta must be in (0, 1), got 1");
  EXPECT_EQ(ErrorOf("attention:\n  ratio: 0.5\n"),
            "trainwatch.yaml:2: attention.ratio must be > 1, got 0.5");
  EXPECT_EQ(ErrorOf("log_z:\n  nats: -1\n"),
            "trainwatch.yaml:2: log_z.nats must be > 0, got -1");
  EXPECT_EQ(ErrorOf("resolve_after_steps: 99999999999\n"),
            "trainwatch.yaml:1: resolve_after_steps must be an integer >= 1, got "
            "99999999999");
}

TEST(HealthConfigFile, MinStepsBeyondTheWindowIsRefused) {
  EXPECT_EQ(ErrorOf("window_steps: 100\nskip_rate:\n  min_steps: 200\n"),
            "trainwatch.yaml:3: skip_rate.min_steps (200) exceeds window_steps "
            "(100): the alert could never fire");
  EXPECT_EQ(ErrorOf("\nwindow_steps: 50\n"),
            "trainwatch.yaml:2: clip_fraction.min_steps (100) exceeds "
            "window_steps (50): the alert could never fire");
}

TEST(HealthConfigFile, UnknownAlertnameIsNamedWithItsLine) {
  EXPECT_THAT(ErrorOf("disabled:\n  - RunSilent\n  - ClipFractionHi\n"),
              StartsWith("trainwatch.yaml:3: disabled: unknown alertname "
                         "'ClipFractionHi' (known: ClipFractionHigh, "));
  EXPECT_THAT(ErrorOf("disabled: [RunSilent, runsilent]\n"),
              StartsWith("trainwatch.yaml:1: disabled: unknown alertname "
                         "'runsilent'"));
}

TEST(HealthConfigFile, EveryCatalogAlertCanBeDisabled) {
  std::string text = "disabled:\n";
  std::set<std::string> want;
  for (const AlertSpec& spec : AllAlertSpecs()) {
    absl::StrAppend(&text, "  - ", std::string(spec.name), "\n");
    want.emplace(spec.name);
  }
  absl::StatusOr<HealthConfig> config = ParseHealthConfig(text, "t.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->disabled, want);
}

TEST(HealthConfigFile, DuplicateKeyIsRefused) {
  EXPECT_EQ(ErrorOf("spike:\n  sigmas: 5\n  sigmas: 7\n"),
            "trainwatch.yaml:3: duplicate key 'spike.sigmas' (first at line 2)");
  EXPECT_EQ(ErrorOf("spike: {sigmas: 5}\nwindow_steps: 10\nspike: {}\n"),
            "trainwatch.yaml:3: duplicate key 'spike' (first at line 1)");
}

TEST(HealthConfigFile, YamlSyntaxErrorHasItsLine) {
  EXPECT_THAT(ErrorOf("window_steps: 1000\nspike:\n  sigmas: [5\n"),
              StartsWith("trainwatch.yaml:"));
  EXPECT_THAT(ErrorOf("a: b: c\n"), StartsWith("trainwatch.yaml:1: "));
}

TEST(HealthConfigFile, MissingFileIsNotFound) {
  absl::StatusOr<HealthConfig> config = LoadHealthConfig("/nonexistent/tw.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(config.status().message(), HasSubstr("/nonexistent/tw.yaml"));
}

}  // namespace
}  // namespace trainwatch
