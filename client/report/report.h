// `trainwatchctl report`: one self-contained HTML page about a run, readable
// offline (docs/import-and-report.md). The verdict comes first, in plain
// words; then charts over steps with the alerts shaded; then the spikes with
// their batch ids and restart plans. An MoE run also gets a heatmap of each
// layer's load per expert over the run, its Moe* alerts marked above it.
//
// The page carries its data as JSON and draws the charts as SVG with its own
// script (report/report.js, embedded in the binary at build time): no CDN,
// no network. Series are downsampled to at most kReportColumns columns of
// min/max, so a spike stays visible in a 1M-step run and the file stays
// small.
#ifndef TRAINWATCH_CLIENT_REPORT_REPORT_H_
#define TRAINWATCH_CLIENT_REPORT_REPORT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch::cli {

inline constexpr size_t kReportColumns = 2000;

// The MoE load heatmap (runs whose records carry tokens_per_expert): at most
// this many experts drawn per layer, the ones furthest from an even share;
// at most this many columns of steps, fewer when the layers x rows would
// pass the cell budget, which keeps a 48-layer x 128-expert run's page small.
inline constexpr size_t kMoeExpertRows = 16;
inline constexpr size_t kMoeHeatmapColumns = 240;
inline constexpr size_t kMoeHeatmapCells = 60'000;

// A section another part adds to the report (goodput, stragglers): a title
// and its HTML body, placed after the charts.
struct ReportSection {
  std::string id;     // the section element's id
  std::string title;  // plain text
  std::string html;   // trusted HTML, written by trainwatch
};

// What the report is made of; the records are the lead rank's (lowest),
// latest attempt winning per step, in any order.
struct ReportInput {
  v1::GetRunHealthResponse health;
  std::vector<v1::Alert> alerts;  // every alert of the run, any state
  std::vector<v1::StepRecord> records;
  // Rolling window of the p50/p90/p99 and clip-fraction curves when the
  // health does not say (health.window().window_size(), the server's W).
  size_t window = 1000;
  // The loss against the run's baselines (CompareRuns, metric loss): the
  // band is drawn under the loss curve. No bins: no baselines.
  v1::CompareRunsResponse baseline;
  // Hook for later sections (goodput, stragglers): rendered in order.
  std::vector<ReportSection> extra_sections;
};

// The page. Deterministic for a given input.
std::string RenderReport(const ReportInput& input);

// The verdict sentence block, as plain text lines (also used by tests):
// what is wrong, since when, what to do.
std::vector<std::string> ReportVerdict(const ReportInput& input);

// `text` with &, <, >, " and ' escaped for HTML.
std::string HtmlEscape(absl::string_view text);

// Embedded assets (generated from report/report.css and report.js).
extern const char kReportCSS[];
extern const char kReportJS[];

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLIENT_REPORT_REPORT_H_
