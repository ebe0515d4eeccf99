// Tests of the HTML report (client/report/report.cc): the verdict's words,
// that the page is self-contained, that a 1M-step run is downsampled without
// losing its spike, and that it charts the server's figures (its window
// quantile, its W, its threshold). The page drawn in a real browser:
// tests/import.
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "health/signals/window.h"
#include "report/report.h"

namespace trainwatch::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

ReportInput MakeRun(uint64_t steps, uint64_t spike_at) {
  ReportInput in;
  v1::RunSummary* run = in.health.mutable_run();
  run->set_run_id("r<1>");
  run->set_max_norm(1.0);
  run->set_steps(steps);
  run->set_last_step(steps);
  in.records.reserve(steps);
  for (uint64_t s = 1; s <= steps; ++s) {
    v1::StepRecord r;
    r.set_step(s);
    r.set_grad_norm(s == spike_at ? 4321.0 : 0.5 + 0.1 * ((s * 7919) % 10) / 10);
    r.set_loss(3.0);
    in.records.push_back(std::move(r));
  }
  return in;
}

TEST(ReportVerdict, HealthySaysSo) {
  ReportInput in = MakeRun(100, 0);
  std::vector<std::string> lines = ReportVerdict(in);
  ASSERT_FALSE(lines.empty());
  EXPECT_THAT(lines[0], HasSubstr("No problem found"));
}

TEST(ReportVerdict, NamesTheProblemSinceWhenAndTheFix) {
  ReportInput in = MakeRun(100, 0);
  v1::Alert info;
  info.set_alertname("GradNormSpike");
  info.set_severity(v1::SEVERITY_INFO);
  in.alerts.push_back(info);
  v1::Alert a;
  a.set_alertname("ClipFractionHigh");
  a.set_severity(v1::SEVERITY_WARNING);
  a.set_state(v1::ALERT_STATE_FIRING);
  a.set_started_step(400);
  a.set_onset_step(350);
  a.set_summary("Clipping on 40% of steps");
  a.set_likely_cause("the threshold acts as a lower LR");
  a.set_fix("fix the LR or data upstream");
  in.alerts.push_back(a);
  (*in.health.mutable_run()->mutable_labels())["logged_every"] = "10";
  std::vector<std::string> lines = ReportVerdict(in);
  ASSERT_GE(lines.size(), 3u);
  EXPECT_THAT(lines[0], HasSubstr("Clipping on 40% of steps"));
  EXPECT_THAT(lines[0], HasSubstr("since step 400"));
  EXPECT_THAT(lines[0], HasSubstr("near step 350"));
  EXPECT_THAT(lines[0], HasSubstr("still firing"));
  EXPECT_THAT(lines[0], HasSubstr("What to do: fix the LR"));
  EXPECT_THAT(lines[1], HasSubstr("1x GradNormSpike"));
  EXPECT_THAT(lines[2], HasSubstr("logged every 10 steps"));
}

TEST(RenderReport, SelfContainedAndEscaped) {
  const std::string html = RenderReport(MakeRun(300, 150));
  // Nothing is fetched: no src/href to anything, no link or import.
  EXPECT_THAT(html, Not(HasSubstr("src=")));
  EXPECT_THAT(html, Not(HasSubstr("href=")));
  EXPECT_THAT(html, Not(HasSubstr("<link")));
  EXPECT_THAT(html, HasSubstr("Run r&lt;1&gt;"));
  for (const char* id : {"grad_norm", "clip_fraction", "loss_scale",
                         "max_attn_logit", "log_z", "loss", "lr"}) {
    EXPECT_THAT(html, HasSubstr(std::string("id=\"chart-") + id + "\""));
  }
  // The script and the data are inlined; the data cannot close its element.
  EXPECT_THAT(html, HasSubstr("data-charts-drawn"));
  const size_t data_at = html.find("id=\"tw-data\">");
  ASSERT_NE(data_at, std::string::npos);
  const size_t data_end = html.find("</script>", data_at);
  EXPECT_THAT(html.substr(data_at, data_end - data_at), Not(HasSubstr("r<1>")));
}

TEST(RenderReport, MillionStepsKeepTheSpikeInFewColumns) {
  const std::string html = RenderReport(MakeRun(1'000'000, 654'321));
  // The spike's value survives the min/max downsampling.
  EXPECT_THAT(html, HasSubstr("4321"));
  // Two thousand columns, not a million points: a few hundred KiB.
  EXPECT_LT(html.size(), 1'500'000u);
  EXPECT_THAT(html, HasSubstr("\"points\":1000000"));
}

// The data the page draws from: the JSON in <script id="tw-data">.
nlohmann::json ReportData(const std::string& html) {
  const std::string open = "id=\"tw-data\">";
  const size_t at = html.find(open);
  if (at == std::string::npos) return nullptr;
  const size_t begin = at + open.size();
  return nlohmann::json::parse(html.substr(begin, html.find("</script>", begin) - begin));
}

TEST(RenderReport, ChartsTheServersWindowQuantileWindowAndThreshold) {
  // Distinct norms, so that two definitions of a quantile disagree.
  ReportInput in = MakeRun(1500, 0);
  for (v1::StepRecord& r : in.records) {
    r.set_grad_norm(1.0 + static_cast<double>((r.step() * 7919) % 1500) * 1e-3);
  }
  in.window = 1000;  // overridden by what the server says:
  in.health.mutable_window()->set_window_size(400);
  in.health.mutable_window()->set_clip_fraction_threshold(0.1);
  const std::string html = RenderReport(in);
  const nlohmann::json data = ReportData(html);
  ASSERT_TRUE(data.is_object()) << "no tw-data";
  std::optional<double> last_p50, last_p90;
  for (const auto& chart : data["charts"]) {
    if (chart["id"] != "grad_norm") continue;
    for (const auto& line : chart["lines"]) {
      if (line["name"] == "p50 over W") last_p50 = line["y"].back().get<double>();
      if (line["name"] == "p90 over W") last_p90 = line["y"].back().get<double>();
    }
  }
  ASSERT_TRUE(last_p50.has_value() && last_p90.has_value());
  // The server's window over the same records, at the same W.
  ValueWindow server(400);
  for (const v1::StepRecord& r : in.records) server.Push(r.step(), r.grad_norm());
  EXPECT_EQ(*last_p50, *server.Quantile(0.5));
  EXPECT_EQ(*last_p90, *server.Quantile(0.9));
  EXPECT_THAT(html, HasSubstr("10% (ClipFractionHigh)"));
}

}  // namespace
}  // namespace trainwatch::cli
