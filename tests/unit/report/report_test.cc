// Tests of the HTML report (client/report/report.cc): the verdict's words,
// that the page is self-contained, that a 1M-step run is downsampled without
// losing its spike, and that it charts the server's figures (its window
// quantile, its W, its threshold), and the MoE load heatmap's data (exact
// shares, columns, the row and cell caps of a large run). The page drawn in
// a real browser: tests/import.
#include <algorithm>
#include <cmath>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "health/signals/window.h"
#include "report/columns.h"
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

// One MoE layer's counts on a record.
void AddMoeLayer(v1::StepRecord& r, const std::string& name,
                 const std::vector<uint64_t>& counts) {
  v1::MoeLayerStats* l = r.mutable_moe()->add_layers();
  l->set_layer(name);
  for (uint64_t c : counts) l->add_tokens_per_expert(c);
}

std::vector<std::vector<nlohmann::json>> Loads(const nlohmann::json& layer) {
  return layer["load"].get<std::vector<std::vector<nlohmann::json>>>();
}

// Hard batches are marked on the loss chart and listed apart from the
// spikes, newest first, with their peak and batch ids.
TEST(RenderReport, HardBatchesAreMarkedOnTheLossAndListedApart) {
  ReportInput in = MakeRun(300, 150);
  for (uint64_t step : {120, 240}) {
    v1::HardBatch* b = in.health.add_hard_batches();
    b->set_step(step);
    b->set_high_steps(step == 120 ? 1 : 2);
    b->set_peak(1.84);
    b->set_level(3.0);
    b->set_peak_is_ratio(true);
    b->add_batch_ids(static_cast<int64_t>(step) * 10);
  }
  const std::string html = RenderReport(in);
  const nlohmann::json data = ReportData(html);
  bool found = false;
  for (const auto& chart : data["charts"]) {
    if (chart["id"] != "loss") continue;
    found = true;
    EXPECT_EQ(chart["marks"]["name"], "hard batch");
    ASSERT_EQ(chart["marks"]["x"].size(), 2u);
    EXPECT_EQ(chart["marks"]["x"][0], 120);
    EXPECT_EQ(chart["marks"]["x"][1], 240);
  }
  EXPECT_TRUE(found);
  EXPECT_THAT(html, HasSubstr("<h3>Hard batches</h3>"));
  // Newest first: 240 before 120.
  const size_t newest = html.find("class=\"hard-batch\" data-step=\"240\"");
  const size_t oldest = html.find("class=\"hard-batch\" data-step=\"120\"");
  ASSERT_NE(newest, std::string::npos);
  ASSERT_NE(oldest, std::string::npos);
  EXPECT_LT(newest, oldest);
  EXPECT_THAT(html, HasSubstr("<td>1.84x the level 3</td><td>2400</td>"));
  // A run without hard batches has no such table.
  EXPECT_THAT(RenderReport(MakeRun(300, 150)), Not(HasSubstr("Hard batches")));
}

TEST(RenderReportMoe, EachCellIsTheExpertsShareAgainstAnEvenShare) {
  ReportInput in = MakeRun(10, 0);
  for (v1::StepRecord& r : in.records) {
    AddMoeLayer(r, "0", {10, 20, 30, 40});
    // Layer 1 sends no counts at step 4; at the others, experts 0 and 3 get
    // nothing and the last step's one assignment of expert 3 is not rounded
    // to dead.
    if (r.step() == 4) continue;
    if (r.step() == 10) {
      AddMoeLayer(r, "1", {0, 5000, 4999, 1});
    } else {
      AddMoeLayer(r, "1", {0, 50, 50, 0});
    }
  }
  const nlohmann::json data = ReportData(RenderReport(in));
  ASSERT_TRUE(data.contains("moe"));
  const nlohmann::json& moe = data["moe"];
  // Ten steps: one column each.
  EXPECT_EQ(moe["x"], nlohmann::json({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  ASSERT_EQ(moe["layers"].size(), 2u);
  const nlohmann::json& l0 = moe["layers"][0];
  EXPECT_EQ(l0["layer"], "0");
  EXPECT_EQ(l0["experts"], 4);
  EXPECT_EQ(l0["rows"], nlohmann::json({0, 1, 2, 3}));
  // 10/100 of the assignments against 1/4: 40% of an even share.
  const std::vector<int> want0 = {40, 80, 120, 160};
  for (size_t e = 0; e < 4; ++e) {
    EXPECT_EQ(Loads(l0)[e], std::vector<nlohmann::json>(10, want0[e])) << e;
  }
  const auto l1 = Loads(moe["layers"][1]);
  EXPECT_EQ(l1[0][0], 0);
  EXPECT_EQ(l1[1][0], 200);
  EXPECT_TRUE(l1[1][3].is_null());  // no counts at step 4
  EXPECT_EQ(l1[0][9], 0);
  EXPECT_EQ(l1[1][9], 200);
  EXPECT_EQ(l1[2][9], 200);
  EXPECT_EQ(l1[3][9], 1);  // 1/10000 x 4 rounds to 0, but it is not dead
}

TEST(RenderReportMoe, ColumnsSumTheirStepsLikeTheCharts) {
  constexpr uint64_t kSteps = 10'000;
  ReportInput in = MakeRun(kSteps, 0);
  for (v1::StepRecord& r : in.records) {
    // Expert 0 takes 3 of 10 assignments, then none from step 5021.
    AddMoeLayer(r, "0", {r.step() <= 5020 ? 3u : 0u, 1, 1, 1, 1, 1, 1, 1});
  }
  const nlohmann::json moe = ReportData(RenderReport(in))["moe"];
  // Eight rows are far under the cell budget: the column cap holds.
  ASSERT_EQ(moe["x"].size(), kMoeHeatmapColumns);
  const Downsampler ds(1, kSteps, kMoeHeatmapColumns);
  for (size_t c = 0; c < kMoeHeatmapColumns; ++c) {
    const uint64_t x = moe["x"][c].get<uint64_t>();
    EXPECT_EQ(ds.Column(x), c);
    if (x > 1) {
      EXPECT_EQ(ds.Column(x - 1), c - 1);  // each x is its column's first step
    }
  }
  const auto loads = Loads(moe["layers"][0]);
  EXPECT_EQ(loads[0].front(), 240);  // 3/10 against 1/8
  EXPECT_EQ(loads[1].front(), 80);
  EXPECT_EQ(loads[0].back(), 0);
  EXPECT_EQ(loads[1].back(), 114);  // 1/7 against 1/8
  // The column holding steps 5020 and 5021 sums both halves.
  const size_t mixed = ds.Column(5020);
  ASSERT_EQ(ds.Column(5021), mixed);
  uint64_t mine = 0, all = 0;
  for (uint64_t s = moe["x"][mixed].get<uint64_t>();
       s < moe["x"][mixed + 1].get<uint64_t>(); ++s) {
    mine += s <= 5020 ? 3 : 0;
    all += s <= 5020 ? 10 : 7;
  }
  EXPECT_EQ(loads[0][mixed], std::llround(800.0 * mine / all));
}

TEST(RenderReportMoe, ARunWithoutCountsHasNoHeatmapAndKeepsItsAlertsOnTheNorm) {
  ReportInput in = MakeRun(100, 0);
  // An import with aggregates only: an aux loss, no tokens_per_expert.
  for (v1::StepRecord& r : in.records) {
    v1::MoeLayerStats* l = r.mutable_moe()->add_layers();
    l->set_layer("all");
    l->set_aux_loss(1.4);
  }
  v1::Alert a;
  a.set_alertname("MoeAuxLossOffBalance");
  a.set_severity(v1::SEVERITY_WARNING);
  a.set_started_step(60);
  in.alerts.push_back(a);
  const std::string html = RenderReport(in);
  const nlohmann::json data = ReportData(html);
  EXPECT_FALSE(data.contains("moe"));
  EXPECT_THAT(html, Not(HasSubstr("id=\"moe-heatmap\"")));
  EXPECT_EQ(data["charts"][0]["id"], "grad_norm");
  EXPECT_EQ(data["charts"][0]["alerts"], nlohmann::json({"MoeAuxLossOffBalance"}));
  // With counts, the Moe alert goes over the heatmap instead.
  for (v1::StepRecord& r : in.records) AddMoeLayer(r, "0", {1, 1});
  const std::string moe_html = RenderReport(in);
  const nlohmann::json moe_data = ReportData(moe_html);
  EXPECT_THAT(moe_html, HasSubstr("id=\"moe-heatmap\""));
  EXPECT_EQ(moe_data["moe"]["alerts"], nlohmann::json({"MoeAuxLossOffBalance"}));
  EXPECT_EQ(moe_data["charts"][0]["alerts"], nlohmann::json::array());
}

TEST(RenderReportMoe, LargeRunDrawsTheOddExpertsWithinTheCellBudget) {
  // 48 layers x 128 experts over 500 steps; in layer 7, expert 100 is
  // dead and expert 5 takes 4x its share.
  constexpr int kLayers = 48, kExperts = 128;
  ReportInput in = MakeRun(500, 0);
  const size_t plain = RenderReport(in).size();
  for (v1::StepRecord& r : in.records) {
    for (int layer = 0; layer < kLayers; ++layer) {
      std::vector<uint64_t> counts(kExperts);
      for (int e = 0; e < kExperts; ++e) {
        counts[e] = 900 + (r.step() * 31 + e * 17 + layer) % 200;
      }
      if (layer == 7) {
        counts[100] = 0;
        counts[5] = 4000;
      }
      AddMoeLayer(r, std::to_string(layer), counts);
    }
  }
  const std::string html = RenderReport(in);
  const nlohmann::json moe = ReportData(html)["moe"];
  ASSERT_EQ(moe["layers"].size(), 48u);
  const size_t columns = moe["x"].size();
  EXPECT_EQ(columns, kMoeHeatmapCells / (48 * kMoeExpertRows));
  size_t cells = 0;
  for (const auto& layer : moe["layers"]) {
    EXPECT_EQ(layer["experts"], kExperts);
    EXPECT_EQ(layer["rows"].size(), kMoeExpertRows);
    for (const auto& row : layer["load"]) cells += row.size();
  }
  EXPECT_LE(cells, kMoeHeatmapCells);
  const nlohmann::json& l7 = moe["layers"][7];
  const std::vector<int> rows = l7["rows"].get<std::vector<int>>();
  const auto dead = std::find(rows.begin(), rows.end(), 100);
  const auto hot = std::find(rows.begin(), rows.end(), 5);
  ASSERT_NE(dead, rows.end());
  ASSERT_NE(hot, rows.end());
  EXPECT_EQ(Loads(l7)[dead - rows.begin()], std::vector<nlohmann::json>(columns, 0));
  EXPECT_GT(Loads(l7)[hot - rows.begin()][0].get<int>(), 300);
  // The heatmap adds about 4 bytes a cell to the page: 226 kB measured
  // (the whole page 274 kB).
  EXPECT_LT(html.size() - plain, 300'000u) << html.size() - plain;
}

}  // namespace
}  // namespace trainwatch::cli
