#include "report/report.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "output/json_out.h"
#include "output/text_out.h"
#include "report/columns.h"
#include "report/moe_heatmap.h"
#include "trainwatch/v1/alert_names.h"
#include "trainwatch/v1/fp8_format.h"
#include "trainwatch/v1/quantile.h"

namespace trainwatch::cli {
namespace {

struct Line {
  std::string name;
  std::vector<uint64_t> x;
  std::vector<double> y;
};

struct HLine {
  std::string name;
  double y;
};

struct Chart {
  std::string id, title, note;
  bool log = false;
  std::optional<Columns> band;
  std::string band_name;
  std::vector<Line> lines;
  std::vector<HLine> hlines;
  std::string marks_name;
  std::vector<uint64_t> marks;
  std::vector<std::string> alerts;  // alert names shaded on this chart
  uint64_t points = 0;
};

// Which chart each alert is shaded on; the rest go on the norm chart.
const std::map<std::string, std::vector<std::string>>& AlertCharts() {
  static const auto* m = new std::map<std::string, std::vector<std::string>>{
      {"ClipFractionHigh", {"grad_norm", "clip_fraction"}},
      {"PostClipNormReported", {"grad_norm", "clip_fraction"}},
      {"ClipBeforeUnscale", {"grad_norm", "clip_fraction", "loss_scale"}},
      {"LossScaleCollapse", {"loss_scale"}},
      {"SkipRateHigh", {"loss_scale"}},
      {"ScalerStuck", {"loss_scale"}},
      {"Fp16WithoutScaler", {"loss_scale"}},
      {"AttentionLogitGrowth", {"max_attn_logit"}},
      {"LogZDrift", {"log_z"}},
      {"Fp8Overflow", {"fp8_scaled", "fp8_shares"}},
      {"Fp8Underflow", {"fp8_scaled", "fp8_shares"}},
      {"Fp8ScaleMismatch", {"fp8_scaled"}},
      {"Fp8AmaxDesync", {"fp8_scaled"}},
      {"Fp8AmaxGrowth", {"fp8_scaled"}},
      {"LossSpike", {"grad_norm", "loss"}},
      {"LossDivergence", {"loss"}},
      {"NonFiniteUpdate", {"grad_norm", "loss"}},
  };
  return *m;
}

// The MoE heatmap's id, as a chart's for the alert-to-chart mapping.
constexpr char kMoeHeatmapId[] = "moe_load";

// Moe* alerts are marked over the MoE heatmap when the run has one; without
// per-expert counts (an import with aggregates only) on the norm chart.
std::vector<std::string> ChartsOf(const std::string& alertname,
                                  bool moe_heatmap) {
  if (moe_heatmap && absl::StartsWith(alertname, "Moe")) {
    return {kMoeHeatmapId};
  }
  auto it = AlertCharts().find(alertname);
  if (it == AlertCharts().end()) return {"grad_norm"};
  return it->second;
}

// The names of the alerts marked on the chart `id`, each once.
std::vector<std::string> AlertsOn(absl::string_view id,
                                  const std::vector<v1::Alert>& alerts,
                                  bool moe_heatmap) {
  std::vector<std::string> names;
  for (const v1::Alert& a : alerts) {
    const std::vector<std::string> on = ChartsOf(a.alertname(), moe_heatmap);
    if (std::find(on.begin(), on.end(), id) != on.end() &&
        std::find(names.begin(), names.end(), a.alertname()) == names.end()) {
      names.push_back(a.alertname());
    }
  }
  return names;
}

bool Clipped(const v1::StepRecord& r, double max_norm) {
  if (r.has_clipped()) return r.clipped();
  return max_norm > 0 && r.grad_norm() > max_norm;
}

int SeverityRank(const v1::Alert& a) {
  if (a.severity() == v1::SEVERITY_CRITICAL) return 0;
  if (a.severity() == v1::SEVERITY_WARNING) return 1;
  return 2;
}

// "PREFIX text. " with one final period, or "" for empty text.
std::string Sentence(absl::string_view prefix, absl::string_view text) {
  while (!text.empty() && (text.back() == '.' || text.back() == ' ')) {
    text.remove_suffix(1);
  }
  if (text.empty()) return "";
  return absl::StrCat(prefix, text, ". ");
}

std::string AlertSpan(const v1::Alert& a) {
  if (a.onset_step() != 0 && a.onset_step() < a.started_step()) {
    return absl::StrCat("since step ", a.started_step(),
                        " (the change began near step ", a.onset_step(), ")");
  }
  return absl::StrCat("since step ", a.started_step());
}

void UintArray(JsonWriter& w, const std::vector<uint64_t>& xs) {
  w.BeginArray();
  for (uint64_t x : xs) w.Uint(x);
  w.EndArray();
}

void DoubleArray(JsonWriter& w, const std::vector<double>& vs) {
  w.BeginArray();
  for (double v : vs) w.Double(v);
  w.EndArray();
}

void WriteColumns(JsonWriter& w, const Columns& c) {
  w.Key("x");
  UintArray(w, c.x);
  w.Key("lo");
  DoubleArray(w, c.lo);
  w.Key("hi");
  DoubleArray(w, c.hi);
}

void WriteChart(JsonWriter& w, const Chart& chart) {
  w.BeginObject();
  w.Key("id");
  w.String(chart.id);
  w.Key("title");
  w.String(chart.title);
  w.Key("note");
  w.String(chart.note);
  w.Key("log");
  w.Bool(chart.log);
  w.Key("points");
  w.Uint(chart.points);
  if (chart.band.has_value()) {
    w.Key("band");
    w.BeginObject();
    w.Key("name");
    w.String(chart.band_name);
    WriteColumns(w, *chart.band);
    w.EndObject();
  }
  w.Key("lines");
  w.BeginArray();
  for (const Line& l : chart.lines) {
    w.BeginObject();
    w.Key("name");
    w.String(l.name);
    w.Key("x");
    UintArray(w, l.x);
    w.Key("y");
    DoubleArray(w, l.y);
    w.EndObject();
  }
  w.EndArray();
  w.Key("hlines");
  w.BeginArray();
  for (const HLine& h : chart.hlines) {
    w.BeginObject();
    w.Key("name");
    w.String(h.name);
    w.Key("y");
    w.Double(h.y);
    w.EndObject();
  }
  w.EndArray();
  w.Key("marks");
  w.BeginObject();
  w.Key("name");
  w.String(chart.marks_name);
  w.Key("x");
  UintArray(w, chart.marks);
  w.EndObject();
  w.Key("alerts");
  w.BeginArray();
  for (const std::string& a : chart.alerts) w.String(a);
  w.EndArray();
  w.EndObject();
}

// A simple chart of one optional field: min/max columns.
Chart FieldChart(std::string id, std::string title, bool log,
                 const std::vector<Point>& points, const Downsampler& ds) {
  Chart c{.id = std::move(id), .title = std::move(title), .log = log};
  c.band = ds.MinMax(points);
  c.band_name = c.title;
  c.points = c.band->points;
  if (c.points == 0) c.note = "not recorded for this run";
  return c;
}

// Tensors drawn on the FP8 chart: the ones that came closest to (or past)
// their format's max.
constexpr size_t kFp8Tensors = 4;

// FP8: the worst tensors' amax x scale / format max (1: the format max),
// and the worst tensor's overflow and underflow shares, per report.
std::vector<Chart> Fp8Charts(const std::vector<v1::StepRecord>& records,
                             const Downsampler& ds) {
  std::map<std::string, std::vector<Point>> scaled;
  std::vector<Point> over, under;
  for (const v1::StepRecord& r : records) {
    if (r.fp8().empty()) continue;
    std::optional<double> o, u;
    for (const auto& [name, f] : r.fp8()) {
      if (const std::optional<double> s = v1::ScaledAmax(f)) {
        scaled[name].push_back({r.step(), *s});
      }
      if (f.has_overflow_fraction()) o = std::max(o.value_or(0.0), f.overflow_fraction());
      if (f.has_underflow_fraction()) u = std::max(u.value_or(0.0), f.underflow_fraction());
    }
    if (o) over.push_back({r.step(), *o});
    if (u) under.push_back({r.step(), *u});
  }
  std::vector<std::pair<double, std::string>> worst;
  for (const auto& [name, points] : scaled) {
    double peak = 0.0;
    for (const Point& p : points) {
      if (std::isfinite(p.value)) peak = std::max(peak, p.value);
    }
    worst.emplace_back(peak, name);
  }
  std::sort(worst.begin(), worst.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  Chart sc{.id = "fp8_scaled", .title = "FP8: amax x scale / format max (worst tensors)",
           .log = true};
  for (size_t i = 0; i < worst.size() && i < kFp8Tensors; ++i) {
    const Columns c = ds.MinMax(scaled[worst[i].second]);
    sc.lines.push_back(Line{worst[i].second, c.x, c.hi});
    sc.points += c.points;
  }
  sc.hlines.push_back({"format max (above: saturates)", 1.0});
  if (sc.points == 0) sc.note = "no fp8 stats recorded for this run";
  Chart sh{.id = "fp8_shares", .title = "FP8: overflow and underflow shares (worst tensor)",
           .log = true};
  for (auto [name, points] : {std::pair{"overflow_fraction", &over},
                              std::pair{"underflow_fraction", &under}}) {
    const Columns c = ds.MinMax(*points);
    sh.lines.push_back(Line{name, c.x, c.hi});
    sh.points += c.points;
  }
  sh.hlines.push_back({"1e-4 (Fp8Overflow)", 1e-4});
  sh.hlines.push_back({"0.1 (Fp8Underflow)", 0.1});
  if (sh.points == 0) sh.note = "no fp8 overflow or underflow shares recorded for this run";
  return {std::move(sc), std::move(sh)};
}

std::vector<Chart> BuildCharts(const ReportInput& in,
                               const std::vector<v1::StepRecord>& records,
                               bool moe_heatmap) {
  const v1::RunSummary& run = in.health.run();
  const uint64_t first = records.empty() ? 0 : records.front().step();
  const uint64_t last = records.empty() ? 0 : records.back().step();
  const Downsampler ds(first, last, kReportColumns);

  std::vector<Point> norm, post_norm, loss, lr, scale, attn, logz;
  std::vector<uint64_t> skipped, nonfinite, post_steps;
  std::vector<uint8_t> post_clipped;
  for (const v1::StepRecord& r : records) {
    norm.push_back({r.step(), r.grad_norm()});
    if (!std::isfinite(r.grad_norm())) nonfinite.push_back(r.step());
    if (r.step() > run.warmup_steps() || run.warmup_steps() == 0) {
      post_norm.push_back({r.step(), r.grad_norm()});
      post_clipped.push_back(Clipped(r, run.max_norm()) ? 1 : 0);
    }
    if (r.skipped()) skipped.push_back(r.step());
    if (r.has_loss()) loss.push_back({r.step(), r.loss()});
    if (r.has_lr()) lr.push_back({r.step(), r.lr()});
    if (r.has_loss_scale()) scale.push_back({r.step(), r.loss_scale()});
    if (r.has_max_attn_logit()) {
      attn.push_back({r.step(), r.max_attn_logit()});
    }
    if (r.has_log_z()) logz.push_back({r.step(), r.log_z()});
  }

  std::vector<Chart> charts;
  // The server's W when it says, else the input's.
  const size_t w = in.health.window().window_size() > 0
                       ? in.health.window().window_size()
                       : in.window;
  // Pre-clip norm: min/max columns, rolling p50/p90/p99 over the last W
  // post-warmup records (as the server's window), the threshold and the
  // recommended one.
  Chart nc = FieldChart("grad_norm", "Pre-clip gradient norm", true, norm, ds);
  if (!post_norm.empty()) {
    Line p50{"p50 over W"}, p90{"p90 over W"}, p99{"p99 over W"};
    std::vector<double> window;
    for (size_t end : ds.ColumnEnds(post_norm)) {
      window.clear();
      const size_t begin = end + 1 > w ? end + 1 - w : 0;
      for (size_t i = begin; i <= end; ++i) {
        if (std::isfinite(post_norm[i].value)) {
          window.push_back(post_norm[i].value);
        }
      }
      if (window.empty()) continue;
      std::sort(window.begin(), window.end());
      // The server's definition (trainwatch_grad_norm_window): the same
      // records give the same p50.
      auto q = [&](double f) { return window[v1::NearestRank(f, window.size())]; };
      for (auto [line, f] : {std::pair{&p50, 0.5}, std::pair{&p90, 0.9},
                             std::pair{&p99, 0.99}}) {
        line->x.push_back(post_norm[end].step);
        line->y.push_back(q(f));
      }
    }
    nc.lines = {p50, p90, p99};
  }
  if (run.max_norm() > 0) {
    nc.hlines.push_back({absl::StrCat("max_norm ", Num(run.max_norm())),
                         run.max_norm()});
  }
  if (in.health.has_recommended_max_norm() &&
      in.health.recommended_max_norm() > 0) {
    nc.hlines.push_back(
        {absl::StrCat("recommended ", Num(in.health.recommended_max_norm())),
         in.health.recommended_max_norm()});
  }
  nc.marks_name = "non-finite norm";
  nc.marks = ds.Marks(nonfinite);
  charts.push_back(std::move(nc));

  // Clip fraction over the last W post-warmup records.
  Chart cf{.id = "clip_fraction", .title = "Clip fraction over the window"};
  {
    Line frac{"clipped share of the last W steps"};
    std::vector<uint64_t> prefix(post_clipped.size() + 1, 0);
    for (size_t i = 0; i < post_clipped.size(); ++i) {
      prefix[i + 1] = prefix[i] + post_clipped[i];
    }
    for (size_t end : ds.ColumnEnds(post_norm)) {
      const size_t begin = end + 1 > w ? end + 1 - w : 0;
      frac.x.push_back(post_norm[end].step);
      frac.y.push_back(static_cast<double>(prefix[end + 1] - prefix[begin]) /
                       (end + 1 - begin));
    }
    cf.points = post_norm.size();
    if (run.max_norm() <= 0) {
      cf.note = "no clip threshold (max_norm) was given for this run";
    }
    cf.lines.push_back(std::move(frac));
    // The server's configured threshold (5% unless configured otherwise).
    const double limit = in.health.window().clip_fraction_threshold() > 0
                             ? in.health.window().clip_fraction_threshold()
                             : 0.05;
    cf.hlines.push_back(
        {absl::StrCat(Num(100 * limit), "% (ClipFractionHigh)"), limit});
  }
  charts.push_back(std::move(cf));

  Chart sc = FieldChart("loss_scale", "Loss scale (fp16)", true, scale, ds);
  sc.marks_name = "skipped step";
  sc.marks = ds.Marks(skipped);
  if (sc.points == 0 && !skipped.empty()) {
    sc.note = "no loss scale recorded; skipped steps marked";
  }
  charts.push_back(std::move(sc));
  charts.push_back(FieldChart("max_attn_logit", "Max attention logit", false,
                              attn, ds));
  charts.push_back(FieldChart("log_z", "log Z of the output softmax", false,
                              logz, ds));
  charts.push_back(FieldChart("loss", "Loss", false, loss, ds));
  charts.push_back(FieldChart("lr", "Learning rate", false, lr, ds));
  // FP8 runs only: a run without fp8 stats gets no empty FP8 charts.
  if (std::any_of(records.begin(), records.end(),
                  [](const v1::StepRecord& r) { return !r.fp8().empty(); })) {
    for (Chart& c : Fp8Charts(records, ds)) charts.push_back(std::move(c));
  }

  for (Chart& c : charts) c.alerts = AlertsOn(c.id, in.alerts, moe_heatmap);
  return charts;
}

std::vector<v1::StepRecord> SortedRecords(const ReportInput& in) {
  std::vector<v1::StepRecord> records = in.records;
  std::stable_sort(records.begin(), records.end(),
                   [](const v1::StepRecord& a, const v1::StepRecord& b) {
                     return a.step() < b.step();
                   });
  // The caller already kept the latest attempt per step; drop exact repeats.
  records.erase(std::unique(records.begin(), records.end(),
                            [](const v1::StepRecord& a,
                               const v1::StepRecord& b) {
                              return a.step() == b.step();
                            }),
                records.end());
  return records;
}

// Where to resume and what to skip, for the spikes table.
std::string PlanText(const v1::Spike& s) {
  const std::string skip =
      s.batch_ids().empty()
          ? "no batch ids were recorded to skip"
          : absl::StrCat("skip batches ", absl::StrJoin(s.batch_ids(), ","));
  if (!s.has_restart_from_step()) {
    return absl::StrCat("no checkpoint at least 100 steps before it: restart "
                        "from the nearest earlier one and ",
                        skip);
  }
  return absl::StrCat(
      "resume from ",
      s.restart_checkpoint().empty()
          ? "the checkpoint"
          : absl::StrCat("checkpoint ", s.restart_checkpoint()),
      " (step ", s.restart_from_step(), ") and ", skip);
}

std::string SpikesHtml(const v1::GetRunHealthResponse& h) {
  if (h.spikes().empty()) {
    return "<p>No gradient-norm spike was detected.</p>\n";
  }
  std::string out =
      "<table class=\"spikes\"><thead><tr><th>Step</th><th>Grad norm</th>"
      "<th>x EMA</th><th>Batch ids</th><th>Restart plan</th><th>Replay</th>"
      "</tr></thead><tbody>\n";
  for (const v1::Spike& s : h.spikes()) {
    absl::StrAppend(
        &out, "<tr class=\"spike\" data-step=\"", s.step(), "\"><td>", s.step(),
        "</td><td>", HtmlEscape(Num(s.grad_norm())), "</td><td>",
        HtmlEscape(absl::StrFormat("%.1f", s.ratio_to_ema())), "</td><td>",
        HtmlEscape(s.batch_ids().empty() ? "-"
                                         : absl::StrJoin(s.batch_ids(), ", ")),
        "</td><td>", HtmlEscape(PlanText(s)), "</td><td>",
        HtmlEscape(s.outcome().empty() ? "-" : s.outcome()), "</td></tr>\n");
  }
  return out + "</tbody></table>\n";
}

std::string AlertsHtml(const std::vector<v1::Alert>& alerts) {
  if (alerts.empty()) return "<p>No alert fired.</p>\n";
  std::string out =
      "<table class=\"alerts\"><thead><tr><th>Alert</th><th>Severity</th>"
      "<th>State</th><th>Steps</th><th>What happened</th><th>Likely cause</th>"
      "<th>Fix</th></tr></thead><tbody>\n";
  for (const v1::Alert& a : alerts) {
    const std::string steps =
        a.state() == v1::ALERT_STATE_RESOLVED
            ? absl::StrCat(a.started_step(), "-", a.resolved_step())
            : absl::StrCat(a.started_step(), "-");
    absl::StrAppend(&out, "<tr class=\"sev-", HtmlEscape(v1::SeverityName(a.severity())),
                    "\"><td>", HtmlEscape(a.alertname()), "</td><td>",
                    HtmlEscape(v1::SeverityName(a.severity())), "</td><td>",
                    HtmlEscape(v1::StateName(a.state())), "</td><td>", steps, "</td><td>",
                    HtmlEscape(a.description().empty() ? a.summary()
                                                       : a.description()),
                    "</td><td>", HtmlEscape(a.likely_cause()), "</td><td>",
                    HtmlEscape(a.fix()), "</td></tr>\n");
  }
  return out + "</tbody></table>\n";
}

}  // namespace

std::string HtmlEscape(absl::string_view text) {
  return absl::StrReplaceAll(text, {{"&", "&amp;"},
                                    {"<", "&lt;"},
                                    {">", "&gt;"},
                                    {"\"", "&quot;"},
                                    {"'", "&#39;"}});
}

std::vector<std::string> ReportVerdict(const ReportInput& in) {
  const v1::RunSummary& run = in.health.run();
  std::vector<std::string> lines;
  std::vector<const v1::Alert*> paging, info;
  for (const v1::Alert& a : in.alerts) {
    (SeverityRank(a) < 2 ? paging : info).push_back(&a);
  }
  // Firing before resolved, critical before warning, earliest first.
  std::stable_sort(paging.begin(), paging.end(),
                   [](const v1::Alert* a, const v1::Alert* b) {
                     const bool fa = a->state() != v1::ALERT_STATE_RESOLVED;
                     const bool fb = b->state() != v1::ALERT_STATE_RESOLVED;
                     if (fa != fb) return fa;
                     if (SeverityRank(*a) != SeverityRank(*b)) {
                       return SeverityRank(*a) < SeverityRank(*b);
                     }
                     return a->started_step() < b->started_step();
                   });
  if (paging.empty()) {
    lines.push_back(absl::StrCat(
        "No problem found: no warning or critical alert over ", run.steps(),
        " stored steps (last step ", run.last_step(), ")."));
  }
  // One line per distinct alert name, at most four: the page is for a person.
  std::vector<std::string> named;
  for (const v1::Alert* a : paging) {
    if (std::find(named.begin(), named.end(), a->alertname()) != named.end()) {
      continue;
    }
    named.push_back(a->alertname());
    if (named.size() > 4) break;
    const std::string state =
        a->state() == v1::ALERT_STATE_RESOLVED
            ? absl::StrCat("resolved at step ", a->resolved_step())
            : "still firing";
    lines.push_back(absl::StrCat(
        a->summary().empty() ? a->alertname() : a->summary(), " (",
        a->alertname(), ", ", v1::SeverityName(a->severity()), "): ", AlertSpan(*a), ", ", state,
        ". ", Sentence("", a->description()),
        Sentence("Likely cause: ", a->likely_cause()),
        Sentence("What to do: ", a->fix())));
  }
  if (!info.empty()) {
    std::map<std::string, int> counts;
    for (const v1::Alert* a : info) ++counts[a->alertname()];
    std::vector<std::string> parts;
    for (const auto& [name, n] : counts) parts.push_back(absl::StrCat(n, "x ", name));
    lines.push_back(absl::StrCat("Recorded, not paged (info): ",
                                 absl::StrJoin(parts, ", "), "."));
  }
  if (in.health.has_recommended_max_norm()) {
    lines.push_back(absl::StrCat(
        "Recommended max_norm: ", Num(in.health.recommended_max_norm()),
        " (98th percentile of the window's post-warmup norms); the run clips "
        "at ",
        run.max_norm() > 0 ? Num(run.max_norm()) : "no threshold", "."));
  }
  const auto& labels = run.labels();
  if (auto it = labels.find("logged_every"); it != labels.end()) {
    lines.push_back(absl::StrCat(
        "This run was logged every ", it->second,
        " steps: the windows hold logged points, so the clip fraction is a "
        "sample of the logged steps, not of every step."));
  }
  if (auto it = labels.find("loss_scaler"); it != labels.end()) {
    lines.push_back(
        "fp16 with a GradScaler inferred: the log did not record the loss "
        "scale, so the fp16 scale checks were not run.");
  }
  if (auto it = labels.find("grad_norm"); it != labels.end()) {
    lines.push_back(
        "The log has no gradient norm: clipping, spikes and drift could not "
        "be judged.");
  }
  return lines;
}

std::string RenderReport(const ReportInput& in) {
  const v1::RunSummary& run = in.health.run();
  const std::vector<v1::StepRecord> records = SortedRecords(in);
  const uint64_t first = records.empty() ? 0 : records.front().step();
  const uint64_t last = records.empty() ? 0 : records.back().step();
  const std::optional<MoeHeatmap> moe = BuildMoeHeatmap(records, first, last);
  const std::vector<Chart> charts = BuildCharts(in, records, moe.has_value());

  std::string data;
  {
    JsonWriter w(&data);
    w.BeginObject();
    w.Key("run");
    w.String(run.run_id());
    w.Key("first_step");
    w.Uint(first);
    w.Key("last_step");
    w.Uint(last);
    w.Key("warmup_steps");
    w.Uint(run.warmup_steps());
    w.Key("charts");
    w.BeginArray();
    for (const Chart& c : charts) WriteChart(w, c);
    w.EndArray();
    if (moe.has_value()) {
      w.Key("moe");
      WriteMoeHeatmap(w, *moe, AlertsOn(kMoeHeatmapId, in.alerts, true));
    }
    w.Key("alerts");
    w.BeginArray();
    for (const v1::Alert& a : in.alerts) {
      w.BeginObject();
      w.Key("name");
      w.String(a.alertname());
      w.Key("severity");
      w.String(v1::SeverityName(a.severity()));
      w.Key("state");
      w.String(v1::StateName(a.state()));
      w.Key("from");
      w.Uint(a.onset_step() != 0 && a.onset_step() < a.started_step()
                 ? a.onset_step()
                 : a.started_step());
      w.Key("to");
      w.Uint(a.state() == v1::ALERT_STATE_RESOLVED ? a.resolved_step()
                                     : std::max(last, a.started_step()));
      w.Key("summary");
      w.String(a.summary());
      w.EndObject();
    }
    w.EndArray();
    w.EndObject();
  }
  // Inside <script>, "</" would end the element: '<' only occurs inside JSON
  // strings, where \u003c means the same.
  data = absl::StrReplaceAll(data, {{"<", "\\u003c"}});

  std::string verdict;
  for (const std::string& line : ReportVerdict(in)) {
    absl::StrAppend(&verdict, "<li>", HtmlEscape(line), "</li>\n");
  }
  const bool bad = std::any_of(
      in.alerts.begin(), in.alerts.end(), [](const v1::Alert& a) {
        return v1::Pages(a.severity());
      });

  std::string out;
  absl::StrAppend(
      &out,
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<title>trainwatch report: ",
      HtmlEscape(run.run_id()), "</title>\n<style>\n", kReportCSS,
      "</style>\n</head>\n<body>\n<header><h1>Run ",
      HtmlEscape(run.run_id()), "</h1>\n<p class=\"meta\">",
      HtmlEscape(absl::StrFormat(
          "%d steps stored, last step %d, attempt %d, world size %d, %s, "
          "max_norm %s, warmup %d steps",
          run.steps(), run.last_step(), run.attempt(), run.world_size(),
          PrecisionName(run.precision()), Num(run.max_norm()),
          run.warmup_steps())),
      "</p></header>\n<section id=\"verdict\" class=\"verdict ",
      bad ? "bad" : "good", "\">\n<h2>Verdict</h2>\n<ul>\n", verdict,
      "</ul>\n</section>\n<section id=\"charts\">\n<h2>Over the run</h2>\n"
      "<p class=\"legend\">Shaded spans are alerts (red critical, orange "
      "warning, blue info), from the detector's onset to the resolve. Each "
      "chart draws the min and max of every pixel column, so a one-step "
      "spike stays visible at any run length.</p>\n");
  for (const Chart& c : charts) {
    absl::StrAppend(&out, "<div class=\"chart\" id=\"chart-", c.id,
                    "\" data-chart=\"", c.id, "\"><h3>", HtmlEscape(c.title),
                    "</h3></div>\n");
  }
  absl::StrAppend(&out, "</section>\n");
  if (moe.has_value()) {
    absl::StrAppend(
        &out,
        "<section id=\"moe\">\n<h2>MoE routing: load per expert</h2>\n"
        "<p class=\"legend\">One panel per MoE layer, one row per expert, "
        "columns over steps: each cell is the expert's share of its layer's "
        "routed assignments over the column's steps, against an even share "
        "(1/E). An even layer is pale; hot experts are yellow to red, cold "
        "ones blue, and an expert with no assignment at all is black. A "
        "collapse shows as a few hot rows over black ones. Layers with more "
        "than ",
        kMoeExpertRows,
        " experts show the ones furthest from an even share. The MoE alerts "
        "are the bars above the heatmap, from the detector's onset to the "
        "resolve, with lines down through the panels.</p>\n"
        "<div class=\"heatmap\" id=\"moe-heatmap\" data-chart-id=\"",
        kMoeHeatmapId, "\"></div>\n</section>\n");
  }
  absl::StrAppend(&out, "<section id=\"alerts\">\n<h2>Alerts</h2>\n",
                  AlertsHtml(in.alerts),
                  "</section>\n<section id=\"spikes\">\n<h2>Spikes and restart "
                  "plans</h2>\n",
                  SpikesHtml(in.health), "</section>\n");
  for (const ReportSection& s : in.extra_sections) {
    absl::StrAppend(&out, "<section id=\"", HtmlEscape(s.id), "\">\n<h2>",
                    HtmlEscape(s.title), "</h2>\n", s.html, "</section>\n");
  }
  absl::StrAppend(
      &out, "<footer>Written by trainwatchctl report. Self-contained: no "
      "network access is needed to view it.</footer>\n"
      "<script type=\"application/json\" id=\"tw-data\">",
      data, "</script>\n<script>\n", kReportJS, "</script>\n</body>\n</html>\n");
  return out;
}

}  // namespace trainwatch::cli
