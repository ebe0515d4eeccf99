// RunFamily (per-run series owned by trainwatch, O(1) removal) against
// prometheus-cpp's Family, and Metrics' exposition with many runs.
#include "metrics/metrics.h"

#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "metrics/run_family.h"

namespace trainwatch {
namespace {

std::vector<std::string> SortedLines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::sort(lines.begin(), lines.end());
  return lines;
}

std::string Serialize(const std::vector<prometheus::MetricFamily>& f) {
  return prometheus::TextSerializer().Serialize(f);
}

const std::vector<std::pair<std::string, std::string>> kAlerts = {
    {"GradNormSpike", "warning"}, {"LossNaN", "critical"}};

TEST(RunFamily, CollectsWhatAPrometheusFamilyWould) {
  prometheus::Registry registry;
  auto& reference = prometheus::BuildGauge()
                        .Name("trainwatch_grad_norm_window")
                        .Help("Percentile \"of\" norms.\nSecond line.")
                        .Register(registry);
  RunFamily<RunGauge> ours("trainwatch_grad_norm_window",
                           "Percentile \"of\" norms.\nSecond line.");
  for (int run = 0; run < 20; ++run) {
    for (const char* p : {"50", "99"}) {
      prometheus::Labels labels{{"run", absl::StrCat("r\\", run, "\"")},
                                {"percentile", p}};
      double v = run * 0.25 + (p[0] == '5' ? 1 : 2);
      reference.Add(labels).Set(v);
      ours.Add(labels)->metric.Set(v);
    }
  }
  std::vector<prometheus::MetricFamily> collected;
  ours.Collect(&collected);
  ASSERT_EQ(collected.size(), 1u);
  EXPECT_EQ(collected[0].metric.size(), 40u);
  // Same lines; only the order of series within the family may differ
  // (prometheus-cpp keeps them in a hash map too).
  EXPECT_EQ(SortedLines(Serialize(collected)),
            SortedLines(Serialize(registry.Collect())));
}

TEST(RunFamily, EmptyFamilyIsNotCollected) {
  prometheus::Registry registry;
  prometheus::BuildGauge().Name("g").Help("h").Register(registry);
  RunFamily<RunGauge> ours("g", "h");
  std::vector<prometheus::MetricFamily> collected;
  ours.Collect(&collected);
  EXPECT_EQ(collected.size(), registry.Collect().size());
  ours.Remove(ours.Add({{"run", "a"}}));
  ours.Collect(&collected);
  EXPECT_TRUE(collected.empty());
}

TEST(RunFamily, SameLabelsShareASeriesUntilEveryAddIsRemoved) {
  RunFamily<RunCounter> f("c_total", "h");
  RunSeries<RunCounter>* a = f.Add({{"run", "x"}});
  RunSeries<RunCounter>* b = f.Add({{"run", "x"}});
  ASSERT_EQ(a, b);
  a->metric.Increment(3);
  f.Add({{"run", "y"}});
  EXPECT_EQ(f.size(), 2u);
  f.Remove(a);
  EXPECT_EQ(f.size(), 2u);
  EXPECT_EQ(b->metric.Value(), 3);  // still alive: one Add left
  f.Remove(b);
  EXPECT_EQ(f.size(), 1u);
}

// 10,000 runs, each with its eager series and some lazy ones, then all
// removed (prometheus-cpp's Family::Remove made this take minutes).
TEST(Metrics, TenThousandRunsComeAndGo) {
  auto metrics = Metrics::Create("");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  std::vector<std::unique_ptr<RunMetrics>> runs;
  for (int i = 0; i < 10000; ++i) {
    runs.push_back((*metrics)->AddRun(absl::StrCat("run-", i), kAlerts));
    RunMetrics& r = *runs.back();
    r.steps.Increment(i);
    r.grad_norm.Set(0.5);
    r.grad_norm_p99.Set(0.9);
    if (i % 100 == 0) {
      r.alert_active[0].Set(1);
      r.alerts_fired[0].Get().Increment();
    }
  }
  EXPECT_EQ((*metrics)->steps_total.size(), 10000u);
  EXPECT_EQ((*metrics)->alert_active.size(), 100u);
  std::string text = (*metrics)->Serialize();
  EXPECT_NE(text.find("\ntrainwatch_steps_total{run=\"run-9999\"} 9999\n"),
            std::string::npos);
  EXPECT_NE(text.find("\ntrainwatch_alert_active{alertname=\"GradNormSpike\","
                      "run=\"run-9900\",severity=\"warning\"} 1\n"),
            std::string::npos);
  // Keep one run; forget the rest.
  runs.erase(runs.begin() + 1, runs.end());
  text = (*metrics)->Serialize();
  EXPECT_EQ(text.find("run-1"), std::string::npos);
  EXPECT_NE(text.find("\ntrainwatch_grad_norm{run=\"run-0\"} 0.5\n"),
            std::string::npos);
  EXPECT_EQ((*metrics)->grad_norm_window.size(), 1u);
  runs.clear();
  EXPECT_EQ((*metrics)->Serialize().find("run="), std::string::npos);
}

// The exposition keeps prometheus::Registry's order (counters, gauges,
// histograms; registration order within each) and passes promtool.
TEST(Metrics, ExpositionOrderAndPromtool) {
  auto metrics = Metrics::Create("");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  std::unique_ptr<RunMetrics> run = (*metrics)->AddRun("r1", kAlerts);
  run->steps.Increment();
  run->last_step.Set(7);
  run->alerts_fired[1].Get().Increment();
  run->alert_active[1].Set(1);
  (*metrics)->ingest_records.Increment(5);
  (*metrics)->store_commit_seconds.Observe(0.001);
  std::string text = (*metrics)->Serialize();
  std::vector<std::string> order;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# TYPE ", 0) == 0) order.push_back(line.substr(7));
  }
  auto pos = [&](const std::string& family) {
    for (size_t i = 0; i < order.size(); ++i) {
      if (order[i].rfind(family + " ", 0) == 0) return static_cast<int>(i);
    }
    ADD_FAILURE() << family << " missing from\n" << text;
    return -1;
  };
  EXPECT_LT(pos("trainwatch_ingest_records_total"),
            pos("trainwatch_steps_total"));
  EXPECT_LT(pos("trainwatch_steps_total"),
            pos("trainwatch_alerts_fired_total"));
  EXPECT_LT(pos("trainwatch_alerts_fired_total"),
            pos("trainwatch_streams_active"));
  EXPECT_LT(pos("trainwatch_store_failing"), pos("trainwatch_last_step"));
  EXPECT_LT(pos("trainwatch_last_step"), pos("trainwatch_alert_active"));
  EXPECT_LT(pos("trainwatch_alert_active"),
            pos("trainwatch_store_commit_seconds"));

  char path[] = "/tmp/metrics_test_XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  FILE* f = fdopen(fd, "w");
  fputs(text.c_str(), f);
  fclose(f);
  std::string command =
      absl::StrCat("promtool check metrics < ", path, " 2>&1");
  FILE* p = popen(command.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, p) != nullptr) out += buf;
  int status = pclose(p);
  unlink(path);
  EXPECT_EQ(status, 0) << "promtool check metrics:\n" << out;
}

}  // namespace
}  // namespace trainwatch
